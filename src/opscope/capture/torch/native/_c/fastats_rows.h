/* The float loops of fastats_avx512.h and fastats_fused.h (AVX2) over a tensor stored as rows:
 * its elements in row-major order are rows of `inner` adjacent elements, each row anywhere in
 * memory (`rows` holds their addresses in row-major order). Attention's heads-permuted tensors are such: a
 * (batch, heads, tokens, dim) view of (batch, tokens, heads, dim) memory, as a projection's
 * view(...).transpose(1, 2) and SDPA's CPU kernel make them. Without this, such a tensor was
 * copied row by row into a buffer the size of the tensor and read again from there.
 *
 * Bit for bit the loops over the tensor's row-major copy: `inner` is a multiple of the loop's
 * step (16 floats, 32 halves) and divides BLOCK, so each block of the kernel is whole rows and
 * each vector lies in one row; the vectors are taken in row-major order, with the same lanes,
 * blocks and hash salts. Each vector is also stored into `buf` (one block, in L1), which the
 * block's end reads where it needs the elements again (NaN/Inf counts, a block's second pass for
 * its spread, a float32 overflow). Included by fastats_avx2.h after fastats_avx512.h. */

/* Whether run_rows takes a tensor of dtype `code` in rows of `inner` elements. */
__attribute__((unused)) static int rows_fit(int code, Py_ssize_t inner) {
    Py_ssize_t step = code == F32 ? 16 : (code == F16 || code == BF16) ? 32 : 0;
    return step && simd_level() >= 1 && inner >= step && inner % step == 0 && BLOCK % inner == 0;
}

/* Rows are read in an order the hardware's prefetchers do not follow (each a few lines, one
 * after another at a stride of the heads): the row ROWS_AHEAD rows on is asked for. */
#define ROWS_AHEAD 8
static inline void rows_fetch(const void *const *rows, Py_ssize_t k, Py_ssize_t count, Py_ssize_t bytes) {
    if (k >= count) return;
    const char *p = (const char *)rows[k];
    for (Py_ssize_t o = 0; o < bytes; o += 64) _mm_prefetch(p + o, _MM_HINT_T0);
}

AVX512 static void f32_rows16(const void *const *rows, Py_ssize_t inner, Py_ssize_t n, acc_t *a, uint32_t *h1,
                              uint32_t *h2, void *buf) {
    const __m512 zero = _mm512_setzero_ps();
    const __m512i one = _mm512_set1_epi32(1);
    float *block = (float *)buf;
    hasher16_t h;
    hasher16_init(&h);
    for (Py_ssize_t b0 = 0; b0 < n; b0 += BLOCK) {
        Py_ssize_t m = n - b0 < BLOCK ? n - b0 : BLOCK;
        fl16_t f;
        fl16_init(&f);
        __m512i nz = _mm512_setzero_si512();
        for (Py_ssize_t r = 0; r * inner < m; r++) {
            const float *row = (const float *)rows[b0 / inner + r];
            rows_fetch(rows, b0 / inner + r + ROWS_AHEAD, n / inner, inner * 4);
            for (Py_ssize_t j = 0; j < inner; j += 16) {
                __m512 v = _mm512_loadu_ps(row + j);
                _mm512_storeu_ps(block + r * inner + j, v);
                nz = _mm512_mask_add_epi32(nz, _mm512_cmp_ps_mask(v, zero, _CMP_EQ_OQ), nz, one);
                fl16_add(&f, v);
                hasher16_add(&h, _mm512_castps_si512(v));
            }
        }
        block_end16(&f, (uint32_t)_mm512_reduce_add_epi32(nz), block, m, m, F32, a);
    }
    hasher16_done(&h, block, (size_t)n * 4, h1, h2); /* (every word added: nothing read) */
}

AVX512 static void half_rows16(const void *const *rows, Py_ssize_t inner, Py_ssize_t n, int code, acc_t *a,
                               uint32_t *h1, uint32_t *h2, void *buf) {
    const __m512i magnitude = _mm512_set1_epi16(0x7fff), one = _mm512_set1_epi16(1);
    uint16_t *block = (uint16_t *)buf;
    hasher16_t h;
    hasher16_init(&h);
    for (Py_ssize_t b0 = 0; b0 < n; b0 += BLOCK) {
        Py_ssize_t m = n - b0 < BLOCK ? n - b0 : BLOCK;
        fl16_t f;
        fl16_init(&f);
        __m512i nz = _mm512_setzero_si512();
        for (Py_ssize_t r = 0; r * inner < m; r++) {
            const uint16_t *row = (const uint16_t *)rows[b0 / inner + r];
            rows_fetch(rows, b0 / inner + r + ROWS_AHEAD, n / inner, inner * 2);
            for (Py_ssize_t j = 0; j < inner; j += 32) {
                __m512i w = _mm512_loadu_si512(row + j);
                _mm512_storeu_si512(block + r * inner + j, w);
                nz = _mm512_mask_add_epi16(nz, _mm512_testn_epi16_mask(w, magnitude), nz, one);
                fl16_add(&f, half_row(w, row + j, 0, code));
                fl16_add(&f, half_row(w, row + j, 1, code));
                hasher16_add(&h, w);
            }
        }
        uint64_t zeros = (uint32_t)_mm512_reduce_add_epi32(_mm512_madd_epi16(nz, one));
        block_end16(&f, zeros, block, m, m, code, a);
    }
    hasher16_done(&h, block, (size_t)n * 2, h1, h2);
}

AVX2 static void f32_rows8(const void *const *rows, Py_ssize_t inner, Py_ssize_t n, acc_t *a, uint32_t *h1,
                           uint32_t *h2, void *buf) {
    const __m256 zero = _mm256_setzero_ps();
    float *block = (float *)buf;
    hasher_t h;
    hasher_init(&h, 0);
    for (Py_ssize_t b0 = 0; b0 < n; b0 += BLOCK) {
        Py_ssize_t m = n - b0 < BLOCK ? n - b0 : BLOCK;
        fl8_t lo, hi;
        fl8_init(&lo);
        fl8_init(&hi);
        __m256i nz = _mm256_setzero_si256();
        for (Py_ssize_t r = 0; r * inner < m; r++) {
            const float *row = (const float *)rows[b0 / inner + r];
            rows_fetch(rows, b0 / inner + r + ROWS_AHEAD, n / inner, inner * 4);
            for (Py_ssize_t j = 0; j < inner; j += 16) {
                __m256 v0 = _mm256_loadu_ps(row + j), v1 = _mm256_loadu_ps(row + j + 8);
                _mm256_storeu_ps(block + r * inner + j, v0);
                _mm256_storeu_ps(block + r * inner + j + 8, v1);
                nz = _mm256_sub_epi32(nz, _mm256_castps_si256(_mm256_cmp_ps(v0, zero, _CMP_EQ_OQ)));
                nz = _mm256_sub_epi32(nz, _mm256_castps_si256(_mm256_cmp_ps(v1, zero, _CMP_EQ_OQ)));
                fl8_add(&lo, v0);
                fl8_add(&hi, v1);
                hasher_add16(&h, _mm256_castps_si256(v0), _mm256_castps_si256(v1));
            }
        }
        block_end(&lo, &hi, 8, 1, sum_epi32(nz), block, m, m, F32, a);
    }
    hasher_done(&h, block, (size_t)n * 4, 0, h1, h2);
}

AVX2 static void half_rows8(const void *const *rows, Py_ssize_t inner, Py_ssize_t n, int code, acc_t *a,
                            uint32_t *h1, uint32_t *h2, void *buf) {
    uint16_t *block = (uint16_t *)buf;
    hasher_t h;
    hasher_init(&h, 0);
    for (Py_ssize_t b0 = 0; b0 < n; b0 += BLOCK) {
        Py_ssize_t m = n - b0 < BLOCK ? n - b0 : BLOCK;
        fl8_t f0, f1;
        fl8_init(&f0);
        fl8_init(&f1);
        __m256i nz = _mm256_setzero_si256();
        for (Py_ssize_t r = 0; r * inner < m; r++) {
            const uint16_t *row = (const uint16_t *)rows[b0 / inner + r];
            rows_fetch(rows, b0 / inner + r + ROWS_AHEAD, n / inner, inner * 2);
            for (Py_ssize_t j = 0; j < inner; j += 32) {
                __m256i w0 = _mm256_loadu_si256((const __m256i *)(row + j));
                __m256i w1 = _mm256_loadu_si256((const __m256i *)(row + j + 16));
                _mm256_storeu_si256((__m256i *)(block + r * inner + j), w0);
                _mm256_storeu_si256((__m256i *)(block + r * inner + j + 16), w1);
                half16_add(&f0, &f1, &nz, row + j, w0, code);
                half16_add(&f0, &f1, &nz, row + j + 16, w1, code);
                hasher_add16(&h, w0, w1);
            }
        }
        uint64_t zeros = sum_epi32(_mm256_madd_epi16(nz, _mm256_set1_epi16(1)));
        if (code == F16) block_end(&f0, &f1, 8, 1, zeros, block, m, m, code, a);
        else block_end(&f0, &f1, 1, 2, zeros, block, m, m, code, a);
    }
    hasher_done(&h, block, (size_t)n * 2, 0, h1, h2);
}

/* The statistics and hash of the n elements of dtype `code` in rows of `inner` (rows_fit) into
 * `a`, as run() gives them for the row-major copy; `buf` holds BLOCK elements. */
__attribute__((unused)) static void run_rows(const void *const *rows, Py_ssize_t inner, Py_ssize_t n, int code,
                                             acc_t *a, void *buf) {
    uint32_t h1 = 0, h2 = 0;
    if (simd_level() >= 2) {
        if (code == F32) f32_rows16(rows, inner, n, a, &h1, &h2, buf);
        else half_rows16(rows, inner, n, code, a, &h1, &h2, buf);
    } else if (code == F32) {
        f32_rows8(rows, inner, n, a, &h1, &h2, buf);
    } else {
        half_rows8(rows, inner, n, code, a, &h1, &h2, buf);
    }
    a->hash = ((uint64_t)h1 << 32) | h2;
}
