/* AVX-512 versions of the fused kernels (fastats_fused.h), chosen at run time on x86 CPUs with
 * AVX-512 F, BW, DQ and VL. Bit for bit the portable loops of fastats_kernel.h, as the AVX2
 * ones are: a block's 16 float lanes are one zmm register (register lane l is the portable
 * loop's lane l, taking elements i + l in the same order), float64's 8 double lanes another;
 * min/max as MINPS/MAXPS do it (`v < m ? v : m`); v*v rounded before it is added (AVX512F has
 * FMA, so the product is kept out of the compiler's reach, see keep_ps); the hash is a sum mod
 * 2^32, in any order. The kernels are bound by the vector ops they issue, and 16 lanes issue
 * half of them where the CPU runs 512-bit ops at full width (Zen 5): float32 takes 7 ops of
 * statistics and 13 of hash per 64 bytes instead of 14 and 26. Included by fastats_avx2.h. */

#define AVX512_TARGET "avx512f,avx512bw,avx512dq,avx512vl,avx2,f16c"
#define AVX512 __attribute__((target(AVX512_TARGET)))
#define AVX512_INLINE __attribute__((target(AVX512_TARGET), always_inline)) static inline

/* Prefetching as in fastats_fused.h, but farther ahead, as these loops read twice as fast:
 * 8 KB ahead read 64 MB of float32 or float64 ~10% faster than 4 KB, 15-30% faster than the
 * AVX2 loops' 2 KB (16 KB: no better). And from 64 KB, not 512: in a step, where an op has just
 * written the tensor, float32 of 64-512 KB read 12-20% faster with it (an Intel Xeon with 2 MB
 * of L2, the transformer's aten dump timed per tensor), where in L2 alone it costs 0-3%. */
#define PREFETCH16 8192
#define PREFETCH16_MIN ((size_t)64 << 10)
#define LOOP_MODE16(nbytes, h1) (((nbytes) >= PREFETCH16_MIN) | ((h1) ? 0 : NOHASH))
#define FETCH16(p, on) do { if (on) _mm_prefetch((const char *)(p) + PREFETCH16, _MM_HINT_T0); } while (0)

/* A product the compiler may not fuse into the add that takes it (see square_f). */
AVX512_INLINE __m512 keep_ps(__m512 p) {
    __asm__("" : "+v"(p));
    return p;
}

AVX512_INLINE __m512d keep_pd(__m512d p) {
    __asm__("" : "+v"(p));
    return p;
}

/* Sixteen lanes of hash_mix (fastats_kernel.h). */
AVX512_INLINE __m512i mix16(__m512i w, __m512i salt) {
    __m512i x = _mm512_xor_si512(w, salt);
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32((int)MIX1));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32((int)MIX2));
    return _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
}

/* hash_bytes ("wsum64-v2") on 16 words at a time, from word 0; i * GOLD carried by addition. */
typedef struct {
    __m512i s, a, b; /* the salts of the next 16 words; the two sums */
    size_t words;    /* words added so far */
} hasher16_t;

AVX512_INLINE void hasher16_init(hasher16_t *h) {
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    h->s = _mm512_mullo_epi32(lane, _mm512_set1_epi32((int)GOLD));
    h->a = h->b = _mm512_setzero_si512();
    h->words = 0;
}

/* The next 16 words. */
AVX512_INLINE void hasher16_add(hasher16_t *h, __m512i w) {
    __m512i x = mix16(w, h->s);
    h->a = _mm512_add_epi32(h->a, _mm512_xor_si512(x, h->s));
    h->b = _mm512_add_epi32(h->b, x);
    h->s = _mm512_add_epi32(h->s, _mm512_set1_epi32((int)(16u * GOLD)));
    h->words += 16;
}

/* The rest of the `nbytes` bytes at p after the words added, 64 at a time, then the last 1-16
 * words as masked lanes (a partial last word zero-padded, as hash_bytes pads it); then the
 * lanes' sums into (h1, h2). */
AVX512_INLINE void hasher16_done(hasher16_t *h, const void *p, size_t nbytes, uint32_t *h1, uint32_t *h2) {
    const unsigned char *bytes = (const unsigned char *)p;
    while (nbytes - 4 * h->words >= 64) hasher16_add(h, _mm512_loadu_si512(bytes + 4 * h->words));
    size_t rest = nbytes - 4 * h->words;
    if (rest) {
        __m512i w = _mm512_maskz_loadu_epi8(((__mmask64)1 << rest) - 1, bytes + 4 * h->words);
        __mmask16 k = (__mmask16)((1u << ((rest + 3) / 4)) - 1); /* the lanes that hold a word */
        __m512i x = mix16(w, h->s);
        h->a = _mm512_mask_add_epi32(h->a, k, h->a, _mm512_xor_si512(x, h->s));
        h->b = _mm512_mask_add_epi32(h->b, k, h->b, x);
    }
    *h1 += (uint32_t)_mm512_reduce_add_epi32(h->a);
    *h2 += (uint32_t)_mm512_reduce_add_epi32(h->b);
}

/* The hash alone (the dtypes whose statistics are the portable loops). */
AVX512 static void hash_avx512(const void *p, size_t nbytes, uint32_t *h1, uint32_t *h2) {
    hasher16_t h;
    hasher16_init(&h);
    hasher16_done(&h, p, nbytes, h1, h2);
}

/* A block's 16 float lanes of the statistics, without the counts. */
typedef struct {
    __m512 s, q, mn, mx;
} fl16_t;

AVX512_INLINE void fl16_init(fl16_t *f) {
    f->s = f->q = _mm512_setzero_ps();
    f->mn = _mm512_set1_ps(INFINITY);
    f->mx = _mm512_set1_ps(-INFINITY);
}

AVX512_INLINE void fl16_add(fl16_t *f, __m512 v) {
    f->mn = _mm512_min_ps(v, f->mn); /* v < mn ? v : mn */
    f->mx = _mm512_max_ps(v, f->mx); /* v > mx ? v : mx */
    f->s = _mm512_add_ps(f->s, v);
    f->q = _mm512_add_ps(f->q, keep_ps(_mm512_mul_ps(v, v)));
}

/* The end of a block: NaN/Inf counted if its sums are not all finite (a NaN or Inf stays in
 * a running sum for good), then the tail and the lanes in lane order (lanes_finish). */
AVX512_INLINE void block_end16(const fl16_t *f, uint64_t zeros, const void *xb, Py_ssize_t m16, Py_ssize_t m,
                               int code, acc_t *a) {
    uint64_t bad = a->nan + a->inf;
    if (_mm512_cmp_ps_mask(_mm512_abs_ps(f->s), _mm512_set1_ps(INFINITY), _CMP_LT_OQ) != 0xffff)
        count_nonfinite(xb, m16, code, a);
    a->zeros += zeros;
    lanes_t L;
    _mm512_storeu_ps(L.s, f->s);
    _mm512_storeu_ps(L.q, f->q);
    _mm512_storeu_ps(L.mn, f->mn);
    _mm512_storeu_ps(L.mx, f->mx);
    lanes_finish(&L, xb, m16, m, code, a, bad);
}

AVX512_INLINE void f32_loop16(const float *x, Py_ssize_t n, acc_t *a, uint32_t *h1, uint32_t *h2, int fetch) {
    const __m512 zero = _mm512_setzero_ps();
    const __m512i one = _mm512_set1_epi32(1);
    hasher16_t h;
    hasher16_init(&h);
    for (Py_ssize_t b0 = 0; b0 < n; b0 += BLOCK) {
        Py_ssize_t m = n - b0 < BLOCK ? n - b0 : BLOCK, m16 = m & ~(Py_ssize_t)15;
        const float *xb = x + b0;
        fl16_t f;
        fl16_init(&f);
        __m512i nz = _mm512_setzero_si512();
        for (Py_ssize_t i = 0; i < m16; i += 16) {
            FETCH16(xb + i, fetch & 1);
            __m512 v = _mm512_loadu_ps(xb + i);
            nz = _mm512_mask_add_epi32(nz, _mm512_cmp_ps_mask(v, zero, _CMP_EQ_OQ), nz, one);
            fl16_add(&f, v);
            if (!(fetch & NOHASH)) hasher16_add(&h, _mm512_castps_si512(v));
        }
        block_end16(&f, (uint32_t)_mm512_reduce_add_epi32(nz), xb, m16, m, F32, a);
    }
    if (!(fetch & NOHASH)) hasher16_done(&h, x, (size_t)n * 4, h1, h2);
}

/* Elements row*16 .. row*16+15 of the 32 float16 or bfloat16 at p (w: their 64 bytes) as
 * floats in lane order. bfloat16 is the high half of a float32: one permute puts word k in
 * the high half of lane k and zeroes the low halves. */
AVX512_INLINE __m512 half_row(__m512i w, const uint16_t *p, int row, int code) {
    if (code == F16) return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(p + 16 * row)));
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i idx = _mm512_slli_epi32(_mm512_add_epi32(lane, _mm512_set1_epi32(16 * row)), 16);
    return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16((__mmask32)0xAAAAAAAAu, idx, w));
}

AVX512_INLINE void half_loop16(const uint16_t *x, Py_ssize_t n, int code, acc_t *a, uint32_t *h1, uint32_t *h2,
                               int fetch) {
    const __m512i magnitude = _mm512_set1_epi16(0x7fff), one = _mm512_set1_epi16(1);
    hasher16_t h;
    hasher16_init(&h);
    for (Py_ssize_t b0 = 0; b0 < n; b0 += BLOCK) {
        Py_ssize_t m = n - b0 < BLOCK ? n - b0 : BLOCK, m16 = m & ~(Py_ssize_t)15, m32 = m & ~(Py_ssize_t)31;
        const uint16_t *xb = x + b0;
        fl16_t f;
        fl16_init(&f);
        __m512i nz = _mm512_setzero_si512(); /* 16-bit zero counts (all bits but the sign clear) */
        for (Py_ssize_t i = 0; i < m32; i += 32) {
            FETCH16(xb + i, fetch & 1);
            __m512i w = _mm512_loadu_si512(xb + i);
            nz = _mm512_mask_add_epi16(nz, _mm512_testn_epi16_mask(w, magnitude), nz, one);
            fl16_add(&f, half_row(w, xb + i, 0, code));
            fl16_add(&f, half_row(w, xb + i, 1, code));
            if (!(fetch & NOHASH)) hasher16_add(&h, w);
        }
        if (m32 < m16) { /* 16 more (the last block only); their words are hashed by hasher16_done */
            __m512i w = _mm512_maskz_loadu_epi16(0xffff, xb + m32);
            nz = _mm512_mask_add_epi16(nz, _mm512_mask_testn_epi16_mask(0xffff, w, magnitude), nz, one);
            fl16_add(&f, half_row(w, xb + m32, 0, code));
        }
        uint64_t zeros = (uint32_t)_mm512_reduce_add_epi32(_mm512_madd_epi16(nz, one));
        block_end16(&f, zeros, xb, m16, m, code, a);
    }
    if (!(fetch & NOHASH)) hasher16_done(&h, x, (size_t)n * 2, h1, h2);
}

/* float64's 8 lanes of s_f64 (fastats_kernel.h), without the NaN and Inf counts; the lanes'
 * sums are checked every CHUNK64 elements, as in f64_loop. */
AVX512_INLINE void f64_loop8(const double *x, Py_ssize_t n, acc_t *a, uint32_t *h1, uint32_t *h2, int fetch) {
    const __m512d zero = _mm512_setzero_pd();
    const __m512i one = _mm512_set1_epi64(1);
    __m512d s = zero, q = zero, mn = _mm512_set1_pd(INFINITY), mx = _mm512_set1_pd(-INFINITY);
    __m512i nz = _mm512_setzero_si512();
    hasher16_t h;
    hasher16_init(&h);
    Py_ssize_t n8 = n & ~(Py_ssize_t)7;
    for (Py_ssize_t c0 = 0; c0 < n8; c0 += CHUNK64) {
        Py_ssize_t c1 = n8 - c0 < CHUNK64 ? n8 : c0 + CHUNK64;
        for (Py_ssize_t i = c0; i < c1; i += 8) {
            FETCH16(x + i, fetch & 1);
            __m512d v = _mm512_loadu_pd(x + i);
            nz = _mm512_mask_add_epi64(nz, _mm512_cmp_pd_mask(v, zero, _CMP_EQ_OQ), nz, one);
            mn = _mm512_min_pd(v, mn);
            mx = _mm512_max_pd(v, mx);
            s = _mm512_add_pd(s, v);
            q = _mm512_add_pd(q, keep_pd(_mm512_mul_pd(v, v)));
            if (!(fetch & NOHASH)) hasher16_add(&h, _mm512_castpd_si512(v));
        }
        if (_mm512_cmp_pd_mask(_mm512_abs_pd(s), _mm512_set1_pd(INFINITY), _CMP_LT_OQ) != 0xff)
            count_nonfinite(x + c0, c1 - c0, F64, a);
    }
    a->zeros += (uint64_t)_mm512_reduce_add_epi64(nz);
    dlanes_t L;
    _mm512_storeu_pd(L.s, s);
    _mm512_storeu_pd(L.q, q);
    _mm512_storeu_pd(L.mn, mn);
    _mm512_storeu_pd(L.mx, mx);
    dlanes_finish(&L, x, n8, n, a);
    if (!(fetch & NOHASH)) hasher16_done(&h, x, (size_t)n * 8, h1, h2);
}

/* 64 bytes into the min, max, sum (64-bit, of x + 128 for int8), squares (32-bit) and zeros
 * (8-bit), as int8_add does with 32 (the sums are exact: their order is free). */
AVX512_INLINE void int8_add64(__m512i v, const uint8_t *p, int is_signed, __m512i *mn, __m512i *mx, __m512i *s,
                              __m512i *q32, __m512i *nz) {
    const __m512i zero = _mm512_setzero_si512();
    __m512i lo, hi; /* the 64 elements widened to 16 bits */
    *nz = _mm512_mask_add_epi8(*nz, _mm512_testn_epi8_mask(v, v), *nz, _mm512_set1_epi8(1));
    if (is_signed) {
        *mn = _mm512_min_epi8(v, *mn);
        *mx = _mm512_max_epi8(v, *mx);
        *s = _mm512_add_epi64(*s, _mm512_sad_epu8(_mm512_xor_si512(v, _mm512_set1_epi8((char)0x80)), zero));
        lo = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p));
        hi = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)(p + 32)));
    } else {
        *mn = _mm512_min_epu8(v, *mn);
        *mx = _mm512_max_epu8(v, *mx);
        *s = _mm512_add_epi64(*s, _mm512_sad_epu8(v, zero));
        lo = _mm512_unpacklo_epi8(v, zero);
        hi = _mm512_unpackhi_epi8(v, zero);
    }
    *q32 = _mm512_add_epi32(*q32, _mm512_add_epi32(_mm512_madd_epi16(lo, lo), _mm512_madd_epi16(hi, hi)));
}

AVX512_INLINE void int8_loop64(const uint8_t *x, Py_ssize_t n, int is_signed, acc_t *a, uint32_t *h1, uint32_t *h2,
                               int fetch) {
    const __m512i zero = _mm512_setzero_si512();
    __m512i mn = _mm512_set1_epi8(is_signed ? 0x7f : (char)0xff), mx = _mm512_set1_epi8(is_signed ? (char)0x80 : 0);
    __m512i s = zero;
    uint64_t q = 0, zeros = 0;
    hasher16_t h;
    hasher16_init(&h);
    Py_ssize_t n64 = n & ~(Py_ssize_t)63, i = 0;
    while (i < n64) { /* one zero count a step per 8-bit lane: INT8_FLUSH steps are safe */
        Py_ssize_t end = n64 - i < 64 * INT8_FLUSH ? n64 : i + 64 * INT8_FLUSH;
        __m512i nz = zero, q32 = zero;
        for (; i < end; i += 64) {
            FETCH16(x + i, fetch);
            __m512i v = _mm512_loadu_si512(x + i);
            int8_add64(v, x + i, is_signed, &mn, &mx, &s, &q32, &nz);
            hasher16_add(&h, v);
        }
        zeros += (uint64_t)_mm512_reduce_add_epi64(_mm512_sad_epu8(nz, zero));
        q += (uint32_t)_mm512_reduce_add_epi32(q32); /* at most 127 * 64 * 65025 < 2^32 */
    }
    __m256i mn0 = _mm512_castsi512_si256(mn), mn1 = _mm512_extracti64x4_epi64(mn, 1);
    __m256i mx0 = _mm512_castsi512_si256(mx), mx1 = _mm512_extracti64x4_epi64(mx, 1);
    mn0 = is_signed ? _mm256_min_epi8(mn0, mn1) : _mm256_min_epu8(mn0, mn1);
    mx0 = is_signed ? _mm256_max_epi8(mx0, mx1) : _mm256_max_epu8(mx0, mx1);
    int8_sums_t t = {_mm512_reduce_add_epi64(s) - (is_signed ? 128 * (int64_t)n64 : 0), q, zeros};
    int8_end(mn0, mx0, t, x, i, n, is_signed, a);
    hasher16_done(&h, x, (size_t)n, h1, h2);
}

/* Each loop in two copies: with prefetching for tensors likely not in L2, and without; and
 * in two more without the hash (h1 NULL: run_stats), each a loop of its own (BY_MODE). */
AVX512 static void f32_fused16(const float *x, Py_ssize_t n, acc_t *a, uint32_t *h1, uint32_t *h2) {
    int mode = LOOP_MODE16((size_t)n * 4, h1);
#define LOOP(m) f32_loop16(x, n, a, h1, h2, m)
    BY_MODE(mode, LOOP);
#undef LOOP
}

AVX512 static void half_fused16(const uint16_t *x, Py_ssize_t n, int code, acc_t *a, uint32_t *h1, uint32_t *h2) {
    int mode = LOOP_MODE16((size_t)n * 2, h1);
#define LOOP_F16(m) half_loop16(x, n, F16, a, h1, h2, m)
#define LOOP_BF16(m) half_loop16(x, n, BF16, a, h1, h2, m)
    if (code == F16) BY_MODE(mode, LOOP_F16);
    else BY_MODE(mode, LOOP_BF16);
#undef LOOP_F16
#undef LOOP_BF16
}

AVX512 static void f64_fused8(const double *x, Py_ssize_t n, acc_t *a, uint32_t *h1, uint32_t *h2) {
    int mode = LOOP_MODE16((size_t)n * 8, h1);
#define LOOP(m) f64_loop8(x, n, a, h1, h2, m)
    BY_MODE(mode, LOOP);
#undef LOOP
}

AVX512 static void int8_fused64(const uint8_t *x, Py_ssize_t n, int is_signed, acc_t *a, uint32_t *h1, uint32_t *h2) {
    int fetch = (size_t)n >= PREFETCH16_MIN;
    if (is_signed) {
        if (fetch) int8_loop64(x, n, 1, a, h1, h2, 1);
        else int8_loop64(x, n, 1, a, h1, h2, 0);
    } else {
        if (fetch) int8_loop64(x, n, 0, a, h1, h2, 1);
        else int8_loop64(x, n, 0, a, h1, h2, 0);
    }
}

/* Every dtype with AVX-512, as run_avx2 does with AVX2; 0 when another path must run. */
static int run_avx512(const void *p, Py_ssize_t n, int code, acc_t *a, uint32_t *h1, uint32_t *h2) {
    if (simd_level() < 2) return 0;
    switch (code) {
    case F32: f32_fused16((const float *)p, n, a, h1, h2); return 1;
    case F16: case BF16: half_fused16((const uint16_t *)p, n, code, a, h1, h2); return 1;
    case F64: f64_fused8((const double *)p, n, a, h1, h2); return 1;
    case I8: case U8: case BOOL:
        /* sums no longer exact in double: the portable order; without the hash: the portable loop */
        if (n >= ((Py_ssize_t)1 << 36) || !h1) return 0;
        int8_fused64((const uint8_t *)p, n, code == I8, a, h1, h2);
        return 1;
    case I16: s_i16((const int16_t *)p, n, a); break;
    case I32: s_i32((const int32_t *)p, n, a); break;
    case I64: s_i64((const int64_t *)p, n, a); break;
    default: return 0;
    }
    if (h1) hash_avx512(p, (size_t)n * ITEMSIZE[code], h1, h2);
    return 1;
}
