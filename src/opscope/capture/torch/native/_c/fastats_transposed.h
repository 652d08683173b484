/* Tensors stored as transposed planes (included by fastats_kernel.h after run()): a Linear
 * weight's gradient as its autograd node hands it over, `x.mT` of a contiguous x. Element
 * (r, c) of plane p lies at p·R·C + c·R + r, so each logical column is R adjacent elements.
 *
 * Reading such a tensor in row-major order (a gather into a buffer, then the kernel) walks
 * memory a column apart at each element; the planes are read here in memory order instead,
 * once, at the kernel's speed. The statistics are those of the elements in that order (their
 * float sums may differ from the contiguous copy's in the last bits; min, max and the counts
 * cannot); the hash is the row-major one (docs/format.md), bit for bit: a sum of per-word
 * terms whose salt is the word's row-major index, so each column adds its words with the
 * salts of their row-major places. 2-byte elements pair two adjacent columns into the words
 * of row-major order (C even); 1-byte ones are not read this way. */

/* The terms of one column's words, portable: rows r of a column whose row 0 holds word w0 of
 * the row-major order, wc words a row apart (es 4: one word a row; es 8: two, w0 + r·wc + j;
 * es 2: the row's element of this column and of the next, `col2`, as one word). */
static void tcol_hash(const unsigned char *col, const unsigned char *col2, int es, Py_ssize_t r0, Py_ssize_t R,
                      uint32_t w0, uint32_t wc, uint32_t *h1, uint32_t *h2) {
    uint32_t a = 0, b = 0;
    for (Py_ssize_t r = r0; r < R; r++) {
        uint32_t i = w0 + (uint32_t)r * wc;
        for (int j = 0; j < (es == 8 ? 2 : 1); j++) {
            uint32_t w;
            if (es == 2) {
                uint16_t lo, hi;
                memcpy(&lo, col + 2 * r, 2);
                memcpy(&hi, col2 + 2 * r, 2);
                w = (uint32_t)lo | (uint32_t)hi << 16;
            } else {
                memcpy(&w, col + (size_t)es * r + 4 * j, 4);
            }
            uint32_t salt = (i + (uint32_t)j) * GOLD, x = hash_mix(w, salt);
            a += x ^ salt;
            b += x;
        }
    }
    *h1 += a; *h2 += b;
}

#if defined(__x86_64__)
/* The same with 8 lanes: lane l takes row r + l (es 8: word l of the next 8, row r + l/2). */
AVX2 static void tcol_hash_avx2(const unsigned char *col, const unsigned char *col2, int es, Py_ssize_t R,
                                uint32_t w0, uint32_t wc, uint32_t *h1, uint32_t *h2) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int rows = es == 8 ? 4 : 8; /* rows a vector */
    __m256i idx = es == 8 ? _mm256_add_epi32(_mm256_mullo_epi32(_mm256_srli_epi32(lane, 1), _mm256_set1_epi32((int)wc)),
                                             _mm256_and_si256(lane, _mm256_set1_epi32(1)))
                          : _mm256_mullo_epi32(lane, _mm256_set1_epi32((int)wc));
    __m256i s = _mm256_mullo_epi32(_mm256_add_epi32(idx, _mm256_set1_epi32((int)w0)), _mm256_set1_epi32((int)GOLD));
    const __m256i inc = _mm256_set1_epi32((int)((uint32_t)rows * wc * GOLD));
    __m256i a = _mm256_setzero_si256(), b = a;
    Py_ssize_t r = 0;
    for (; r + rows <= R; r += rows) {
        __m256i w;
        if (es == 2)
            w = _mm256_or_si256(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(col + 2 * r))),
                                _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(col2 + 2 * r))), 16));
        else
            w = _mm256_loadu_si256((const __m256i *)(col + (size_t)es * r));
        __m256i x = mix8(w, s);
        a = _mm256_add_epi32(a, _mm256_xor_si256(x, s));
        b = _mm256_add_epi32(b, x);
        s = _mm256_add_epi32(s, inc);
    }
    *h1 += (uint32_t)sum_epi32(a);
    *h2 += (uint32_t)sum_epi32(b);
    tcol_hash(col, col2, es, r, R, w0, wc, h1, h2);
}

/* And with 16 lanes, the last rows as masked lanes. */
AVX512 static void tcol_hash_avx512(const unsigned char *col, const unsigned char *col2, int es, Py_ssize_t R,
                                    uint32_t w0, uint32_t wc, uint32_t *h1, uint32_t *h2) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    const int rows = es == 8 ? 8 : 16;
    __m512i idx = es == 8 ? _mm512_add_epi32(_mm512_mullo_epi32(_mm512_srli_epi32(lane, 1), _mm512_set1_epi32((int)wc)),
                                             _mm512_and_si512(lane, _mm512_set1_epi32(1)))
                          : _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)wc));
    __m512i s = _mm512_mullo_epi32(_mm512_add_epi32(idx, _mm512_set1_epi32((int)w0)), _mm512_set1_epi32((int)GOLD));
    const __m512i inc = _mm512_set1_epi32((int)((uint32_t)rows * wc * GOLD));
    __m512i a = _mm512_setzero_si512(), b = a;
    for (Py_ssize_t r = 0; r < R; r += rows) {
        Py_ssize_t left = R - r < rows ? R - r : rows;
        __mmask16 k = (__mmask16)((1u << (left * (es == 8 ? 2 : 1))) - 1); /* the lanes that hold a word */
        __m512i w;
        if (es == 2)
            w = _mm512_or_si512(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, col + 2 * r)),
                                _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, col2 + 2 * r)), 16));
        else
            w = _mm512_maskz_loadu_epi32(k, col + (size_t)es * r);
        __m512i x = mix16(w, s);
        a = _mm512_mask_add_epi32(a, k, a, _mm512_xor_si512(x, s));
        b = _mm512_mask_add_epi32(b, k, b, x);
        s = _mm512_add_epi32(s, inc);
    }
    *h1 += (uint32_t)_mm512_reduce_add_epi32(a);
    *h2 += (uint32_t)_mm512_reduce_add_epi32(b);
}
#endif

static void tcol_any(const unsigned char *col, const unsigned char *col2, int es, Py_ssize_t R, uint32_t w0,
                     uint32_t wc, uint32_t *h1, uint32_t *h2) {
#if defined(__x86_64__)
    int level = simd_level();
    if (level == 2) {
        tcol_hash_avx512(col, col2, es, R, w0, wc, h1, h2);
        return;
    }
    if (level == 1) {
        tcol_hash_avx2(col, col2, es, R, w0, wc, h1, h2);
        return;
    }
#endif
    tcol_hash(col, col2, es, 0, R, w0, wc, h1, h2);
}

/* Statistics and hash of `planes` planes of R x C elements of dtype `code`, each stored
 * transposed and the planes one after another from p: the statistics in memory order
 * (run_stats, without its hash), then the hash of row-major order. 0, with
 * nothing done, for 1-byte elements and for 2-byte ones with C odd (the caller gathers). */
static int run_transposed(const void *p, Py_ssize_t planes, Py_ssize_t R, Py_ssize_t C, int code, acc_t *a) {
    const int es = (int)ITEMSIZE[code];
    if (es == 1 || (es == 2 && C % 2)) return 0;
    run_stats(p, planes * R * C, code, a, 0);
    const unsigned char *bytes = (const unsigned char *)p;
    const uint32_t wc = (uint32_t)((uint64_t)C * (uint64_t)es / 4); /* words a row (mod 2^32, as the salts) */
    uint32_t h1 = 0, h2 = 0;
    for (Py_ssize_t q = 0; q < planes; q++) {
        const uint64_t first = (uint64_t)q * (uint64_t)R * (uint64_t)C; /* the plane's first element */
        const unsigned char *plane = bytes + first * (uint64_t)es;
        for (Py_ssize_t c = 0; c < C; c += es == 2 ? 2 : 1) {
            const unsigned char *col = plane + (size_t)c * (size_t)R * (size_t)es;
            uint32_t w0 = (uint32_t)((first + (uint64_t)c) * (uint64_t)es / 4); /* word of element (0, c) */
            tcol_any(col, col + (size_t)R * (size_t)es, es, R, w0, wc, &h1, &h2);
        }
    }
    a->hash = ((uint64_t)h1 << 32) | h2;
    return 1;
}
