/* Explicit AVX2 versions of fastats.c's float kernels and hash, chosen at run time on x86
 * CPUs that have AVX2 and F16C. They compute exactly what the portable loops compute, bit
 * for bit: the same 16 float lanes (8 for float64) accumulate the same elements in the same
 * order within each block, combined in the same lane order; min/max follow `v < m ? v : m`
 * (which is what MINPS does); the hash is a sum modulo 2^32, so its order is free.
 * The compiler's own vectorisation of the portable loops reaches ~12 GB/s on float32 and
 * under 1 GB/s on float16; these run several times faster. Included by fastats.c only. */
#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,f16c")))

__attribute__((target("avx2,f16c"), always_inline)) static inline __m256 load8(const void *x, Py_ssize_t i, int code) {
    if (code == F32) return _mm256_loadu_ps((const float *)x + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)x + i));
    if (code == F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); /* bfloat16 */
}

static inline float load1(const void *x, Py_ssize_t i, int code) {
    if (code == F32) return ((const float *)x)[i];
    uint16_t h = ((const uint16_t *)x)[i];
    return code == F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

/* One half (8 lanes) of the 16-lane float accumulators. */
typedef struct {
    __m256 s, q, mn, mx;
    __m256i nn, ni, nz;
} half_t;

AVX2 static inline void half_init(half_t *h) {
    h->s = h->q = _mm256_setzero_ps();
    h->mn = _mm256_set1_ps(INFINITY);
    h->mx = _mm256_set1_ps(-INFINITY);
    h->nn = h->ni = h->nz = _mm256_setzero_si256();
}

/* Everything but the NaN and Inf counts: a block whose sums come out finite has neither
 * (one NaN or Inf element makes its lane's running sum NaN or Inf for good), so the counts
 * are only needed for the rare block that does not; it is then run again with them. */
__attribute__((target("avx2,f16c"), always_inline)) static inline void half_add_finite(half_t *h, __m256 v) {
    h->nz = _mm256_sub_epi32(h->nz, _mm256_castps_si256(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_EQ_OQ)));
    h->mn = _mm256_min_ps(v, h->mn); /* v < mn ? v : mn */
    h->mx = _mm256_max_ps(v, h->mx); /* v > mx ? v : mx */
    h->s = _mm256_add_ps(h->s, v);
    h->q = _mm256_add_ps(h->q, _mm256_mul_ps(v, v)); /* no FMA: the portable loop rounds v*v first */
}

__attribute__((target("avx2,f16c"), always_inline)) static inline void half_add(half_t *h, __m256 v) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    h->nn = _mm256_sub_epi32(h->nn, _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    h->ni = _mm256_sub_epi32(h->ni, _mm256_castps_si256(
                                        _mm256_cmp_ps(_mm256_and_ps(v, absmask), _mm256_set1_ps(INFINITY), _CMP_EQ_OQ)));
    half_add_finite(h, v);
}

/* Are all 8 lanes of the sums and sums of squares finite? */
AVX2 static inline int half_finite(const half_t *h) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), inf = _mm256_set1_ps(INFINITY);
    __m256 ok = _mm256_and_ps(_mm256_cmp_ps(_mm256_and_ps(h->s, absmask), inf, _CMP_LT_OQ),
                              _mm256_cmp_ps(_mm256_and_ps(h->q, absmask), inf, _CMP_LT_OQ));
    return _mm256_movemask_ps(ok) == 0xff;
}

AVX2 static inline void half_store(const half_t *h, float *s, float *q, float *mn, float *mx, uint32_t *nn,
                                   uint32_t *ni, uint32_t *nz) {
    _mm256_storeu_ps(s, h->s);
    _mm256_storeu_ps(q, h->q);
    _mm256_storeu_ps(mn, h->mn);
    _mm256_storeu_ps(mx, h->mx);
    _mm256_storeu_si256((__m256i *)nn, h->nn);
    _mm256_storeu_si256((__m256i *)ni, h->ni);
    _mm256_storeu_si256((__m256i *)nz, h->nz);
}

/* FLOAT_STATS of fastats.c for float32, float16 and bfloat16 (inlined into one function
 * per dtype below, so that the load is chosen at compile time). */
__attribute__((target("avx2,f16c"), always_inline)) static inline void float_stats_avx2(const void *x, Py_ssize_t n,
                                                                                       int code, acc_t *a) {
    for (Py_ssize_t b0 = 0; b0 < n; b0 += BLOCK) {
        Py_ssize_t m = n - b0 < BLOCK ? n - b0 : BLOCK, i = 0;
        half_t lo, hi;
        half_init(&lo);
        half_init(&hi);
        for (; i + LANES <= m; i += LANES) {
            half_add_finite(&lo, load8(x, b0 + i, code));
            half_add_finite(&hi, load8(x, b0 + i + 8, code));
        }
        if (!half_finite(&lo) || !half_finite(&hi)) { /* NaN or Inf in this block: count them */
            half_init(&lo);
            half_init(&hi);
            for (i = 0; i + LANES <= m; i += LANES) {
                half_add(&lo, load8(x, b0 + i, code));
                half_add(&hi, load8(x, b0 + i + 8, code));
            }
        }
        float s[LANES], q[LANES], mn[LANES], mx[LANES];
        uint32_t nn[LANES], ni[LANES], nz[LANES];
        half_store(&lo, s, q, mn, mx, nn, ni, nz);
        half_store(&hi, s + 8, q + 8, mn + 8, mx + 8, nn + 8, ni + 8, nz + 8);
        for (; i < m; i++) { /* the tail goes to lane 0, as in the portable loop */
            float v = load1(x, b0 + i, code);
            nn[0] += v != v; ni[0] += fabsf(v) == INFINITY; nz[0] += v == 0.0f;
            mn[0] = v < mn[0] ? v : mn[0]; mx[0] = v > mx[0] ? v : mx[0];
            s[0] += v; q[0] += v * v;
        }
        for (int l = 0; l < LANES; l++) {
            a->sum += s[l]; a->sumsq += q[l]; a->nan += nn[l]; a->inf += ni[l];
            a->zeros += nz[l];
            if (mn[l] < a->mn) a->mn = mn[l];
            if (mx[l] > a->mx) a->mx = mx[l];
        }
    }
}

AVX2 static void stats_f32_avx2(const void *x, Py_ssize_t n, acc_t *a) { float_stats_avx2(x, n, F32, a); }
AVX2 static void stats_f16_avx2(const void *x, Py_ssize_t n, acc_t *a) { float_stats_avx2(x, n, F16, a); }
AVX2 static void stats_bf16_avx2(const void *x, Py_ssize_t n, acc_t *a) { float_stats_avx2(x, n, BF16, a); }

/* s_f64 of fastats.c: 8 double lanes over the whole tensor. */
AVX2 static void double_stats_avx2(const double *x, Py_ssize_t n, acc_t *a) {
    const __m256d absmask = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
    const __m256d inf = _mm256_set1_pd(INFINITY), zero = _mm256_setzero_pd();
    __m256d s[2], q[2], mn[2], mx[2];
    __m256i nn[2], ni[2], nz[2];
    for (int h = 0; h < 2; h++) {
        s[h] = q[h] = zero;
        mn[h] = inf;
        mx[h] = _mm256_set1_pd(-INFINITY);
        nn[h] = ni[h] = nz[h] = _mm256_setzero_si256();
    }
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int h = 0; h < 2; h++) {
            __m256d v = _mm256_loadu_pd(x + i + 4 * h);
            nn[h] = _mm256_sub_epi64(nn[h], _mm256_castpd_si256(_mm256_cmp_pd(v, v, _CMP_UNORD_Q)));
            ni[h] = _mm256_sub_epi64(ni[h], _mm256_castpd_si256(_mm256_cmp_pd(_mm256_and_pd(v, absmask), inf, _CMP_EQ_OQ)));
            nz[h] = _mm256_sub_epi64(nz[h], _mm256_castpd_si256(_mm256_cmp_pd(v, zero, _CMP_EQ_OQ)));
            mn[h] = _mm256_min_pd(v, mn[h]);
            mx[h] = _mm256_max_pd(v, mx[h]);
            s[h] = _mm256_add_pd(s[h], v);
            q[h] = _mm256_add_pd(q[h], _mm256_mul_pd(v, v));
        }
    double ss[8], qq[8], mnn[8], mxx[8];
    uint64_t cn[8], ci[8], cz[8];
    for (int h = 0; h < 2; h++) {
        _mm256_storeu_pd(ss + 4 * h, s[h]);
        _mm256_storeu_pd(qq + 4 * h, q[h]);
        _mm256_storeu_pd(mnn + 4 * h, mn[h]);
        _mm256_storeu_pd(mxx + 4 * h, mx[h]);
        _mm256_storeu_si256((__m256i *)(cn + 4 * h), nn[h]);
        _mm256_storeu_si256((__m256i *)(ci + 4 * h), ni[h]);
        _mm256_storeu_si256((__m256i *)(cz + 4 * h), nz[h]);
    }
    for (; i < n; i++) {
        double v = x[i];
        cn[0] += v != v; ci[0] += fabs(v) == INFINITY; cz[0] += v == 0.0;
        mnn[0] = v < mnn[0] ? v : mnn[0]; mxx[0] = v > mxx[0] ? v : mxx[0];
        ss[0] += v; qq[0] += v * v;
    }
    for (int l = 0; l < 8; l++) {
        a->sum += ss[l]; a->sumsq += qq[l]; a->nan += cn[l]; a->inf += ci[l]; a->zeros += cz[l];
        if (mnn[l] < a->mn) a->mn = mnn[l];
        if (mxx[l] > a->mx) a->mx = mxx[l];
    }
}

/* Eight lanes of hash_mix (fastats_kernel.h). */
__attribute__((target("avx2,f16c"), always_inline)) static inline __m256i mix8(__m256i v, __m256i salt) {
    __m256i x = _mm256_xor_si256(v, salt);
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)MIX1));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)MIX2));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

/* hash_bytes of fastats_kernel.h ("wsum64-v2"), 16 words at a time in two independent
 * halves (more work in flight: ~7% faster than one); i * GOLD is carried along by addition. */
AVX2 static void hash_avx2(const void *p, size_t nbytes, uint32_t first, uint32_t *h1, uint32_t *h2) {
    const __m256i lane = _mm256_add_epi32(_mm256_set1_epi32((int)first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i step = _mm256_set1_epi32((int)(8u * GOLD));
    __m256i salt0 = _mm256_mullo_epi32(lane, _mm256_set1_epi32((int)GOLD)), salt1 = _mm256_add_epi32(salt0, step);
    __m256i A0 = _mm256_setzero_si256(), A1 = A0, B0 = A0, B1 = A0;
    const unsigned char *bytes = (const unsigned char *)p;
    size_t pairs = nbytes / 64;
    for (size_t k = 0; k < pairs; k++) {
        __m256i x0 = mix8(_mm256_loadu_si256((const __m256i *)(bytes + 64 * k)), salt0);
        __m256i x1 = mix8(_mm256_loadu_si256((const __m256i *)(bytes + 64 * k + 32)), salt1);
        A0 = _mm256_add_epi32(A0, _mm256_xor_si256(x0, salt0));
        A1 = _mm256_add_epi32(A1, _mm256_xor_si256(x1, salt1));
        B0 = _mm256_add_epi32(B0, x0);
        B1 = _mm256_add_epi32(B1, x1);
        salt0 = _mm256_add_epi32(salt0, _mm256_add_epi32(step, step));
        salt1 = _mm256_add_epi32(salt1, _mm256_add_epi32(step, step));
    }
    uint32_t la[8], lb[8], a = 0, b = 0;
    _mm256_storeu_si256((__m256i *)la, _mm256_add_epi32(A0, A1));
    _mm256_storeu_si256((__m256i *)lb, _mm256_add_epi32(B0, B1));
    for (int l = 0; l < 8; l++) { a += la[l]; b += lb[l]; }
    *h1 += a; *h2 += b;
    hash_bytes(bytes + 64 * pairs, nbytes - 64 * pairs, first + 16u * (uint32_t)pairs, h1, h2); /* the tail */
}

static int has_avx2(void) {
    static int known = -1;
    if (known < 0) { /* OPSCOPE_NO_SIMD=1 runs the portable loops (tests compare the two) */
        const char *off = getenv("OPSCOPE_NO_SIMD");
        __builtin_cpu_init();
        known = !(off && *off && *off != '0') && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    }
    return known;
}

static int avx2_available(void) { return has_avx2(); }

/* Statistics then hash of 32K elements at a time (block-aligned, so the statistics are those
 * of one pass), while they are still in cache: one read of the tensor from memory, not two. */
#define FUSED (8 * BLOCK)

AVX2 static void float_fused_avx2(const void *p, Py_ssize_t n, int code, acc_t *a, uint32_t *h1, uint32_t *h2) {
    size_t size = ITEMSIZE[code];
    for (Py_ssize_t off = 0; off < n; off += FUSED) {
        Py_ssize_t m = n - off < FUSED ? n - off : FUSED;
        const unsigned char *q = (const unsigned char *)p + (size_t)off * size;
        if (code == F32) stats_f32_avx2(q, m, a);
        else if (code == F16) stats_f16_avx2(q, m, a);
        else stats_bf16_avx2(q, m, a);
        hash_avx2(q, (size_t)m * size, (uint32_t)((size_t)off * size / 4), h1, h2);
    }
}

/* Every dtype's hash with AVX2, and the float types' statistics (the integers' are the
 * portable loops); 0 when the portable code must run. */
static int run_avx2(const void *p, Py_ssize_t n, int code, acc_t *a, uint32_t *h1, uint32_t *h2) {
    if (!has_avx2()) return 0;
    switch (code) {
    case F32: case F16: case BF16: float_fused_avx2(p, n, code, a, h1, h2); return 1;
    case F64: double_stats_avx2((const double *)p, n, a); break;
    case I8: s_i8((const int8_t *)p, n, a); break;
    case U8: case BOOL: s_u8((const uint8_t *)p, n, a); break;
    case I16: s_i16((const int16_t *)p, n, a); break;
    case I32: s_i32((const int32_t *)p, n, a); break;
    case I64: s_i64((const int64_t *)p, n, a); break;
    default: return 0;
    }
    hash_avx2(p, (size_t)n * ITEMSIZE[code], 0, h1, h2);
    return 1;
}
#else
static int avx2_available(void) { return 0; }
static int run_avx2(const void *p, Py_ssize_t n, int code, acc_t *a, uint32_t *h1, uint32_t *h2) {
    (void)p; (void)n; (void)code; (void)a; (void)h1; (void)h2;
    return 0;
}
#endif
