/* The sums of one block of a tensor pair, in one pass (opscope.compare.kernel).
 *
 * sums(a, a_code, b, b_code, n, rel_floor, rtol) reads n elements at addresses a and b
 * (float32, float64, bfloat16 or float16 each), widens them to double and returns
 * (sum_sq_diff, sum_abs_diff, max_abs, dot, sum_sq_target, sum_sq_reference, max_rel,
 *  sum_rel, sum_sq_elem_rel, out_of_tolerance): what numpy's chunked pass in
 * opscope.compare.metrics computes with about fifteen passes over each chunk. It assumes
 * finite elements; a block holding NaN or Inf makes its sums NaN or Inf and the caller
 * measures it again on the masked path. The GIL is released while it runs.
 *
 * Four lanes accumulate elements i = lane (mod 4) in order and are combined as
 * (l0 + l1) + (l2 + l3); the AVX2 version does exactly the same operations (no FMA), so both
 * give the same bits.
 *
 * stream(...) (POSIX) does the same for a whole tensor pair lying in two files: it preads
 * block after block into two caller-given buffers and sums each, all without the GIL, and
 * returns each block's sums as sums() would have (opscope.compare.stream): one GIL hold per
 * tensor instead of several per block, so threads measure in parallel. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

enum { F32 = 0, F64 = 1, BF16 = 2, F16 = 3 };
#define LANES 4
#define GIL_FREE_ELEMENTS 65536

typedef struct {
    double sq, abs, mabs, dot, tt, rr, mrel, rel, q;
    int64_t out;
} sums_t;

static double f16_value(uint16_t h) {
    int exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    double v;
    if (exp == 0) v = ldexp((double)man, -24);
    else if (exp == 0x1f) v = man ? NAN : INFINITY;
    else v = ldexp((double)(man | 0x400), exp - 25);
    return (h & 0x8000) ? -v : v;
}

static inline double load1(const void *p, Py_ssize_t i, int code) {
    switch (code) {
    case F32: return (double)((const float *)p)[i];
    case F64: return ((const double *)p)[i];
    case BF16: {
        uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        return (double)f;
    }
    default: return f16_value(((const uint16_t *)p)[i]);
    }
}

/* One element into lane accumulators, as the AVX2 loop does it lane by lane. */
static inline void add1(sums_t *s, double x, double y, double floor, double rtol) {
    double d = x - y, ad = fabs(d), r = fabs(y);
    double rel = ad / (r > floor ? r : floor);
    double q = r >= floor && r >= 1e-300 ? rel : ad / (r > 1e-300 ? r : 1e-300); /* the same divisor: one division */
    q = q < 1.0 ? q : 1.0;
    s->sq += d * d;
    s->dot += x * y;
    s->tt += x * x;
    s->rr += y * y;
    s->abs += ad;
    s->mabs = ad > s->mabs ? ad : s->mabs;
    s->q += q * q;
    s->rel += rel;
    s->mrel = rel > s->mrel ? rel : s->mrel;
    s->out += rel > rtol;
}

static void combine(const sums_t lane[LANES], sums_t *out) {
#define PAIRWISE(f) out->f = (lane[0].f + lane[1].f) + (lane[2].f + lane[3].f)
    PAIRWISE(sq); PAIRWISE(abs); PAIRWISE(dot); PAIRWISE(tt); PAIRWISE(rr); PAIRWISE(rel); PAIRWISE(q);
    PAIRWISE(out);
#undef PAIRWISE
    out->mabs = out->mrel = 0.0;
    for (int k = 0; k < LANES; k++) {
        out->mabs = lane[k].mabs > out->mabs ? lane[k].mabs : out->mabs;
        out->mrel = lane[k].mrel > out->mrel ? lane[k].mrel : out->mrel;
    }
}

static void portable(const void *a, int ta, const void *b, int tb, Py_ssize_t n, double floor, double rtol,
                     sums_t lane[LANES], Py_ssize_t from) {
    for (Py_ssize_t i = from; i < n; i++)
        add1(&lane[i % LANES], load1(a, i, ta), load1(b, i, tb), floor, rtol);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define AVX2 __attribute__((target("avx2,f16c")))

AVX2 static inline __m256d load4(const void *p, Py_ssize_t i, int code) {
    switch (code) {
    case F32: return _mm256_cvtps_pd(_mm_loadu_ps((const float *)p + i));
    case F64: return _mm256_loadu_pd((const double *)p + i);
    case BF16: {
        __m128i h = _mm_loadl_epi64((const __m128i *)((const uint16_t *)p + i));
        return _mm256_cvtps_pd(_mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(h), 16)));
    }
    default: return _mm256_cvtps_pd(_mm_cvtph_ps(_mm_loadl_epi64((const __m128i *)((const uint16_t *)p + i))));
    }
}

/* Returns how many elements it did (a multiple of 4); the lanes hold their sums. */
AVX2 static Py_ssize_t wide(const void *a, int ta, const void *b, int tb, Py_ssize_t n, double floor, double rtol,
                            sums_t lane[LANES]) {
    const __m256d sign = _mm256_set1_pd(-0.0), tiny = _mm256_set1_pd(1e-300), one = _mm256_set1_pd(1.0);
    const __m256d vfloor = _mm256_set1_pd(floor), vrtol = _mm256_set1_pd(rtol);
    const __m256d both = _mm256_set1_pd(floor > 1e-300 ? floor : 1e-300);
    __m256d sq = _mm256_setzero_pd(), abs_ = sq, mabs = sq, dot = sq, tt = sq, rr = sq, mrel = sq, rel_ = sq, qq = sq;
    __m256i out = _mm256_setzero_si256();
    Py_ssize_t m = n - n % LANES;
    for (Py_ssize_t i = 0; i < m; i += LANES) {
        __m256d x = load4(a, i, ta), y = load4(b, i, tb);
        __m256d d = _mm256_sub_pd(x, y), ad = _mm256_andnot_pd(sign, d), r = _mm256_andnot_pd(sign, y);
        /* r > 1e-300 ? r : 1e-300 is MAXPD(r, tiny) with r first; likewise the others */
        __m256d rel = _mm256_div_pd(ad, _mm256_max_pd(r, vfloor));
        __m256d q = rel; /* where r >= both floors the divisors are equal: one division */
        if (_mm256_movemask_pd(_mm256_cmp_pd(r, both, _CMP_GE_OQ)) != 0xF)
            q = _mm256_div_pd(ad, _mm256_max_pd(r, tiny));
        q = _mm256_min_pd(q, one);
        sq = _mm256_add_pd(sq, _mm256_mul_pd(d, d));
        dot = _mm256_add_pd(dot, _mm256_mul_pd(x, y));
        tt = _mm256_add_pd(tt, _mm256_mul_pd(x, x));
        rr = _mm256_add_pd(rr, _mm256_mul_pd(y, y));
        abs_ = _mm256_add_pd(abs_, ad);
        mabs = _mm256_max_pd(ad, mabs);
        qq = _mm256_add_pd(qq, _mm256_mul_pd(q, q));
        rel_ = _mm256_add_pd(rel_, rel);
        mrel = _mm256_max_pd(rel, mrel);
        out = _mm256_sub_epi64(out, _mm256_castpd_si256(_mm256_cmp_pd(rel, vrtol, _CMP_GT_OQ)));
    }
    double v[9][LANES];
    int64_t o[LANES];
    __m256d all[9] = {sq, abs_, mabs, dot, tt, rr, mrel, rel_, qq};
    for (int k = 0; k < 9; k++) _mm256_storeu_pd(v[k], all[k]);
    _mm256_storeu_si256((__m256i *)o, out);
    for (int k = 0; k < LANES; k++) {
        sums_t s = {v[0][k], v[1][k], v[2][k], v[3][k], v[4][k], v[5][k], v[6][k], v[7][k], v[8][k], o[k]};
        lane[k] = s;
    }
    return m;
}

static int avx2_available(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
}
#else
static Py_ssize_t wide(const void *a, int ta, const void *b, int tb, Py_ssize_t n, double floor, double rtol,
                       sums_t lane[LANES]) {
    (void)a; (void)ta; (void)b; (void)tb; (void)n; (void)floor; (void)rtol; (void)lane;
    return 0;
}
static int avx2_available(void) { return 0; }
#endif

static int SIMD = 0;

static void run(const void *a, int ta, const void *b, int tb, Py_ssize_t n, double floor, double rtol, sums_t *out) {
    sums_t lane[LANES];
    memset(lane, 0, sizeof lane);
    Py_ssize_t done = SIMD ? wide(a, ta, b, tb, n, floor, rtol, lane) : 0;
    portable(a, ta, b, tb, n, floor, rtol, lane, done);
    combine(lane, out);
}

static PyObject *sums(PyObject *self, PyObject *args) {
    unsigned long long a, b;
    int ta, tb;
    Py_ssize_t n;
    double floor, rtol;
    (void)self;
    if (!PyArg_ParseTuple(args, "KiKindd", &a, &ta, &b, &tb, &n, &floor, &rtol)) return NULL;
    if (ta < F32 || ta > F16 || tb < F32 || tb > F16 || n < 0) {
        PyErr_SetString(PyExc_ValueError, "bad dtype code or size");
        return NULL;
    }
    sums_t s;
    memset(&s, 0, sizeof s);
    if (n >= GIL_FREE_ELEMENTS) {
        Py_BEGIN_ALLOW_THREADS
        run((const void *)(uintptr_t)a, ta, (const void *)(uintptr_t)b, tb, n, floor, rtol, &s);
        Py_END_ALLOW_THREADS
    } else if (n > 0) {
        run((const void *)(uintptr_t)a, ta, (const void *)(uintptr_t)b, tb, n, floor, rtol, &s);
    }
    return Py_BuildValue("dddddddddL", s.sq, s.abs, s.mabs, s.dot, s.tt, s.rr, s.mrel, s.rel, s.q, (long long)s.out);
}

#ifndef _WIN32
#include <errno.h>
#include <unistd.h>

static const size_t ITEMSIZE[] = {4, 8, 2, 2};

/* n bytes at offset into buf: 0, 1 when the file ends first, -1 with errno on an error. */
static int read_full(int fd, char *buf, size_t n, long long offset) {
    size_t done = 0;
    while (done < n) {
        ssize_t got = pread(fd, buf + done, n - done, (off_t)(offset + (long long)done));
        if (got < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (got == 0) return 1;
        done += (size_t)got;
    }
    return 0;
}

/* Blocks of `block` elements from each side, summed as sums() sums one block, until `n` are
 * done, a side's file ends (status 1), a read fails (status -1, errno) or a block's sums are
 * not finite (status 2: that block is left to the caller's masked pass). */
static Py_ssize_t stream_blocks(int fa, long long oa, int ta, int fb, long long ob, int tb, Py_ssize_t n,
                                Py_ssize_t block, char *ba, char *bb, double floor, double rtol, sums_t *all,
                                Py_ssize_t *count, int *status, int *err) {
    Py_ssize_t done = 0;
    *count = 0;
    *status = 0;
    while (done < n) {
        Py_ssize_t m = n - done < block ? n - done : block;
        int got = read_full(fa, ba, (size_t)m * ITEMSIZE[ta], oa + (long long)done * (long long)ITEMSIZE[ta]);
        if (got == 0)
            got = read_full(fb, bb, (size_t)m * ITEMSIZE[tb], ob + (long long)done * (long long)ITEMSIZE[tb]);
        if (got != 0) {
            *status = got;
            *err = got < 0 ? errno : 0;
            break;
        }
        sums_t *s = &all[*count];
        run(ba, ta, bb, tb, m, floor, rtol, s);
        if (!isfinite(s->sq) || !isfinite(s->dot)) {
            *status = 2;
            break;
        }
        *count += 1;
        done += m;
    }
    return done;
}

static PyObject *stream(PyObject *self, PyObject *args) {
    int fa, ta, fb, tb;
    long long oa, ob;
    Py_ssize_t n, block;
    unsigned long long ba, bb;
    double floor, rtol;
    (void)self;
    if (!PyArg_ParseTuple(args, "iLiiLinnKKdd", &fa, &oa, &ta, &fb, &ob, &tb, &n, &block, &ba, &bb, &floor, &rtol))
        return NULL;
    if (ta < F32 || ta > F16 || tb < F32 || tb > F16 || n < 0 || block <= 0 || oa < 0 || ob < 0) {
        PyErr_SetString(PyExc_ValueError, "bad dtype code, size, block or offset");
        return NULL;
    }
    Py_ssize_t blocks = n / block + 1;
    sums_t *all = PyMem_RawMalloc((size_t)blocks * sizeof(sums_t));
    if (all == NULL) return PyErr_NoMemory();
    Py_ssize_t done, count;
    int status, err = 0;
    Py_BEGIN_ALLOW_THREADS
    done = stream_blocks(fa, oa, ta, fb, ob, tb, n, block, (char *)(uintptr_t)ba, (char *)(uintptr_t)bb, floor, rtol,
                         all, &count, &status, &err);
    Py_END_ALLOW_THREADS
    if (status < 0) {
        PyMem_RawFree(all);
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *list = PyList_New(count);
    for (Py_ssize_t k = 0; list != NULL && k < count; k++) {
        sums_t *s = &all[k];
        PyObject *item = Py_BuildValue("dddddddddL", s->sq, s->abs, s->mabs, s->dot, s->tt, s->rr, s->mrel, s->rel,
                                       s->q, (long long)s->out);
        if (item == NULL) Py_CLEAR(list);
        else PyList_SET_ITEM(list, k, item);
    }
    PyMem_RawFree(all);
    if (list == NULL) return NULL;
    return Py_BuildValue("Nni", list, done, status);
}
#endif

static PyObject *set_simd(PyObject *self, PyObject *arg) {
    (void)self;
    int want = PyObject_IsTrue(arg);
    if (want < 0) return NULL;
    int before = SIMD;
    SIMD = want && avx2_available();
    return PyBool_FromLong(before);
}

static PyMethodDef METHODS[] = {
    {"sums", sums, METH_VARARGS,
     "sums(a, a_code, b, b_code, n, rel_floor, rtol) -> (sum_sq_diff, sum_abs_diff, max_abs, dot, sum_sq_target, "
     "sum_sq_reference, max_rel, sum_rel, sum_sq_elem_rel, out_of_tolerance)"},
    {"set_simd", set_simd, METH_O, "set_simd(on) -> previous: use the AVX2 loop where the CPU has it (tests)"},
#ifndef _WIN32
    {"stream", stream, METH_VARARGS,
     "stream(fd_a, offset_a, a_code, fd_b, offset_b, b_code, n, block, buf_a, buf_b, rel_floor, rtol) -> "
     "(per-block sums, elements done, status: 0 done, 1 a file ended, 2 a block not finite)"},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_pairsums", NULL, -1, METHODS};

PyMODINIT_FUNC PyInit__pairsums(void) {
    SIMD = avx2_available();
    PyObject *m = PyModule_Create(&MODULE);
    if (m && PyModule_AddIntConstant(m, "SIMD", SIMD) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
