/* The one-pass statistics kernel of opscope (see fastats.c for the definitions): the dtype
 * loops, the wsum64-v1 hash, the AVX2 versions and the final tuple. Included by fastats.c
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

static inline float bf16_to_f32(uint16_t b) {
    uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            u = sign | (exp << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

#define LANES 16
#define BLOCK 4096
#define GOLD 0x9E3779B9u
#define MIX 0x85EBCA6Bu
#define CLONES __attribute__((target_clones("avx2", "default")))

/* Hash "wsum64-v1" over the 32-bit words (or narrower elements) w_i of a tensor:
 *   h1 = sum w_i * (2i+1) mod 2^32,  h2 = sum (w_i ^ (i * GOLD)) * MIX mod 2^32,
 *   hash = h1 << 32 | h2.
 * 64-bit elements are hashed as two little-endian 32-bit words. */
#define HASH_WORDS(NAME, T)                                                                 \
    static void NAME(const T *w, Py_ssize_t n, uint32_t *h1, uint32_t *h2) CLONES;          \
    static void NAME(const T *w, Py_ssize_t n, uint32_t *h1, uint32_t *h2) {                \
        uint32_t a = 0, b = 0;                                                              \
        for (Py_ssize_t i = 0; i < n; i++) {                                                \
            uint32_t idx = (uint32_t)i, v = w[i];                                           \
            a += v * (2u * idx + 1u);                                                       \
            b += (v ^ (idx * GOLD)) * MIX;                                                  \
        }                                                                                   \
        *h1 += a; *h2 += b;                                                                 \
    }

HASH_WORDS(hash_words32, uint32_t)
HASH_WORDS(hash_words16, uint16_t)
HASH_WORDS(hash_words8, uint8_t)

/* Statistics of float-like data, converted to float32 by LOAD, in blocks: float lanes
 * inside a block (vectorised), double across blocks (accurate for long tensors). */
#define FLOAT_STATS(NAME, CTYPE, LOAD)                                                      \
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
            for (int l = 0; l < LANES; l++) {                                               \
                a->sum += s[l]; a->sumsq += q[l]; a->nan += nn[l]; a->inf += ni[l];         \
                a->zeros += nz[l];                                                          \
                if (mn[l] < a->mn) a->mn = mn[l];                                           \
                if (mx[l] > a->mx) a->mx = mx[l];                                           \
            }                                                                               \
        }                                                                                   \
    }

#define ID(v) (v)
FLOAT_STATS(s_f32, float, ID)
FLOAT_STATS(s_f16, uint16_t, f16_to_f32)
FLOAT_STATS(s_bf16, uint16_t, bf16_to_f32)

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

#define INT_STATS(NAME, CTYPE)                                                              \
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
    if (run_avx2(p, n, code, a, &h1, &h2)) {
        a->hash = ((uint64_t)h1 << 32) | h2;
        return;
    }
    switch (code) {
    case F32: s_f32((const float *)p, n, a); hash_words32((const uint32_t *)p, n, &h1, &h2); break;
    case F64: s_f64((const double *)p, n, a); hash_words32((const uint32_t *)p, 2 * n, &h1, &h2); break;
    case F16: s_f16((const uint16_t *)p, n, a); hash_words16((const uint16_t *)p, n, &h1, &h2); break;
    case BF16: s_bf16((const uint16_t *)p, n, a); hash_words16((const uint16_t *)p, n, &h1, &h2); break;
    case I8: s_i8((const int8_t *)p, n, a); hash_words8((const uint8_t *)p, n, &h1, &h2); break;
    case U8: case BOOL: s_u8((const uint8_t *)p, n, a); hash_words8((const uint8_t *)p, n, &h1, &h2); break;
    case I16: s_i16((const int16_t *)p, n, a); hash_words16((const uint16_t *)p, n, &h1, &h2); break;
    case I32: s_i32((const int32_t *)p, n, a); hash_words32((const uint32_t *)p, n, &h1, &h2); break;
    case I64: s_i64((const int64_t *)p, n, a); hash_words32((const uint32_t *)p, 2 * n, &h1, &h2); break;
    }
    a->hash = ((uint64_t)h1 << 32) | h2;
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
