/* Explicit AVX2 versions of fastats_kernel.h's float kernels and hash, chosen at run time on
 * x86 CPUs that have AVX2 and F16C. They compute exactly what the portable loops compute, bit
 * for bit: the same 16 float lanes (8 for float64) accumulate the same elements in the same
 * order within each block, combined in the same lane order; min/max follow `v < m ? v : m`
 * (which is what MINPS does); the hash is a sum modulo 2^32, so its order is free.
 *
 * Statistics and hash run in ONE loop over each 64 bytes (fastats_fused.h): the kernel is
 * bound by the vector ALU ops it issues (4 a cycle on Zen 3; ~7 per 32 bytes for float32
 * statistics, 13 for the hash), not by memory, so what counts is issuing no op twice and
 * reading each byte once. The AVX-512 versions (fastats_avx512.h, included below) run
 * instead where the CPU has AVX-512. Included by fastats_kernel.h only. */
#if defined(__x86_64__)
#include <immintrin.h>

#define AVX2 __attribute__((target("avx2,f16c")))
#define AVX2_INLINE __attribute__((target("avx2,f16c"), always_inline)) static inline

AVX2_INLINE __m256 load8(const void *x, Py_ssize_t i, int code) {
    if (code == F32) return _mm256_loadu_ps((const float *)x + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)x + i));
    if (code == F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16)); /* bfloat16 */
}

/* Eight lanes of hash_mix (fastats_kernel.h). */
AVX2_INLINE __m256i mix8(__m256i v, __m256i salt) {
    __m256i x = _mm256_xor_si256(v, salt);
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)MIX1));
    x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
    x = _mm256_mullo_epi32(x, _mm256_set1_epi32((int)MIX2));
    return _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
}

/* hash_bytes of fastats_kernel.h ("wsum64-v2") on 16 words at a time, as two independent
 * mixes of 8 (more work in flight); i * GOLD is carried along by addition. Few registers
 * (one sum of each kind), as the fused loops hold 9 more accumulators beside it. */
typedef struct {
    __m256i s0, s1, a, b; /* the salts of the next 8 words and the 8 after; the two sums */
    size_t words;         /* words added so far */
} hasher_t;

AVX2_INLINE void hasher_init(hasher_t *h, uint32_t first) {
    const __m256i lane = _mm256_add_epi32(_mm256_set1_epi32((int)first), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    h->s0 = _mm256_mullo_epi32(lane, _mm256_set1_epi32((int)GOLD));
    h->s1 = _mm256_add_epi32(h->s0, _mm256_set1_epi32((int)(8u * GOLD)));
    h->a = h->b = _mm256_setzero_si256();
    h->words = 0;
}

/* The next 16 words: w0 then w1. */
AVX2_INLINE void hasher_add16(hasher_t *h, __m256i w0, __m256i w1) {
    const __m256i step = _mm256_set1_epi32((int)(16u * GOLD));
    __m256i x0 = mix8(w0, h->s0), x1 = mix8(w1, h->s1);
    h->a = _mm256_add_epi32(h->a, _mm256_xor_si256(x0, h->s0));
    h->b = _mm256_add_epi32(h->b, x0);
    h->a = _mm256_add_epi32(h->a, _mm256_xor_si256(x1, h->s1));
    h->b = _mm256_add_epi32(h->b, x1);
    h->s0 = _mm256_add_epi32(h->s0, step);
    h->s1 = _mm256_add_epi32(h->s1, step);
    h->words += 16;
}

/* The next 8 words (then s1 holds the salts of the 8 after them). */
AVX2_INLINE void hasher_add8(hasher_t *h, __m256i w) {
    __m256i x = mix8(w, h->s0), s = h->s0;
    h->a = _mm256_add_epi32(h->a, _mm256_xor_si256(x, s));
    h->b = _mm256_add_epi32(h->b, x);
    h->s0 = h->s1;
    h->s1 = _mm256_add_epi32(s, _mm256_set1_epi32((int)(16u * GOLD)));
    h->words += 8;
}

/* Adds the lanes to (h1, h2), then the rest of the `nbytes` bytes at p (whose first word is
 * word `first`) a word at a time. */
AVX2_INLINE void hasher_done(const hasher_t *h, const void *p, size_t nbytes, uint32_t first, uint32_t *h1,
                             uint32_t *h2) {
    uint32_t la[8], lb[8], a = 0, b = 0;
    _mm256_storeu_si256((__m256i *)la, h->a);
    _mm256_storeu_si256((__m256i *)lb, h->b);
    for (int l = 0; l < 8; l++) { a += la[l]; b += lb[l]; }
    *h1 += a; *h2 += b;
    size_t done = 4 * h->words;
    hash_bytes((const unsigned char *)p + done, nbytes - done, first + (uint32_t)h->words, h1, h2);
}

/* The hash alone (the dtypes whose statistics are the portable loops). */
AVX2 static void hash_avx2(const void *p, size_t nbytes, uint32_t first, uint32_t *h1, uint32_t *h2) {
    const unsigned char *bytes = (const unsigned char *)p;
    hasher_t h;
    hasher_init(&h, first);
    for (size_t k = 0; k + 64 <= nbytes; k += 64)
        hasher_add16(&h, _mm256_loadu_si256((const __m256i *)(bytes + k)),
                     _mm256_loadu_si256((const __m256i *)(bytes + k + 32)));
    hasher_done(&h, p, nbytes, first, h1, h2);
}

/* NaN and Inf counts of `n` elements (a multiple of 8, at most a block) at x: only for the
 * rare stretch whose sums came out non-finite (one NaN or Inf element makes its lane's
 * running sum NaN or Inf for good), so that the main loops need not count them. */
AVX2 static void count_nonfinite(const void *x, Py_ssize_t n, int code, acc_t *a) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), inf = _mm256_set1_ps(INFINITY);
    const __m256d absmask_d = _mm256_castsi256_pd(_mm256_set1_epi64x(0x7fffffffffffffffLL));
    const __m256d inf_d = _mm256_set1_pd(INFINITY);
    __m256i nn = _mm256_setzero_si256(), ni = nn; /* 32-bit counts; a float64 counts in both halves */
    for (Py_ssize_t i = 0; i < n; i += 8) {
        __m256 un[2], in[2];
        if (code == F64) {
            for (int k = 0; k < 2; k++) {
                __m256d v = _mm256_loadu_pd((const double *)x + i + 4 * k);
                un[k] = _mm256_castpd_ps(_mm256_cmp_pd(v, v, _CMP_UNORD_Q));
                in[k] = _mm256_castpd_ps(_mm256_cmp_pd(_mm256_and_pd(v, absmask_d), inf_d, _CMP_EQ_OQ));
            }
        } else {
            __m256 v = load8(x, i, code);
            un[0] = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
            in[0] = _mm256_cmp_ps(_mm256_and_ps(v, absmask), inf, _CMP_EQ_OQ);
            un[1] = in[1] = _mm256_setzero_ps();
        }
        for (int k = 0; k < 2; k++) {
            nn = _mm256_sub_epi32(nn, _mm256_castps_si256(un[k]));
            ni = _mm256_sub_epi32(ni, _mm256_castps_si256(in[k]));
        }
    }
    uint32_t cn[8], ci[8];
    uint64_t tn = 0, ti = 0;
    _mm256_storeu_si256((__m256i *)cn, nn);
    _mm256_storeu_si256((__m256i *)ci, ni);
    for (int l = 0; l < 8; l++) { tn += cn[l]; ti += ci[l]; }
    a->nan += code == F64 ? tn / 2 : tn;
    a->inf += code == F64 ? ti / 2 : ti;
}

/* Which kernels run: 2 the AVX-512 ones, 1 the AVX2 ones, 0 the portable loops. The tests
 * compare the three: OPSCOPE_SIMD=avx2 stops at AVX2, OPSCOPE_SIMD=portable (or the older
 * OPSCOPE_NO_SIMD=1) runs the portable loops. */
static int simd_level(void) {
    static int known = -1;
    if (known < 0) {
        const char *off = getenv("OPSCOPE_NO_SIMD"), *want = getenv("OPSCOPE_SIMD");
        int level = 0;
        __builtin_cpu_init();
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c"))
            level = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
                    && __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") ? 2 : 1;
        if (want && strcmp(want, "avx2") == 0 && level > 1) level = 1;
        if ((want && strcmp(want, "portable") == 0) || (off && *off && *off != '0')) level = 0;
        known = level;
    }
    return known;
}

static int has_avx2(void) { return simd_level() >= 1; }

#include "fastats_fused.h"
#include "fastats_avx512.h"
#include "fastats_rows.h"

/* Every dtype's hash with AVX2, the float types' statistics fused with it, the 8-bit types'
 * with integer sums (the wider integers' are the portable loops); 0 when the portable code
 * must run. */
static int run_avx2(const void *p, Py_ssize_t n, int code, acc_t *a, uint32_t *h1, uint32_t *h2) {
    if (!has_avx2()) return 0;
    switch (code) {
    case F32: f32_fused((const float *)p, n, a, h1, h2); return 1;
    case F16: f16_fused((const uint16_t *)p, n, a, h1, h2); return 1;
    case BF16: bf16_fused((const uint16_t *)p, n, a, h1, h2); return 1;
    case F64: f64_fused((const double *)p, n, a, h1, h2); return 1;
    case I8: case U8: case BOOL:
        /* sums no longer exact in double: the portable order; without the hash: the portable loop */
        if (n >= ((Py_ssize_t)1 << 36) || !h1) return 0;
        if (code == I8) i8_fused((const uint8_t *)p, n, a, h1, h2);
        else u8_fused((const uint8_t *)p, n, a, h1, h2);
        return 1;
    case I16: s_i16((const int16_t *)p, n, a); break;
    case I32: s_i32((const int32_t *)p, n, a); break;
    case I64: s_i64((const int64_t *)p, n, a); break;
    default: return 0;
    }
    if (h1) hash_avx2(p, (size_t)n * ITEMSIZE[code], 0, h1, h2);
    return 1;
}
/* d = v - c added to s, its square to q (no FMA: the portable loop rounds d*d). */
#define SHIFT_ADD(v, s, q)                                     \
    do {                                                       \
        __m256d d_ = _mm256_sub_pd((v), cv);                   \
        s = _mm256_add_pd(s, d_);                              \
        q = _mm256_add_pd(q, _mm256_mul_pd(d_, d_));           \
    } while (0)

/* shifted_sums (fastats_spread.h) of a float32, float16 or bfloat16 block: the same 16 double
 * lanes (lane l takes elements i + l, the tail lane 0), in four vectors of four (named, not an
 * array: GCC kept an array's sums in memory). */
AVX2 static int shifted_simd(const void *x, Py_ssize_t m, int code, double *shift, double *sd, double *sq) {
    if (!has_avx2() || m < 1) return 0;
    const double c = (double)load_float(x, 0, code);
    const __m256d cv = _mm256_set1_pd(c);
    __m256d s0 = _mm256_setzero_pd(), s1 = s0, s2 = s0, s3 = s0, q0 = s0, q1 = s0, q2 = s0, q3 = s0;
    Py_ssize_t i = 0;
    for (; i + LANES <= m; i += LANES) {
        __m256 v0 = load8(x, i, code), v1 = load8(x, i + 8, code);
        SHIFT_ADD(_mm256_cvtps_pd(_mm256_castps256_ps128(v0)), s0, q0);
        SHIFT_ADD(_mm256_cvtps_pd(_mm256_extractf128_ps(v0, 1)), s1, q1);
        SHIFT_ADD(_mm256_cvtps_pd(_mm256_castps256_ps128(v1)), s2, q2);
        SHIFT_ADD(_mm256_cvtps_pd(_mm256_extractf128_ps(v1, 1)), s3, q3);
    }
    double ls[LANES], lq[LANES];
    _mm256_storeu_pd(ls, s0); _mm256_storeu_pd(ls + 4, s1); _mm256_storeu_pd(ls + 8, s2); _mm256_storeu_pd(ls + 12, s3);
    _mm256_storeu_pd(lq, q0); _mm256_storeu_pd(lq + 4, q1); _mm256_storeu_pd(lq + 8, q2); _mm256_storeu_pd(lq + 12, q3);
    for (; i < m; i++) {
        double d = (double)load_float(x, i, code) - c;
        ls[0] += d; lq[0] += square_d(d);
    }
    for (int l = 0; l < LANES; l++) { *sd += ls[l]; *sq += lq[l]; }
    *shift = c;
    return 1;
}
#undef SHIFT_ADD
#else /* not x86: the portable loops */
static int shifted_simd(const void *x, Py_ssize_t m, int code, double *shift, double *sd, double *sq) {
    (void)x; (void)m; (void)code; (void)shift; (void)sd; (void)sq;
    return 0;
}
static int simd_level(void) { return 0; }
static int run_avx512(const void *p, Py_ssize_t n, int code, acc_t *a, uint32_t *h1, uint32_t *h2) {
    (void)p; (void)n; (void)code; (void)a; (void)h1; (void)h2;
    return 0;
}
static int run_avx2(const void *p, Py_ssize_t n, int code, acc_t *a, uint32_t *h1, uint32_t *h2) {
    (void)p; (void)n; (void)code; (void)a; (void)h1; (void)h2;
    return 0;
}
__attribute__((unused)) static int rows_fit(int code, Py_ssize_t inner) {
    (void)code; (void)inner;
    return 0;
}
__attribute__((unused)) static void run_rows(const void *const *rows, Py_ssize_t inner, Py_ssize_t n, int code,
                                             acc_t *a, void *buf) {
    (void)rows; (void)inner; (void)n; (void)code; (void)a; (void)buf;
}
#endif

/* The kernels that run, by name (what the benchmarks print). */
static const char *simd_name(void) {
    static const char *const NAMES[] = {"portable", "avx2", "avx512"};
    return NAMES[simd_level()];
}
