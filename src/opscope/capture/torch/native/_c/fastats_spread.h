/* The spread (std) of the statistics kernel: each block's squared deviations from its mean,
 * merged across blocks in double around the first block's mean (merge_spread). Included by
 * fastats_kernel.h after acc_t and the element loaders.
 *
 * Why not sumsq / n - mean^2: the squares are summed in float32 lanes, whose rounding (~2^-20
 * of the sum) is all that is left of that difference when the data sit far from zero against
 * their spread: a float32 loss of 4.4575 had std 0.00061 instead of 0, randn + 1000 had 1.0063
 * instead of 1.0021. A block whose sums leave less than SPREAD_MIN of its sum of squares to
 * its deviations is read a second time, in double lanes, around its first element c: each
 * v - c is exact in double, a constant block's are all 0, and as c is one of the block's
 * values the squares around it sum to at most m + 1 times the deviations' (at most 12 bits of
 * double's 53 lost). Other blocks take their deviations from their sums: q - s^2/m, whose
 * rounding (~2^-20 of q, 2^-16 in the worst case) is at most 1/SPREAD_MIN times the
 * deviations' own share: ~3e-5 of the std at the threshold (5e-4 at worst), ~5e-7 where the
 * mean is small against the spread (compare allows 1e-3: metrics.STD_RESOLUTION). Tensors read
 * without blocks (float64, the integers) do the same over the whole tensor (log2(n + 1) bits
 * lost at most); integers whose sums are exact take theirs exactly, in 128-bit integers. */
#ifndef OPSCOPE_FASTATS_SPREAD_H
#define OPSCOPE_FASTATS_SPREAD_H

#define SPREAD_MIN (1.0 / 64)

/* Element 0 of m (m > 0) elements of dtype `code` at x as *shift, and the sums of each
 * element's difference from it (*sd) and of their squares (*sq), in double. */
static void shifted_sums(const void *x, Py_ssize_t m, int code, double *shift, double *sd, double *sq) {
    *shift = load_double(x, 0, code);
    lane_sums_f64(x, m, code, *shift, sd, sq);
}

/* m elements of mean `mb` whose squared deviations from it sum to m2b, merged into a's sums
 * of deviations (d1) and squared deviations (d2) from a reference: the first block's mean.
 * Their squares around it sum to at most (blocks) times their spread (a block's mean far from
 * the others' is spread itself), so at most log2(blocks) bits of double's 53 are lost. A
 * constant tensor's blocks have its value for mean and 0 for spread: exactly 0 for both sums. */
static inline void merge_spread(acc_t *a, double m, double mb, double m2b) NO_CONTRACT;
static inline void merge_spread(acc_t *a, double m, double mb, double m2b) {
    if (a->cnt == 0) a->ref = mb;
    double dk = mb - a->ref, md = m * dk, sq = md * dk; /* one product a statement: no FMA (NO_CONTRACT) */
    a->d1 += md;
    a->d2 += m2b + sq;
    a->cnt += m;
}

/* The squared deviations of a's elements from their mean. */
static inline double acc_m2(const acc_t *a) NO_CONTRACT;
static inline double acc_m2(const acc_t *a) {
    if (!(a->cnt > 0)) return 0.0;
    double between = a->d1 * a->d1 / a->cnt;
    return a->d2 - between;
}

/* shifted_sums of float32, float16 or bfloat16 data with AVX2 (fastats_avx2.h), the same bits;
 * 0 where it cannot run. */
static int shifted_simd(const void *x, Py_ssize_t m, int code, double *shift, double *sd, double *sq);

/* The mean and squared deviations of m elements at x from a second pass, in double around
 * element 0 (the data far from zero against their spread: spread_block). */
__attribute__((noinline, cold)) static void spread_again(const void *x, Py_ssize_t m, int code, double *mb,
                                                     double *m2b) NO_CONTRACT;
__attribute__((noinline, cold)) static void spread_again(const void *x, Py_ssize_t m, int code, double *mb,
                                                     double *m2b) {
    double c = 0, sd = 0, sq = 0;
    if (!((code == F32 || code == F16 || code == BF16) && shifted_simd(x, m, code, &c, &sd, &sq)))
        shifted_sums(x, m, code, &c, &sd, &sq);
    double between = sd * sd / m;
    *mb = c + sd / m;
    *m2b = sq - between;
    if (*m2b < 0) *m2b = 0;
}

/* The spread of m elements at x whose sum is s and sum of squares q, merged into a: from
 * those sums, or where they leave too little (the data far from zero against their spread)
 * from a second pass (spread_again). `clean`: no NaN or Inf among them (else the std is NaN
 * whatever is merged). Not inlined into the SIMD loops, whose targets have FMA: the same
 * arithmetic, so the same bits, on every path. */
__attribute__((noinline)) static void spread_block(const void *x, Py_ssize_t m, int code, double s, double q,
                                                   int clean, acc_t *a) NO_CONTRACT;
__attribute__((noinline)) static void spread_block(const void *x, Py_ssize_t m, int code, double s, double q,
                                                   int clean, acc_t *a) {
    double mb = s * (m == BLOCK ? 1.0 / BLOCK : 1.0 / m), sm = s * mb, m2b = q - sm;
    if (clean && isfinite(q) && !(m2b >= q * SPREAD_MIN)) spread_again(x, m, code, &mb, &m2b);
    merge_spread(a, (double)m, mb, m2b);
}

/* The spread of a whole tensor of n elements whose loop kept no blocks (float64, the
 * integers): integers whose sums are exact take their squared deviations exactly, as
 * (n q - s^2) / n in 128-bit integers; others as spread_block does. */
static void spread_whole(const void *x, Py_ssize_t n, int code, acc_t *a) {
    a->cnt = a->ref = a->d1 = a->d2 = 0;
#ifdef __SIZEOF_INT128__
    if (code >= I8 && fabs(a->sum) < 9007199254740992.0 && a->sumsq < 9007199254740992.0) {
        __int128 s = (__int128)(int64_t)a->sum, q = (__int128)(int64_t)a->sumsq;
        merge_spread(a, (double)n, a->sum / n, (double)((__int128)n * q - s * s) / (double)n);
        return;
    }
#endif
    spread_block(x, n, code, a->sum, a->sumsq, a->nan + a->inf == 0, a);
}

/* The population std of a's n elements: NaN where they hold a NaN or their squares overflow. */
static inline double acc_std(const acc_t *a, Py_ssize_t n) {
    double var = acc_m2(a) / n;
    if (a->nan || !isfinite(a->sumsq)) return NAN;
    return var > 0 ? sqrt(var) : (var == var ? 0.0 : NAN);
}

#endif
