/* The one-pass statistics kernel of opscope (see fastats.c for the definitions): the dtype
 * loops, the wsum64-v2 hash, the AVX2 and AVX-512 versions and the final tuple. Included by fastats.c
 * (the Python module with its worker thread) and by the native dump observer (C++). */
#ifndef OPSCOPE_FASTATS_KERNEL_H
#define OPSCOPE_FASTATS_KERNEL_H
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { F32 = 0, F64 = 1, F16 = 2, BF16 = 3, I8 = 4, U8 = 5, I16 = 6, I32 = 7, I64 = 8, BOOL = 9 };

typedef struct {
    double mn, mx, sum, sumsq;
    uint64_t nan, inf, zeros, hash;
    double cnt, ref, d1, d2; /* the elements merged so far, their deviations from ref and squares (fastats_spread.h) */
} acc_t;

/* An empty accumulator: no element seen (min +inf, max -inf, every sum and count 0). */
static inline void acc_init(acc_t *a) {
    memset(a, 0, sizeof *a);
    a->mn = INFINITY;
    a->mx = -INFINITY;
}

#include "opscope_half.h" /* bf16_to_f32, f16_to_f32 (src/opscope/_c, on the include path) */

#define LANES 16
#define BLOCK 4096
#define GOLD 0x9E3779B9u
#define MIX1 0x7FEB352Du
#define MIX2 0x846CA68Bu
#define CLONES __attribute__((target_clones("avx2", "default")))

/* Bytes per element of each dtype code. */
static const size_t ITEMSIZE[] = {4, 8, 2, 2, 1, 1, 2, 4, 8, 1};

/* Hash "wsum64-v2" (docs/format.md). The tensor's bytes (row-major, little-endian elements)
 * are read as little-endian 32-bit words w_i, the last one zero-padded; with i taken mod 2^32
 * and s_i = i * GOLD:
 *   x_i = lowbias32(w_i ^ s_i)   (x ^= x >> 16; x *= MIX1; x ^= x >> 15; x *= MIX2; x ^= x >> 16)
 *   h1 = sum (x_i ^ s_i) mod 2^32,  h2 = sum x_i mod 2^32,  hash = h1 << 32 | h2.
 * A sum of terms that each depend on (i, w_i) only, so blocks combine by addition. v1 had
 * no mix: its terms were linear in w_i, and one-hot masks whose ones swapped places
 * collided. x_i is a bijection of w_i, so any single changed word changes both halves. */
static inline uint32_t hash_mix(uint32_t w, uint32_t salt) {
    uint32_t x = w ^ salt;
    x ^= x >> 16;
    x *= MIX1;
    x ^= x >> 15;
    x *= MIX2;
    x ^= x >> 16;
    return x;
}

/* Adds the terms of the words of `nbytes` bytes at p, the first being word `first`. */
static void hash_bytes(const void *p, size_t nbytes, uint32_t first, uint32_t *h1, uint32_t *h2) CLONES;
static void hash_bytes(const void *p, size_t nbytes, uint32_t first, uint32_t *h1, uint32_t *h2) {
    const unsigned char *bytes = (const unsigned char *)p;
    size_t n = nbytes / 4;
    uint32_t a = 0, b = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t w, salt = (first + (uint32_t)i) * GOLD;
        memcpy(&w, bytes + 4 * i, 4); /* a little-endian host, as everywhere in the dump */
        uint32_t x = hash_mix(w, salt);
        a += x ^ salt;
        b += x;
    }
    if (nbytes % 4) {
        uint32_t w = 0, salt = (first + (uint32_t)n) * GOLD;
        memcpy(&w, bytes + 4 * n, nbytes % 4);
        uint32_t x = hash_mix(w, salt);
        a += x ^ salt;
        b += x;
    }
    *h1 += a; *h2 += b;
}

/* Element i of float32, float16 or bfloat16 data, as a float. */
static inline float load_float(const void *x, Py_ssize_t i, int code) {
    if (code == F32) return ((const float *)x)[i];
    uint16_t h = ((const uint16_t *)x)[i];
    return code == F16 ? f16_to_f32(h) : bf16_to_f32(h);
}

/* No FMA may fold a product into the sum that follows (GCC contracts across statements in
 * C++ by default; clang only within one expression, so separate statements suffice there). */
#if defined(__GNUC__) && !defined(__clang__)
#define NO_CONTRACT __attribute__((optimize("fp-contract=off")))
#else
#define NO_CONTRACT
#endif

/* 16 double lanes (lane l takes elements i + l, the tail lane 0) of X(i) - c and its square
 * over m elements, X(i) being element i as a double. */
#define DOUBLE_LANES(X)                                                                     \
    do {                                                                                    \
        Py_ssize_t i = 0;                                                                   \
        for (; i + LANES <= m; i += LANES)                                                  \
            for (int l = 0; l < LANES; l++) {                                               \
                double d = X(i + l) - c, sq = d * d;                                        \
                s[l] += d; q[l] += sq;                                                      \
            }                                                                               \
        for (; i < m; i++) {                                                                \
            double d = X(i) - c, sq = d * d;                                                \
            s[0] += d; q[0] += sq;                                                          \
        }                                                                                   \
    } while (0)

/* The sums of m elements of dtype `code` at x less c, and of their squares, in 16 double lanes
 * added to *sum and *sumsq in lane order. With c = 0: the sums of a block whose float32 lanes
 * overflowed with no NaN or Inf among them (values beyond ~1.8e19 square past float32's
 * range, and attention masks are filled with the dtype's lowest value, -3.4e38); with c an
 * element: the second pass of the spread (fastats_spread.h). Every loop of every dtype calls
 * this one function, so all paths agree bit for bit. */
static void lane_sums_f64(const void *x, Py_ssize_t m, int code, double c, double *sum, double *sumsq)
    CLONES NO_CONTRACT;
static void lane_sums_f64(const void *x, Py_ssize_t m, int code, double c, double *sum, double *sumsq) {
    double s[LANES] = {0}, q[LANES] = {0};
    const float *f = (const float *)x;
    const uint16_t *h = (const uint16_t *)x;
#define AT_F32(i) ((double)f[i])
#define AT_F16(i) ((double)f16_to_f32(h[i]))
#define AT_BF16(i) ((double)bf16_to_f32(h[i]))
#define AT_F64(i) (((const double *)x)[i])
#define AT_I8(i) ((double)((const int8_t *)x)[i])
#define AT_U8(i) ((double)((const uint8_t *)x)[i])
#define AT_I16(i) ((double)((const int16_t *)x)[i])
#define AT_I32(i) ((double)((const int32_t *)x)[i])
#define AT_I64(i) ((double)((const int64_t *)x)[i])
    switch (code) {
    case F32: DOUBLE_LANES(AT_F32); break;
    case F16: DOUBLE_LANES(AT_F16); break;
    case BF16: DOUBLE_LANES(AT_BF16); break;
    case F64: DOUBLE_LANES(AT_F64); break;
    case I8: DOUBLE_LANES(AT_I8); break;
    case I16: DOUBLE_LANES(AT_I16); break;
    case I32: DOUBLE_LANES(AT_I32); break;
    case I64: DOUBLE_LANES(AT_I64); break;
    default: DOUBLE_LANES(AT_U8); break; /* U8, BOOL */
    }
#undef AT_F32
#undef AT_F16
#undef AT_BF16
#undef AT_F64
#undef AT_I8
#undef AT_U8
#undef AT_I16
#undef AT_I32
#undef AT_I64
    for (int l = 0; l < LANES; l++) { *sum += s[l]; *sumsq += q[l]; }
}

/* Element i of any dtype's data as a double. */
static inline double load_double(const void *x, Py_ssize_t i, int code) {
    switch (code) {
    case F32: case F16: case BF16: return (double)load_float(x, i, code);
    case F64: return ((const double *)x)[i];
    case I8: return (double)((const int8_t *)x)[i];
    case I16: return (double)((const int16_t *)x)[i];
    case I32: return (double)((const int32_t *)x)[i];
    case I64: return (double)((const int64_t *)x)[i];
    default: return (double)((const uint8_t *)x)[i];
    }
}

#include "fastats_spread.h"

/* 16 float lanes summed in double, pairwise (a short chain of dependent adds). */
static inline double sum16(const float *v) {
    double t[8];
    for (int k = 0; k < 8; k++) t[k] = (double)v[k] + (double)v[k + 8];
    for (int k = 0; k < 4; k++) t[k] += t[k + 4];
    return (t[0] + t[2]) + (t[1] + t[3]);
}

/* A block's float lanes (their sums: sum16) added to a's sums. Where the lanes came out
 * non-finite and the block has no NaN or Inf element (`clean`), they overflowed: the block is
 * summed again in double instead (lane_sums_f64). Then the block's spread is merged into a's
 * (spread_block). */
static inline void add_lanes(acc_t *a, const float *s, const float *q, int clean, const void *xb, Py_ssize_t m,
                             int code) {
    double bs = sum16(s), bq = sum16(q);
    if (clean && !(isfinite(bs) && isfinite(bq))) {
        bs = bq = 0;
        lane_sums_f64(xb, m, code, 0.0, &bs, &bq);
    }
    a->sum += bs;
    a->sumsq += bq;
    spread_block(xb, m, code, bs, bq, clean, a);
}

/* Statistics of float-like data, converted to float32 by LOAD, in blocks: float lanes
 * inside a block (vectorised), double across blocks (accurate for long tensors); a block
 * whose lanes overflowed without a NaN or Inf in it is summed in double (add_lanes). */
#define FLOAT_STATS(NAME, CTYPE, LOAD, CODE)                                                \
    static void NAME(const CTYPE *x, Py_ssize_t n, acc_t *a) CLONES;                        \
    static void NAME(const CTYPE *x, Py_ssize_t n, acc_t *a) {                              \
        for (Py_ssize_t b0 = 0; b0 < n; b0 += BLOCK) {                                      \
            Py_ssize_t m = n - b0 < BLOCK ? n - b0 : BLOCK, i = 0;                          \
            float s[LANES] = {0}, q[LANES] = {0}, mn[LANES], mx[LANES];                     \
            uint32_t nn[LANES] = {0}, ni[LANES] = {0}, nz[LANES] = {0};                     \
            for (int l = 0; l < LANES; l++) { mn[l] = INFINITY; mx[l] = -INFINITY; }        \
            const CTYPE *xb = x + b0;                                                       \
            for (; i + LANES <= m; i += LANES) {                                            \
                for (int l = 0; l < LANES; l++) {                                           \
                    float v = LOAD(xb[i + l]);                                              \
                    nn[l] += v != v; ni[l] += fabsf(v) == INFINITY; nz[l] += v == 0.0f;     \
                    mn[l] = v < mn[l] ? v : mn[l]; mx[l] = v > mx[l] ? v : mx[l];           \
                    s[l] += v; q[l] += v * v;                                               \
                }                                                                           \
            }                                                                               \
            for (; i < m; i++) {                                                            \
                float v = LOAD(xb[i]);                                                      \
                nn[0] += v != v; ni[0] += fabsf(v) == INFINITY; nz[0] += v == 0.0f;         \
                mn[0] = v < mn[0] ? v : mn[0]; mx[0] = v > mx[0] ? v : mx[0];               \
                s[0] += v; q[0] += v * v;                                                   \
            }                                                                               \
            uint64_t bad = a->nan + a->inf;                                                 \
            for (int l = 0; l < LANES; l++) {                                               \
                a->nan += nn[l]; a->inf += ni[l];                                           \
                a->zeros += nz[l];                                                          \
                if (mn[l] < a->mn) a->mn = mn[l];                                           \
                if (mx[l] > a->mx) a->mx = mx[l];                                           \
            }                                                                               \
            add_lanes(a, s, q, a->nan + a->inf == bad, xb, m, CODE);                         \
        }                                                                                   \
    }

#define ID(v) (v)
FLOAT_STATS(s_f32, float, ID, F32)
FLOAT_STATS(s_f16, uint16_t, f16_to_f32, F16)
FLOAT_STATS(s_bf16, uint16_t, bf16_to_f32, BF16)

static void s_f64(const double *x, Py_ssize_t n, acc_t *a) CLONES;
static void s_f64(const double *x, Py_ssize_t n, acc_t *a) {
    double s[8] = {0}, q[8] = {0}, mn[8], mx[8];
    uint64_t nn[8] = {0}, ni[8] = {0}, nz[8] = {0};
    for (int l = 0; l < 8; l++) { mn[l] = INFINITY; mx[l] = -INFINITY; }
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) {
            double v = x[i + l];
            nn[l] += v != v; ni[l] += fabs(v) == INFINITY; nz[l] += v == 0.0;
            mn[l] = v < mn[l] ? v : mn[l]; mx[l] = v > mx[l] ? v : mx[l];
            s[l] += v; q[l] += v * v;
        }
    for (; i < n; i++) {
        double v = x[i];
        nn[0] += v != v; ni[0] += fabs(v) == INFINITY; nz[0] += v == 0.0;
        mn[0] = v < mn[0] ? v : mn[0]; mx[0] = v > mx[0] ? v : mx[0];
        s[0] += v; q[0] += v * v;
    }
    for (int l = 0; l < 8; l++) {
        a->sum += s[l]; a->sumsq += q[l]; a->nan += nn[l]; a->inf += ni[l]; a->zeros += nz[l];
        if (mn[l] < a->mn) a->mn = mn[l];
        if (mx[l] > a->mx) a->mx = mx[l];
    }
}

/* CLONES here too: one copy of each loop that every path calls (copies inlined into each
 * path ran 10-15% apart on Zen 5, by their place in the code, it seems). */
#define INT_STATS(NAME, CTYPE)                                                              \
    static void NAME(const CTYPE *x, Py_ssize_t n, acc_t *a) CLONES;                        \
    static void NAME(const CTYPE *x, Py_ssize_t n, acc_t *a) {                              \
        double s = 0, q = 0, mn = INFINITY, mx = -INFINITY;                                 \
        uint64_t nz = 0;                                                                    \
        for (Py_ssize_t i = 0; i < n; i++) {                                                \
            double v = (double)x[i];                                                        \
            nz += (x[i] == 0);                                                              \
            mn = v < mn ? v : mn; mx = v > mx ? v : mx;                                     \
            s += v; q += v * v;                                                             \
        }                                                                                   \
        a->mn = mn; a->mx = mx; a->sum = s; a->sumsq = q; a->zeros = nz;                    \
    }

INT_STATS(s_i8, int8_t)
INT_STATS(s_u8, uint8_t)
INT_STATS(s_i16, int16_t)
INT_STATS(s_i32, int32_t)
INT_STATS(s_i64, int64_t)

#include "fastats_avx2.h"

/* The statistics of the n elements of dtype `code` at p into `a`, and with `hash` their hash
 * (else a->hash 0: run_transposed hashes them in another order). */
static void run_stats(const void *p, Py_ssize_t n, int code, acc_t *a, int hash) {
    uint32_t h1 = 0, h2 = 0, *p1 = hash ? &h1 : NULL, *p2 = hash ? &h2 : NULL;
    if (!run_avx512(p, n, code, a, p1, p2) && !run_avx2(p, n, code, a, p1, p2)) {
        switch (code) {
        case F32: s_f32((const float *)p, n, a); break;
        case F64: s_f64((const double *)p, n, a); break;
        case F16: s_f16((const uint16_t *)p, n, a); break;
        case BF16: s_bf16((const uint16_t *)p, n, a); break;
        case I8: s_i8((const int8_t *)p, n, a); break;
        case U8: case BOOL: s_u8((const uint8_t *)p, n, a); break;
        case I16: s_i16((const int16_t *)p, n, a); break;
        case I32: s_i32((const int32_t *)p, n, a); break;
        case I64: s_i64((const int64_t *)p, n, a); break;
        }
        if (hash) hash_bytes(p, (size_t)n * ITEMSIZE[code], 0, &h1, &h2);
    }
    a->hash = ((uint64_t)h1 << 32) | h2;
    if (a->cnt != (double)n) spread_whole(p, n, code, a); /* not blocked: float64, the integers */
}

static void run(const void *p, Py_ssize_t n, int code, acc_t *a) { run_stats(p, n, code, a, 1); }

#include "fastats_transposed.h"

/* Array i's statistics into column slots i of `out` (10 rows of m: min, max, mean, std, norm,
 * absmax, then the uint64 bits of the NaN, Inf and zero counts and the hash), the arithmetic of
 * finish(). An empty array's slots hold zeros (its statistics are mostly None: the caller marks
 * them). Used by fastats.c's stats_many and by the TensorFlow OpscopeStats op. */
static inline void finish_column(const acc_t *a, Py_ssize_t n, double *out, Py_ssize_t m, Py_ssize_t i) {
    uint64_t *counts = (uint64_t *)(out + 6 * m);
    counts[i] = a->nan;
    counts[m + i] = a->inf;
    counts[2 * m + i] = a->zeros;
    counts[3 * m + i] = a->hash;
    if (n == 0) {
        for (int k = 0; k < 6; k++) out[k * m + i] = 0.0;
        return;
    }
    double mn = a->mn, mx = a->mx, mean = a->sum / n, std = acc_std(a, n), norm = sqrt(a->sumsq);
    if (a->nan) mn = mx = mean = norm = NAN;
    double absmax = a->nan ? NAN : (fabs(mn) > fabs(mx) ? fabs(mn) : fabs(mx));
    out[i] = mn; out[m + i] = mx; out[2 * m + i] = mean; out[3 * m + i] = std;
    out[4 * m + i] = norm; out[5 * m + i] = absmax;
}

/* Final statistics tuple (min, max, mean, std, norm, absmax, nan, inf, zeros, hash),
 * as opscope stores it: NaN propagates as in torch, std is the population std. */
static PyObject *finish(const acc_t *a, Py_ssize_t n) {
    if (n == 0)
        return Py_BuildValue("OOOOdOKKKK", Py_None, Py_None, Py_None, Py_None, 0.0, Py_None, 0ULL, 0ULL, 0ULL,
                             (unsigned long long)a->hash);
    double mn = a->mn, mx = a->mx, mean = a->sum / n, std = acc_std(a, n), norm = sqrt(a->sumsq);
    if (a->nan) mn = mx = mean = norm = NAN;
    double absmax = a->nan ? NAN : (fabs(mn) > fabs(mx) ? fabs(mn) : fabs(mx));
    return Py_BuildValue("ddddddKKKK", mn, mx, mean, std, norm, absmax, (unsigned long long)a->nan,
                         (unsigned long long)a->inf, (unsigned long long)a->zeros, (unsigned long long)a->hash);
}

#endif
