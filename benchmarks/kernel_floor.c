/* What bounds the statistics kernel (issue 18): float32 loops of the shape the dump runs
 * (fastats_avx512.h), each alone, timed in GB/s of tensor bytes per CPU second. Built and run by
 * bench_kernel_floor.py; x86 with AVX-512 (F, BW, DQ, VL) and VAES only.
 *
 *   read      a plain sum of the bytes: the memory's (or the cache's) own speed
 *   stats     min, max, sum, sum of squares and zeros: the statistics without the hash
 *   hash      the wsum64-v2 content hash alone (docs/format.md)
 *   fused     statistics and wsum64-v2 in one pass: what the dump runs per tensor
 *   mix64     a hash of one 64-bit xorshift-multiply mix per 8 bytes (two vpmullq), alone
 *   fused64   statistics with mix64
 *   aes       a hash of two AES rounds per 16 bytes (vaesenc), alone
 *   fusedaes  statistics with aes
 *
 * mix64 and aes are not opscope's hash: they measure what a cheaper one would buy. */
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,vaes,aes")))
#define GOLD 0x9E3779B9u
#define MIX1 0x7FEB352Du
#define MIX2 0x846CA68Bu

typedef struct { __m512 s, q, mn, mx; __m512i nz; } st_t;

TARGET static inline __m512 keep(__m512 p) { __asm__("" : "+v"(p)); return p; }

TARGET static inline void st_init(st_t *t) {
    t->s = t->q = _mm512_setzero_ps();
    t->mn = _mm512_set1_ps(INFINITY);
    t->mx = _mm512_set1_ps(-INFINITY);
    t->nz = _mm512_setzero_si512();
}

TARGET static inline void st_add(st_t *t, __m512 v) {
    __mmask16 z = _mm512_cmp_ps_mask(v, _mm512_setzero_ps(), _CMP_EQ_OQ);
    t->nz = _mm512_mask_add_epi32(t->nz, z, t->nz, _mm512_set1_epi32(1));
    t->mn = _mm512_min_ps(v, t->mn);
    t->mx = _mm512_max_ps(v, t->mx);
    t->s = _mm512_add_ps(t->s, v);
    t->q = _mm512_add_ps(t->q, keep(_mm512_mul_ps(v, v)));
}

TARGET static inline double st_end(const st_t *t) {
    return _mm512_reduce_add_ps(t->s) + _mm512_reduce_add_ps(t->q) + _mm512_reduce_min_ps(t->mn) +
           _mm512_reduce_max_ps(t->mx) + _mm512_reduce_add_epi32(t->nz);
}

/* wsum64-v2 on 16 words: lowbias32(w ^ s) summed twice (x ^ s and x), s advanced by 16 GOLD. */
TARGET static inline void v2_add(__m512i w, __m512i *s, __m512i *a, __m512i *b) {
    __m512i x = _mm512_xor_si512(w, *s);
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32((int)MIX1));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
    x = _mm512_mullo_epi32(x, _mm512_set1_epi32((int)MIX2));
    x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
    *a = _mm512_add_epi32(*a, _mm512_xor_si512(x, *s));
    *b = _mm512_add_epi32(*b, x);
    *s = _mm512_add_epi32(*s, _mm512_set1_epi32((int)(16u * GOLD)));
}

/* One bijective 64-bit mix per lane of w ^ s, summed. */
TARGET static inline void m64_add(__m512i w, __m512i *s, __m512i *a) {
    __m512i x = _mm512_xor_si512(w, *s);
    x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 30));
    x = _mm512_mullo_epi64(x, _mm512_set1_epi64((long long)0xBF58476D1CE4E5B9ULL));
    x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 27));
    x = _mm512_mullo_epi64(x, _mm512_set1_epi64((long long)0x94D049BB133111EBULL));
    *a = _mm512_add_epi64(*a, _mm512_xor_si512(x, _mm512_srli_epi64(x, 31)));
    *s = _mm512_add_epi64(*s, _mm512_set1_epi64(8));
}

/* Two AES rounds of each 16-byte block of w ^ s, summed. */
TARGET static inline void aes_add(__m512i w, __m512i *s, __m512i *a) {
    __m512i x = _mm512_aesenc_epi128(_mm512_xor_si512(w, *s), _mm512_set1_epi64(0x243F6A8885A308D3LL));
    *a = _mm512_add_epi64(*a, _mm512_aesenc_epi128(x, _mm512_set1_epi64(0x13198A2E03707344LL)));
    *s = _mm512_add_epi64(*s, _mm512_set1_epi64(4));
}

#define LOOP(body) for (size_t i = 0; i < n; i += 16) { __m512 v = _mm512_loadu_ps(p + i); body; }

TARGET static double k_read(const float *p, size_t n) {
    __m512 s = _mm512_setzero_ps();
    LOOP(s = _mm512_add_ps(s, v));
    return _mm512_reduce_add_ps(s);
}

TARGET static double k_stats(const float *p, size_t n) {
    st_t t;
    st_init(&t);
    LOOP(st_add(&t, v));
    return st_end(&t);
}

TARGET static double k_hash(const float *p, size_t n, int stats) {
    st_t t;
    st_init(&t);
    __m512i s = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                   _mm512_set1_epi32((int)GOLD));
    __m512i a = _mm512_setzero_si512(), b = a;
    if (stats) LOOP(st_add(&t, v); v2_add(_mm512_castps_si512(v), &s, &a, &b))
    else LOOP(v2_add(_mm512_castps_si512(v), &s, &a, &b))
    return (stats ? st_end(&t) : 0) + _mm512_reduce_add_epi32(a) + _mm512_reduce_add_epi32(b);
}

TARGET static double k_other(const float *p, size_t n, int stats, int aes) {
    st_t t;
    st_init(&t);
    __m512i s = _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7), a = _mm512_setzero_si512();
    if (aes && stats) LOOP(st_add(&t, v); aes_add(_mm512_castps_si512(v), &s, &a))
    else if (aes) LOOP(aes_add(_mm512_castps_si512(v), &s, &a))
    else if (stats) LOOP(st_add(&t, v); m64_add(_mm512_castps_si512(v), &s, &a))
    else LOOP(m64_add(_mm512_castps_si512(v), &s, &a))
    return (stats ? st_end(&t) : 0) + (double)_mm512_reduce_add_epi64(a);
}

static double run(int which, const float *p, size_t n) {
    switch (which) {
    case 0: return k_read(p, n);
    case 1: return k_stats(p, n);
    case 2: return k_hash(p, n, 0);
    case 3: return k_hash(p, n, 1);
    case 4: return k_other(p, n, 0, 0);
    case 5: return k_other(p, n, 1, 0);
    case 6: return k_other(p, n, 0, 1);
    default: return k_other(p, n, 1, 1);
    }
}

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* kernel_floor KB REPEAT: per loop, the median over REPEAT timed runs of ~0.1 CPU second each. */
int main(int argc, char **argv) {
    static const char *names[] = {"read", "stats", "hash", "fused", "mix64", "fused64", "aes", "fusedaes"};
    size_t kb = argc > 1 ? strtoul(argv[1], NULL, 10) : 256, n = kb * 256;
    int repeat = argc > 2 ? atoi(argv[2]) : 5;
    if (!__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512dq") || !__builtin_cpu_supports("vaes")) {
        puts("unsupported");
        return 0;
    }
    float *p = aligned_alloc(64, n * 4);
    for (size_t i = 0; i < n; i++) p[i] = (float)((int)(i * 2654435761u % 2001u) - 1000) / 997.0f;
    int iters = (int)(0.1 * 20e9 / (double)(n * 4)) + 1;
    for (int w = 0; w < 8; w++) {
        double best[64], x = 0;
        for (int r = 0; r < repeat && r < 64; r++) {
            double t = cpu_seconds();
            for (int k = 0; k < iters; k++) x += run(w, p, n);
            best[r] = (double)iters * (double)(n * 4) / (cpu_seconds() - t) / 1e9;
        }
        for (int i = 1; i < repeat; i++)  /* insertion sort: the median */
            for (int j = i; j > 0 && best[j] < best[j - 1]; j--) { double b = best[j]; best[j] = best[j - 1]; best[j - 1] = b; }
        printf("%s %.1f %s\n", names[w], best[repeat / 2], x == 12345.678 ? "!" : "");
    }
    free(p);
    return 0;
}
