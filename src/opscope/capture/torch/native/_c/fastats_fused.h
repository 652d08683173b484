/* The fused kernels of fastats_avx2.h: statistics and the wsum64-v2 hash of the same 64 bytes
 * in one loop (one load of each byte, one pass over memory, integer hash ops interleaved with
 * the float ones). Bit for bit the portable loops of fastats_kernel.h:
 *  - float32, float16, bfloat16: blocks of BLOCK elements, 16 float lanes in each (lane l takes
 *    elements i + l), the tail of the last block in lane 0, lanes combined in lane order;
 *  - float64: 8 double lanes over the whole tensor, the tail in lane 0;
 *  - NaN and Inf are counted only where a stretch's sums come out non-finite
 *    (count_nonfinite), zeros always; counts are integers, so where they are counted is free;
 *  - int8, uint8, bool: exact integer sums (int8_loop says why that is the same bits).
 * Included by fastats_avx2.h only. */

/* Tensors of PREFETCH_MIN bytes or more are probably not in L2 (512 KB on Zen 3): their loops
 * ask for the bytes PREFETCH ahead (+40% on 64 MB of float32 here; no gain in L2, where the
 * extra instruction costs a little, so smaller tensors run the same loop without it). */
#define PREFETCH 2048
#define PREFETCH_MIN ((size_t)512 << 10)
#define FETCH(p, on) do { if (on) _mm_prefetch((const char *)(p) + PREFETCH, _MM_HINT_T0); } while (0)

/* A loop's `fetch` argument: bit 0 prefetches, NOHASH leaves the hash out (h1 NULL: run_stats).
 * Each of the four is a copy of the loop of its own, the bits constants in it (BY_MODE). */
#define NOHASH 2
#define LOOP_MODE(nbytes, h1) (((nbytes) >= PREFETCH_MIN) | ((h1) ? 0 : NOHASH))
#define BY_MODE(mode, LOOP)                     \
    do {                                        \
        switch (mode) {                         \
        case 0: LOOP(0); break;                 \
        case 1: LOOP(1); break;                 \
        case NOHASH: LOOP(NOHASH); break;       \
        default: LOOP(NOHASH | 1); break;       \
        }                                       \
    } while (0)

/* 8 float lanes of the statistics, without the counts. */
typedef struct {
    __m256 s, q, mn, mx;
} fl8_t;

AVX2_INLINE void fl8_init(fl8_t *f) {
    f->s = f->q = _mm256_setzero_ps();
    f->mn = _mm256_set1_ps(INFINITY);
    f->mx = _mm256_set1_ps(-INFINITY);
}

AVX2_INLINE void fl8_add(fl8_t *f, __m256 v) {
    f->mn = _mm256_min_ps(v, f->mn); /* v < mn ? v : mn */
    f->mx = _mm256_max_ps(v, f->mx); /* v > mx ? v : mx */
    f->s = _mm256_add_ps(f->s, v);
    f->q = _mm256_add_ps(f->q, _mm256_mul_ps(v, v)); /* no FMA: the portable loop rounds v*v first */
}

/* Are the 8 sums finite? (NaN or Inf stays in a running sum for good.) */
AVX2_INLINE int fl8_finite(const fl8_t *f) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 ok = _mm256_cmp_ps(_mm256_and_ps(f->s, absmask), _mm256_set1_ps(INFINITY), _CMP_LT_OQ);
    return _mm256_movemask_ps(ok) == 0xff;
}

/* One block's 16 lanes, in the portable loop's lane order. */
typedef struct {
    float s[LANES], q[LANES], mn[LANES], mx[LANES];
} lanes_t;

/* Vector lane k goes to lane first + k * stride. */
AVX2_INLINE void fl8_store(const fl8_t *f, lanes_t *L, int first, int stride) {
    float s[8], q[8], mn[8], mx[8];
    _mm256_storeu_ps(s, f->s);
    _mm256_storeu_ps(q, f->q);
    _mm256_storeu_ps(mn, f->mn);
    _mm256_storeu_ps(mx, f->mx);
    for (int k = 0; k < 8; k++) {
        int l = first + k * stride;
        L->s[l] = s[k]; L->q[l] = q[k]; L->mn[l] = mn[k]; L->mx[l] = mx[k];
    }
}

AVX2_INLINE uint64_t sum_epi32(__m256i v) {
    uint32_t c[8];
    uint64_t t = 0;
    _mm256_storeu_si256((__m256i *)c, v);
    for (int l = 0; l < 8; l++) t += c[l];
    return t;
}

/* v*v rounded on its own, as the portable loop rounds it: no FMA may take the product (C++
 * builds contract by default, and the AVX-512 code is compiled with FMA at hand). */
static inline float square_f(float v) {
    float q = v * v;
    __asm__("" : "+x"(q));
    return q;
}

static inline double square_d(double v) {
    double q = v * v;
    __asm__("" : "+x"(q));
    return q;
}

/* The tail of a block (elements m16..m-1) added to lane 0, then the lanes combined into `a`
 * in lane order; `bad` is a's NaN and Inf count before the block: if it grew, the block has
 * one, else lanes that overflowed are summed again in double (add_lanes). */
static inline void lanes_finish(lanes_t *L, const void *xb, Py_ssize_t m16, Py_ssize_t m, int code, acc_t *a,
                                uint64_t bad) {
    for (Py_ssize_t i = m16; i < m; i++) {
        float v = load_float(xb, i, code);
        a->nan += v != v; a->inf += fabsf(v) == INFINITY; a->zeros += v == 0.0f;
        L->mn[0] = v < L->mn[0] ? v : L->mn[0]; L->mx[0] = v > L->mx[0] ? v : L->mx[0];
        L->s[0] += v; L->q[0] += square_f(v);
    }
    add_lanes(a, L->s, L->q, a->nan + a->inf == bad, xb, m, code);
    for (int l = 0; l < LANES; l++) {
        if (L->mn[l] < a->mn) a->mn = L->mn[l];
        if (L->mx[l] > a->mx) a->mx = L->mx[l];
    }
}

/* The end of a block: NaN/Inf counted if its sums say so, then lanes_finish. */
AVX2_INLINE void block_end(const fl8_t *f0, const fl8_t *f1, int first1, int stride, uint64_t zeros,
                           const void *xb, Py_ssize_t m16, Py_ssize_t m, int code, acc_t *a) {
    uint64_t bad = a->nan + a->inf;
    if (!fl8_finite(f0) || !fl8_finite(f1)) count_nonfinite(xb, m16, code, a);
    a->zeros += zeros;
    lanes_t L;
    fl8_store(f0, &L, 0, stride);
    fl8_store(f1, &L, first1, stride);
    lanes_finish(&L, xb, m16, m, code, a, bad);
}

AVX2_INLINE void f32_loop(const float *x, Py_ssize_t n, acc_t *a, uint32_t *h1, uint32_t *h2, int fetch) {
    const __m256 zero = _mm256_setzero_ps();
    hasher_t h;
    hasher_init(&h, 0);
    for (Py_ssize_t b0 = 0; b0 < n; b0 += BLOCK) {
        Py_ssize_t m = n - b0 < BLOCK ? n - b0 : BLOCK, m16 = m & ~(Py_ssize_t)15;
        const float *xb = x + b0;
        fl8_t lo, hi;
        fl8_init(&lo);
        fl8_init(&hi);
        __m256i nz = _mm256_setzero_si256();
        for (Py_ssize_t i = 0; i < m16; i += 16) {
            FETCH(xb + i, fetch & 1);
            __m256 v0 = _mm256_loadu_ps(xb + i), v1 = _mm256_loadu_ps(xb + i + 8);
            nz = _mm256_sub_epi32(nz, _mm256_castps_si256(_mm256_cmp_ps(v0, zero, _CMP_EQ_OQ)));
            nz = _mm256_sub_epi32(nz, _mm256_castps_si256(_mm256_cmp_ps(v1, zero, _CMP_EQ_OQ)));
            fl8_add(&lo, v0);
            fl8_add(&hi, v1);
            if (!(fetch & NOHASH)) hasher_add16(&h, _mm256_castps_si256(v0), _mm256_castps_si256(v1));
        }
        block_end(&lo, &hi, 8, 1, sum_epi32(nz), xb, m16, m, F32, a);
    }
    if (!(fetch & NOHASH)) hasher_done(&h, x, (size_t)n * 4, 0, h1, h2);
}

AVX2 static void f32_fused(const float *x, Py_ssize_t n, acc_t *a, uint32_t *h1, uint32_t *h2) {
    int mode = LOOP_MODE((size_t)n * 4, h1);
#define LOOP(m) f32_loop(x, n, a, h1, h2, m)
    BY_MODE(mode, LOOP);
#undef LOOP
}

/* 16 float16 or bfloat16 elements (32 bytes, w; p points at them) into the block's two
 * halves of 8 lanes; zeros counted on the 16-bit words (all bits but the sign clear). */
AVX2_INLINE void half16_add(fl8_t *f0, fl8_t *f1, __m256i *nz, const uint16_t *p, __m256i w, int code) {
    *nz = _mm256_sub_epi16(*nz, _mm256_cmpeq_epi16(_mm256_add_epi16(w, w), _mm256_setzero_si256()));
    if (code == F16) { /* elements 0..7 to lanes 0..7, 8..15 to lanes 8..15 */
        fl8_add(f0, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)));
        fl8_add(f1, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 8))));
    } else { /* bfloat16 is the high half of a float32: even elements (lanes 0, 2, ..) and odd ones */
        fl8_add(f0, _mm256_castsi256_ps(_mm256_slli_epi32(w, 16)));
        fl8_add(f1, _mm256_castsi256_ps(_mm256_and_si256(w, _mm256_set1_epi32((int)0xffff0000u))));
    }
}

AVX2_INLINE void half_loop(const uint16_t *x, Py_ssize_t n, int code, acc_t *a, uint32_t *h1, uint32_t *h2,
                           int fetch) {
    hasher_t h;
    hasher_init(&h, 0);
    for (Py_ssize_t b0 = 0; b0 < n; b0 += BLOCK) {
        Py_ssize_t m = n - b0 < BLOCK ? n - b0 : BLOCK, m16 = m & ~(Py_ssize_t)15, m32 = m & ~(Py_ssize_t)31;
        const uint16_t *xb = x + b0;
        fl8_t f0, f1;
        fl8_init(&f0);
        fl8_init(&f1);
        __m256i nz = _mm256_setzero_si256(); /* 16-bit counts: at most BLOCK / 16 each */
        for (Py_ssize_t i = 0; i < m32; i += 32) {
            FETCH(xb + i, fetch & 1);
            __m256i w0 = _mm256_loadu_si256((const __m256i *)(xb + i));
            __m256i w1 = _mm256_loadu_si256((const __m256i *)(xb + i + 16));
            half16_add(&f0, &f1, &nz, xb + i, w0, code);
            half16_add(&f0, &f1, &nz, xb + i + 16, w1, code);
            if (!(fetch & NOHASH)) hasher_add16(&h, w0, w1);
        }
        if (m32 < m16) { /* 16 more (the last block only) */
            __m256i w0 = _mm256_loadu_si256((const __m256i *)(xb + m32));
            half16_add(&f0, &f1, &nz, xb + m32, w0, code);
            if (!(fetch & NOHASH)) hasher_add8(&h, w0);
        }
        uint64_t zeros = sum_epi32(_mm256_madd_epi16(nz, _mm256_set1_epi16(1)));
        if (code == F16) block_end(&f0, &f1, 8, 1, zeros, xb, m16, m, code, a);
        else block_end(&f0, &f1, 1, 2, zeros, xb, m16, m, code, a);
    }
    if (!(fetch & NOHASH)) hasher_done(&h, x, (size_t)n * 2, 0, h1, h2);
}

AVX2 static void f16_fused(const uint16_t *x, Py_ssize_t n, acc_t *a, uint32_t *h1, uint32_t *h2) {
    int mode = LOOP_MODE((size_t)n * 2, h1);
#define LOOP(m) half_loop(x, n, F16, a, h1, h2, m)
    BY_MODE(mode, LOOP);
#undef LOOP
}

AVX2 static void bf16_fused(const uint16_t *x, Py_ssize_t n, acc_t *a, uint32_t *h1, uint32_t *h2) {
    int mode = LOOP_MODE((size_t)n * 2, h1);
#define LOOP(m) half_loop(x, n, BF16, a, h1, h2, m)
    BY_MODE(mode, LOOP);
#undef LOOP
}

/* 4 double lanes of s_f64 (fastats_kernel.h), without the counts. */
typedef struct {
    __m256d s, q, mn, mx;
} d4_t;

AVX2_INLINE void d4_add(d4_t *d, __m256i *nz, __m256d v) {
    *nz = _mm256_sub_epi64(*nz, _mm256_castpd_si256(_mm256_cmp_pd(v, _mm256_setzero_pd(), _CMP_EQ_OQ)));
    d->mn = _mm256_min_pd(v, d->mn);
    d->mx = _mm256_max_pd(v, d->mx);
    d->s = _mm256_add_pd(d->s, v);
    d->q = _mm256_add_pd(d->q, _mm256_mul_pd(v, v));
}

AVX2_INLINE int d4_finite(const d4_t *d) {
    const __m256d absmask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
    return _mm256_movemask_pd(_mm256_cmp_pd(_mm256_and_pd(d->s, absmask), _mm256_set1_pd(INFINITY), _CMP_LT_OQ)) == 0xf;
}

/* float64's 8 lanes, in the portable loop's order. */
typedef struct {
    double s[8], q[8], mn[8], mx[8];
} dlanes_t;

/* The tail (elements n8..n-1) added to lane 0, as in the portable loop, then the lanes combined. */
static inline void dlanes_finish(dlanes_t *L, const double *x, Py_ssize_t n8, Py_ssize_t n, acc_t *a) {
    for (Py_ssize_t i = n8; i < n; i++) {
        double v = x[i];
        a->nan += v != v; a->inf += fabs(v) == INFINITY; a->zeros += v == 0.0;
        L->mn[0] = v < L->mn[0] ? v : L->mn[0]; L->mx[0] = v > L->mx[0] ? v : L->mx[0];
        L->s[0] += v; L->q[0] += square_d(v);
    }
    for (int l = 0; l < 8; l++) {
        a->sum += L->s[l]; a->sumsq += L->q[l];
        if (L->mn[l] < a->mn) a->mn = L->mn[l];
        if (L->mx[l] > a->mx) a->mx = L->mx[l];
    }
}

/* The lanes' sums are checked every CHUNK64 elements; once one is non-finite (also by
 * overflow) it stays so, and every later stretch is counted. */
#define CHUNK64 2048

AVX2_INLINE void f64_loop(const double *x, Py_ssize_t n, acc_t *a, uint32_t *h1, uint32_t *h2, int fetch) {
    d4_t d[2];
    for (int k = 0; k < 2; k++) {
        d[k].s = d[k].q = _mm256_setzero_pd();
        d[k].mn = _mm256_set1_pd(INFINITY);
        d[k].mx = _mm256_set1_pd(-INFINITY);
    }
    __m256i nz = _mm256_setzero_si256(); /* zeros of all 8 lanes (their sum is what is kept) */
    hasher_t h;
    hasher_init(&h, 0);
    Py_ssize_t n8 = n & ~(Py_ssize_t)7;
    for (Py_ssize_t c0 = 0; c0 < n8; c0 += CHUNK64) {
        Py_ssize_t c1 = n8 - c0 < CHUNK64 ? n8 : c0 + CHUNK64;
        for (Py_ssize_t i = c0; i < c1; i += 8) {
            FETCH(x + i, fetch & 1);
            __m256d v0 = _mm256_loadu_pd(x + i), v1 = _mm256_loadu_pd(x + i + 4);
            d4_add(&d[0], &nz, v0);
            d4_add(&d[1], &nz, v1);
            if (!(fetch & NOHASH)) hasher_add16(&h, _mm256_castpd_si256(v0), _mm256_castpd_si256(v1));
        }
        if (!d4_finite(&d[0]) || !d4_finite(&d[1])) count_nonfinite(x + c0, c1 - c0, F64, a);
    }
    uint64_t zeros[4];
    _mm256_storeu_si256((__m256i *)zeros, nz);
    for (int k = 0; k < 4; k++) a->zeros += zeros[k];
    dlanes_t L;
    for (int k = 0; k < 2; k++) {
        _mm256_storeu_pd(L.s + 4 * k, d[k].s);
        _mm256_storeu_pd(L.q + 4 * k, d[k].q);
        _mm256_storeu_pd(L.mn + 4 * k, d[k].mn);
        _mm256_storeu_pd(L.mx + 4 * k, d[k].mx);
    }
    dlanes_finish(&L, x, n8, n, a);
    if (!(fetch & NOHASH)) hasher_done(&h, x, (size_t)n * 8, 0, h1, h2);
}

AVX2 static void f64_fused(const double *x, Py_ssize_t n, acc_t *a, uint32_t *h1, uint32_t *h2) {
    int mode = LOOP_MODE((size_t)n * 8, h1);
#define LOOP(m) f64_loop(x, n, a, h1, h2, m)
    BY_MODE(mode, LOOP);
#undef LOOP
}

/* Statistics of uint8 and bool (is_signed 0) and int8 (1), fused with the hash: INT_STATS
 * (fastats_kernel.h) adds in double, and while n < 2^36 every partial sum (of x up to 255, of
 * x*x up to 65025) is an integer below 2^53, so exact: the integer sums kept here are the same
 * bits, in any order. */
#define INT8_FLUSH 127 /* 64-byte steps before an 8-bit zero count could overflow */

AVX2_INLINE uint64_t sum_epi64(__m256i v) {
    uint64_t c[4];
    _mm256_storeu_si256((__m256i *)c, v);
    return c[0] + c[1] + c[2] + c[3];
}

/* 32 bytes into the min, max, sum (64-bit, of x + 128 for int8), squares (32-bit) and zeros. */
AVX2_INLINE void int8_add(__m256i v, int is_signed, __m256i *mn, __m256i *mx, __m256i *s, __m256i *q32,
                          __m256i *nz) {
    const __m256i zero = _mm256_setzero_si256();
    __m256i lo, hi;
    *nz = _mm256_sub_epi8(*nz, _mm256_cmpeq_epi8(v, zero));
    if (is_signed) {
        *mn = _mm256_min_epi8(v, *mn);
        *mx = _mm256_max_epi8(v, *mx);
        *s = _mm256_add_epi64(*s, _mm256_sad_epu8(_mm256_xor_si256(v, _mm256_set1_epi8((char)0x80)), zero));
        lo = _mm256_srai_epi16(_mm256_unpacklo_epi8(v, v), 8);
        hi = _mm256_srai_epi16(_mm256_unpackhi_epi8(v, v), 8);
    } else {
        *mn = _mm256_min_epu8(v, *mn);
        *mx = _mm256_max_epu8(v, *mx);
        *s = _mm256_add_epi64(*s, _mm256_sad_epu8(v, zero));
        lo = _mm256_unpacklo_epi8(v, zero);
        hi = _mm256_unpackhi_epi8(v, zero);
    }
    *q32 = _mm256_add_epi32(*q32, _mm256_add_epi32(_mm256_madd_epi16(lo, lo), _mm256_madd_epi16(hi, hi)));
}

/* The sums of an int8 loop's first elements: sum, squares, zeros. */
typedef struct {
    int64_t sum;
    uint64_t q, zeros;
} int8_sums_t;

/* The end of an int8 loop: the min and max's 32 bytes folded, elements i..n-1 added to `t`,
 * the statistics into `a`. */
AVX2_INLINE void int8_end(__m256i mn, __m256i mx, int8_sums_t t, const uint8_t *x, Py_ssize_t i, Py_ssize_t n,
                          int is_signed, acc_t *a) {
    uint8_t bmn[32], bmx[32];
    _mm256_storeu_si256((__m256i *)bmn, mn);
    _mm256_storeu_si256((__m256i *)bmx, mx);
    int least = is_signed ? 127 : 255, most = is_signed ? -128 : 0; /* any element is within them */
    for (int k = 0; k < 32; k++) {
        int m0 = is_signed ? (int8_t)bmn[k] : bmn[k], m1 = is_signed ? (int8_t)bmx[k] : bmx[k];
        least = m0 < least ? m0 : least;
        most = m1 > most ? m1 : most;
    }
    for (; i < n; i++) {
        int v = is_signed ? (int8_t)x[i] : x[i];
        t.sum += v; t.q += (uint64_t)(v * v); t.zeros += v == 0;
        least = v < least ? v : least;
        most = v > most ? v : most;
    }
    a->mn = least; a->mx = most; a->sum = (double)t.sum; a->sumsq = (double)t.q; a->zeros = t.zeros;
}

AVX2_INLINE void int8_loop(const uint8_t *x, Py_ssize_t n, int is_signed, acc_t *a, uint32_t *h1, uint32_t *h2,
                           int fetch) {
    const __m256i zero = _mm256_setzero_si256();
    __m256i mn = _mm256_set1_epi8(is_signed ? 0x7f : (char)0xff), mx = _mm256_set1_epi8(is_signed ? (char)0x80 : 0);
    __m256i s = zero;
    uint64_t q = 0, zeros = 0;
    hasher_t h;
    hasher_init(&h, 0);
    Py_ssize_t n64 = n & ~(Py_ssize_t)63, i = 0;
    while (i < n64) {
        Py_ssize_t end = n64 - i < 64 * INT8_FLUSH ? n64 : i + 64 * INT8_FLUSH;
        __m256i nz = zero, q32 = zero; /* 8-bit zero counts; 32-bit sums of squares */
        for (; i < end; i += 64) {
            FETCH(x + i, fetch);
            __m256i v0 = _mm256_loadu_si256((const __m256i *)(x + i));
            __m256i v1 = _mm256_loadu_si256((const __m256i *)(x + i + 32));
            int8_add(v0, is_signed, &mn, &mx, &s, &q32, &nz);
            int8_add(v1, is_signed, &mn, &mx, &s, &q32, &nz);
            hasher_add16(&h, v0, v1);
        }
        zeros += sum_epi64(_mm256_sad_epu8(nz, zero));
        q += sum_epi32(q32);
    }
    int8_sums_t t = {(int64_t)sum_epi64(s) - (is_signed ? 128 * (int64_t)n64 : 0), q, zeros};
    int8_end(mn, mx, t, x, i, n, is_signed, a);
    hasher_done(&h, x, (size_t)n, 0, h1, h2);
}

AVX2 static void u8_fused(const uint8_t *x, Py_ssize_t n, acc_t *a, uint32_t *h1, uint32_t *h2) {
    if ((size_t)n >= PREFETCH_MIN) int8_loop(x, n, 0, a, h1, h2, 1);
    else int8_loop(x, n, 0, a, h1, h2, 0);
}

AVX2 static void i8_fused(const uint8_t *x, Py_ssize_t n, acc_t *a, uint32_t *h1, uint32_t *h2) {
    if ((size_t)n >= PREFETCH_MIN) int8_loop(x, n, 1, a, h1, h2, 1);
    else int8_loop(x, n, 1, a, h1, h2, 0);
}
