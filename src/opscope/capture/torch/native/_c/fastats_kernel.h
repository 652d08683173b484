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
} acc_t;

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

/* 16 double lanes (lane l takes elements i + l, the tail lane 0) over m elements, X(i) being
 * element i as a float. */
#define DOUBLE_LANES(X)                                                                     \
    do {                                                                                    \
        Py_ssize_t i = 0;                                                                   \
        for (; i + LANES <= m; i += LANES)                                                  \
            for (int l = 0; l < LANES; l++) {                                               \
                double v = X(i + l), sq = v * v;                                            \
                s[l] += v; q[l] += sq;                                                      \
            }                                                                               \
        for (; i < m; i++) {                                                                \
            double v = X(i), sq = v * v;                                                    \
            s[0] += v; q[0] += sq;                                                          \
        }                                                                                   \
    } while (0)

/* The sums of a block of m elements whose float32 lanes overflowed with no NaN or Inf among
 * them: values beyond ~1.8e19 square past float32's range, and attention masks are filled
 * with the dtype's lowest value (-3.4e38). The same 16 lanes in double, added to *sum and
 * *sumsq in lane order. Every loop of every dtype calls this one function, so all paths agree
 * bit for bit. */
static void block_sums_f64(const void *xb, Py_ssize_t m, int code, double *sum, double *sumsq) CLONES NO_CONTRACT;
static void block_sums_f64(const void *xb, Py_ssize_t m, int code, double *sum, double *sumsq) {
    double s[LANES] = {0}, q[LANES] = {0};
    const float *f = (const float *)xb;
    const uint16_t *h = (const uint16_t *)xb;
#define F32_AT(i) ((double)f[i])
#define F16_AT(i) ((double)f16_to_f32(h[i]))
#define BF16_AT(i) ((double)bf16_to_f32(h[i]))
    if (code == F32) DOUBLE_LANES(F32_AT);
    else if (code == F16) DOUBLE_LANES(F16_AT);
    else DOUBLE_LANES(BF16_AT);
#undef F32_AT
#undef F16_AT
#undef BF16_AT
    for (int l = 0; l < LANES; l++) { *sum += s[l]; *sumsq += q[l]; }
}

/* A block's float lanes added to a's sums in lane order. Where that makes the sums non-finite
 * and the block has no NaN or Inf element (`clean`), the lanes overflowed: the block is summed
 * again in double instead (block_sums_f64). Checked on the running sums, two tests a block. */
static inline void add_lanes(acc_t *a, const float *s, const float *q, int clean, const void *xb, Py_ssize_t m,
                             int code) {
    double sum0 = a->sum, sumsq0 = a->sumsq;
    for (int l = 0; l < LANES; l++) { a->sum += s[l]; a->sumsq += q[l]; }
    if (clean && !(isfinite(a->sum) && isfinite(a->sumsq)) && isfinite(sum0) && isfinite(sumsq0)) {
        a->sum = sum0; a->sumsq = sumsq0;
        block_sums_f64(xb, m, code, &a->sum, &a->sumsq);
    }
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

static void run(const void *p, Py_ssize_t n, int code, acc_t *a) {
    uint32_t h1 = 0, h2 = 0;
    if (!run_avx512(p, n, code, a, &h1, &h2) && !run_avx2(p, n, code, a, &h1, &h2)) {
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
        hash_bytes(p, (size_t)n * ITEMSIZE[code], 0, &h1, &h2);
    }
    a->hash = ((uint64_t)h1 << 32) | h2;
}

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
    double mn = a->mn, mx = a->mx, mean = a->sum / n, var = a->sumsq / n - mean * mean;
    double std = var > 0 ? sqrt(var) : (var == var ? 0.0 : NAN), norm = sqrt(a->sumsq);
    if (a->nan) mn = mx = mean = std = norm = NAN;
    if (!isfinite(a->sumsq)) std = NAN;
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
    double mn = a->mn, mx = a->mx, mean = a->sum / n, var = a->sumsq / n - mean * mean;
    double std = var > 0 ? sqrt(var) : (var == var ? 0.0 : NAN), norm = sqrt(a->sumsq);
    if (a->nan) mn = mx = mean = std = norm = NAN;
    if (!isfinite(a->sumsq)) std = NAN;
    double absmax = a->nan ? NAN : (fabs(mn) > fabs(mx) ? fabs(mn) : fabs(mx));
    return Py_BuildValue("ddddddKKKK", mn, mx, mean, std, norm, absmax, (unsigned long long)a->nan,
                         (unsigned long long)a->inf, (unsigned long long)a->zeros, (unsigned long long)a->hash);
}

#endif
