/* The monitor's statistics of many CPU tensors in one call: L2 norm, max |x|, NaN and Inf
 * counts of each (nothing else: no min, sum, zero count or hash, which the dump's kernel
 * also computes), written into a caller's float64 [n, 4] buffer.
 *
 * norms(meta, out)  reduces every tensor now (the GIL released); returns how many of them hold
 *                   a NaN or an Inf (or have an unknown dtype code): 0 says all are finite;
 * start(meta, out)  hands the same work to the monitor's own native thread and returns at
 *                   once (both buffers are held until join);
 * join()            finishes it: the tensors the thread has not taken yet are reduced by the
 *                   caller (the thread may not have run at all on a loaded machine: waiting
 *                   for it cost the training thread ~0.34 ms a step), then it waits, without
 *                   the GIL, for the one tensor the thread may still be reading; returns
 *                   the batch's count as norms() does (0 when none was in flight).
 * Each tensor is reduced whole by one thread, with the same code: the results do not depend
 * on which thread took it.
 * meta is a C-contiguous int64 [3n] buffer (numpy array): the n tensors' addresses, then
 * their element counts, then their dtype codes (as the dump's kernel: 0 float32,
 * 1 float64, 2 float16, 3 bfloat16; another code gives NaN statistics); out a float64
 * [n, 4] one. One batch is in flight at a time (start waits for the previous one).
 *
 * The caller keeps every tensor alive and unwritten until join() returns. NaN makes the
 * norm and max NaN, an Inf (without NaN) makes them Inf, as torch's reductions do.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <float.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

enum { F32 = 0, F64 = 1, F16 = 2, BF16 = 3 };
#define BLOCK 2048 /* float lanes hold the squares of a block, then a double the blocks */
#define LANES 16
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__)) && !defined(__clang__)
#define CLONES __attribute__((target_clones("avx2", "default")))
#else
#define CLONES
#endif

typedef struct {
    double sumsq, amax;
    uint64_t nan, inf;
} mstat_t;

#include "band.h"         /* band(): the detector's step (band.c) */
#include "opscope_half.h" /* bf16_to_f32, f16_to_f32 (src/opscope/_c, on the include path) */
static inline float f32_f32(float x) { return x; }

/* Finite values' squares and max |x| in float lanes per block; NaN/Inf counted apart. A
 * block whose float sum of squares overflows (|x| > 1.8e19) is summed again in double. */
#define FLOAT_KERNEL(NAME, CTYPE, TOF)                                                        \
    static void NAME(const CTYPE *x, Py_ssize_t n, mstat_t *r) CLONES;                        \
    static void NAME(const CTYPE *x, Py_ssize_t n, mstat_t *r) {                              \
        for (Py_ssize_t b0 = 0; b0 < n; b0 += BLOCK) {                                        \
            Py_ssize_t m = n - b0 < BLOCK ? n - b0 : BLOCK, i = 0;                            \
            const CTYPE *xb = x + b0;                                                         \
            float q[LANES] = {0}, mx[LANES] = {0};                                            \
            int32_t cn[LANES] = {0}, ci[LANES] = {0};                                         \
            for (; i + LANES <= m; i += LANES)                                                \
                for (int l = 0; l < LANES; l++) {                                             \
                    float v = TOF(xb[i + l]), a = fabsf(v);                                   \
                    cn[l] += v != v;                                                          \
                    ci[l] += a == INFINITY;                                                   \
                    float f = a <= FLT_MAX ? a : 0.0f;                                        \
                    q[l] += f * f;                                                            \
                    mx[l] = mx[l] > f ? mx[l] : f;                                            \
                }                                                                             \
            for (; i < m; i++) {                                                              \
                float v = TOF(xb[i]), a = fabsf(v);                                           \
                cn[0] += v != v;                                                              \
                ci[0] += a == INFINITY;                                                       \
                float f = a <= FLT_MAX ? a : 0.0f;                                            \
                q[0] += f * f;                                                                \
                mx[0] = mx[0] > f ? mx[0] : f;                                                \
            }                                                                                 \
            double s = 0;                                                                     \
            for (int l = 0; l < LANES; l++) {                                                 \
                s += q[l];                                                                    \
                r->amax = r->amax > mx[l] ? r->amax : mx[l];                                  \
                r->nan += (uint64_t)cn[l];                                                    \
                r->inf += (uint64_t)ci[l];                                                    \
            }                                                                                 \
            if (!isfinite(s)) {                                                               \
                s = 0;                                                                        \
                for (i = 0; i < m; i++) {                                                     \
                    double a = fabs((double)TOF(xb[i]));                                      \
                    if (a <= DBL_MAX) s += a * a;                                             \
                }                                                                             \
            }                                                                                 \
            r->sumsq += s;                                                                    \
        }                                                                                     \
    }

FLOAT_KERNEL(k_f32, float, f32_f32)
FLOAT_KERNEL(k_f16_portable, uint16_t, f16_to_f32)
FLOAT_KERNEL(k_bf16, uint16_t, bf16_to_f32)

#if defined(__GNUC__) && defined(__x86_64__) && !defined(__clang__)
#include <immintrin.h>
/* float16 through F16C: each block converted to float32 (in cache), then the float32 loop */
__attribute__((target("avx2,f16c"))) static void k_f16_f16c(const uint16_t *x, Py_ssize_t n, mstat_t *r) {
    float t[BLOCK];
    for (Py_ssize_t b0 = 0; b0 < n; b0 += BLOCK) {
        Py_ssize_t m = n - b0 < BLOCK ? n - b0 : BLOCK, i = 0;
        for (; i + 8 <= m; i += 8)
            _mm256_storeu_ps(t + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(x + b0 + i))));
        for (; i < m; i++) t[i] = f16_to_f32(x[b0 + i]);
        k_f32(t, m, r);
    }
}
static void k_f16(const uint16_t *x, Py_ssize_t n, mstat_t *r) {
    static int f16c = -1;
    if (f16c < 0) f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    if (f16c) k_f16_f16c(x, n, r);
    else k_f16_portable(x, n, r);
}
#else
#define k_f16 k_f16_portable
#endif

static void k_f64(const double *x, Py_ssize_t n, mstat_t *r) CLONES;
static void k_f64(const double *x, Py_ssize_t n, mstat_t *r) {
    double q[8] = {0}, mx[8] = {0};
    int64_t cn[8] = {0}, ci[8] = {0};
    Py_ssize_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) {
            double v = x[i + l], a = fabs(v);
            cn[l] += v != v;
            ci[l] += a == INFINITY;
            double f = a <= DBL_MAX ? a : 0.0;
            q[l] += f * f;
            mx[l] = mx[l] > f ? mx[l] : f;
        }
    for (; i < n; i++) {
        double v = x[i], a = fabs(v);
        cn[0] += v != v;
        ci[0] += a == INFINITY;
        double f = a <= DBL_MAX ? a : 0.0;
        q[0] += f * f;
        mx[0] = mx[0] > f ? mx[0] : f;
    }
    for (int l = 0; l < 8; l++) {
        r->sumsq += q[l];
        r->amax = r->amax > mx[l] ? r->amax : mx[l];
        r->nan += (uint64_t)cn[l];
        r->inf += (uint64_t)ci[l];
    }
}

/* out[4 * i ...] = norm, max |x|, NaN count, Inf count of tensor i; 1 when it holds a NaN or an
 * Inf (or its dtype code is unknown), else 0. */
static int run_one(const int64_t *meta, double *out, Py_ssize_t n, Py_ssize_t i) {
    mstat_t r = {0, 0, 0, 0};
    const void *p = (const void *)(uintptr_t)meta[i];
    Py_ssize_t len = (Py_ssize_t)meta[n + i];
    int known = 1;
    if (len > 0) switch (meta[2 * n + i]) {
        case F32: k_f32((const float *)p, len, &r); break;
        case F64: k_f64((const double *)p, len, &r); break;
        case F16: k_f16((const uint16_t *)p, len, &r); break;
        case BF16: k_bf16((const uint16_t *)p, len, &r); break;
        default: known = 0; break;
    }
    double *o = out + 4 * i;
    if (!known) o[0] = o[1] = o[2] = o[3] = NAN;
    else if (r.nan) o[0] = o[1] = NAN;
    else if (r.inf) o[0] = o[1] = INFINITY;
    else { o[0] = sqrt(r.sumsq); o[1] = r.amax; }
    if (known) {
        o[2] = (double)r.nan;
        o[3] = (double)r.inf;
    }
    return !known || r.nan || r.inf;
}

static Py_ssize_t run_batch(const int64_t *meta, double *out, Py_ssize_t n) {
    Py_ssize_t bad = 0;
    for (Py_ssize_t i = 0; i < n; i++) bad += run_one(meta, out, n, i);
    return bad;
}

#define NBUF 2
typedef struct {
    Py_buffer b[NBUF];
    Py_ssize_t n;
} batch_t;

static void release(batch_t *batch) {
    for (int k = 0; k < NBUF; k++) PyBuffer_Release(&batch->b[k]);
}

/* Take meta (int64 [3n]) and out (float64 [n, 4], writable) into `batch`. */
static int take_buffers(PyObject *args, batch_t *batch) {
    PyObject *meta, *out;
    if (!PyArg_ParseTuple(args, "OO", &meta, &out)) return -1;
    if (PyObject_GetBuffer(meta, &batch->b[0], PyBUF_C_CONTIGUOUS) < 0) return -1;
    if (PyObject_GetBuffer(out, &batch->b[1], PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
        PyBuffer_Release(&batch->b[0]);
        return -1;
    }
    batch->n = batch->b[0].len / 24;
    if (batch->b[0].len != 24 * batch->n || batch->b[1].len != 32 * batch->n) {
        release(batch);
        PyErr_SetString(PyExc_ValueError, "norms: meta must be int64 [3n] and out float64 [n, 4]");
        return -1;
    }
    return 0;
}

static PyObject *norms(PyObject *self, PyObject *args) {
    batch_t batch;
    Py_ssize_t bad;
    if (take_buffers(args, &batch) < 0) return NULL;
    Py_BEGIN_ALLOW_THREADS
    bad = run_batch(batch.b[0].buf, batch.b[1].buf, batch.n);
    Py_END_ALLOW_THREADS
    release(&batch);
    return PyLong_FromSsize_t(bad);
}

/* The monitor's own worker: one batch at a time, never touching Python objects. The tensors of
 * a batch are taken one at a time (next) by the worker and, in join(), by the caller.
 *
 * Waking it costs the caller: on the reference VM (KVM, haltpoll) start() took 27-38 us of the
 * training thread's CPU when the worker's CPU had been idle for a step (~20 ms), 5-6 us when it
 * had run up to ~3 ms before. So the worker wakes on its own (a timed wait) PREWAKE before the
 * next batch is expected, and waits again: the caller's wake then finds a CPU that ran recently.
 * The next start is expected one interval-before-last after the last one (s3 + (s2 - s1)), which
 * holds for one batch a step (the gradients) and two (the gradients, then the state after a
 * short interval); none when the intervals are over a second, or shorter than the lead. */
#define PREWAKE_NS 2000000LL
static struct {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int started, pending, inside, held; /* pending: a batch the worker has not entered yet */
    Py_ssize_t next;                    /* the batch's next tensor not taken (atomic) */
    Py_ssize_t bad;                     /* its tensors with a NaN or an Inf so far (atomic) */
    batch_t batch;
    int64_t starts[3];                  /* the last three start() times (CLOCK_REALTIME ns), latest last */
    int64_t wake_at;                    /* when the worker wakes on its own before the next batch; 0: not */
} W = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts); /* (pthread_cond_timedwait's clock) */
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* A batch starts now (W.mu held): when to wake before the next one (see above). */
static void expect_next(void) {
    int64_t now = now_ns();
    W.starts[0] = W.starts[1], W.starts[1] = W.starts[2], W.starts[2] = now;
    int64_t gap = W.starts[1] - W.starts[0];
    int known = W.starts[0] > 0 && gap > 2 * PREWAKE_NS && gap < 1000000000LL;
    W.wake_at = known ? now + gap - PREWAKE_NS : 0;
}

/* Reduce the batch's tensors not taken yet, one at a time, until none is left. */
static void take_all(batch_t *batch) {
    const int64_t *meta = batch->b[0].buf;
    double *out = batch->b[1].buf;
    for (;;) {
        Py_ssize_t i = __atomic_fetch_add(&W.next, 1, __ATOMIC_RELAXED);
        if (i >= batch->n) return;
        if (run_one(meta, out, batch->n, i)) __atomic_fetch_add(&W.bad, 1, __ATOMIC_RELAXED);
    }
}

/* Elements of the tensors not taken yet. */
static int64_t left(const batch_t *batch) {
    const int64_t *meta = batch->b[0].buf;
    int64_t total = 0;
    for (Py_ssize_t i = __atomic_load_n(&W.next, __ATOMIC_RELAXED); i < batch->n; i++) total += meta[batch->n + i];
    return total;
}

static void *worker_main(void *unused) {
    (void)unused;
    pthread_mutex_lock(&W.mu);
    for (;;) {
        while (!W.pending) {
            if (W.wake_at > now_ns()) { /* a timed wait: its timeout is the wake before the batch */
                struct timespec at = {.tv_sec = W.wake_at / 1000000000LL, .tv_nsec = W.wake_at % 1000000000LL};
                if (pthread_cond_timedwait(&W.cv, &W.mu, &at) == ETIMEDOUT) W.wake_at = 0;
            } else {
                pthread_cond_wait(&W.cv, &W.mu);
            }
        }
        W.pending = 0;
        W.inside = 1; /* join() waits for it to leave the batch: its tensor, its writes into out */
        pthread_mutex_unlock(&W.mu);
        take_all(&W.batch);
        pthread_mutex_lock(&W.mu);
        W.inside = 0;
        pthread_cond_broadcast(&W.cv);
    }
    return NULL;
}

/* Finish the batch in flight: take what the worker has not (the GIL kept unless over a million
 * elements are left: letting it go when another Python thread waits for it hands it over, and
 * the caller then waits for that thread's Python), then wait for the worker to leave the
 * batch, the GIL let go only if it has not yet. A worker that had not woken finds no batch. */
static Py_ssize_t wait_idle(void) {
    if (!W.held) return 0;
    if (left(&W.batch) > (1 << 20)) { /* a large model's batch: others may run meanwhile */
        Py_BEGIN_ALLOW_THREADS
        take_all(&W.batch);
        Py_END_ALLOW_THREADS
    } else {
        take_all(&W.batch);
    }
    pthread_mutex_lock(&W.mu);
    W.pending = 0;
    int inside = W.inside;
    pthread_mutex_unlock(&W.mu);
    if (inside) {
        Py_BEGIN_ALLOW_THREADS
        pthread_mutex_lock(&W.mu);
        while (W.inside) pthread_cond_wait(&W.cv, &W.mu);
        pthread_mutex_unlock(&W.mu);
        Py_END_ALLOW_THREADS
    }
    if (W.held) { /* (another thread's join may have released it while this one had let the GIL go) */
        release(&W.batch);
        W.held = 0;
    }
    return __atomic_load_n(&W.bad, __ATOMIC_RELAXED);
}

static PyObject *join(PyObject *self, PyObject *unused) {
    return PyLong_FromSsize_t(wait_idle());
}

static PyObject *start(PyObject *self, PyObject *args) {
    batch_t batch;
    wait_idle();
    if (take_buffers(args, &batch) < 0) return NULL;
    pthread_mutex_lock(&W.mu);
    if (!W.started) {
        if (pthread_create(&W.thread, NULL, worker_main, NULL) != 0) {
            pthread_mutex_unlock(&W.mu);
            release(&batch);
            PyErr_SetString(PyExc_RuntimeError, "cannot start the monitor's statistics thread");
            return NULL;
        }
        pthread_detach(W.thread);
        W.started = 1;
    }
    W.batch = batch;
    W.held = 1;
    __atomic_store_n(&W.next, 0, __ATOMIC_RELAXED); /* (the worker is outside any batch: see wait_idle) */
    __atomic_store_n(&W.bad, 0, __ATOMIC_RELAXED);
    W.pending = 1;
    expect_next();
    pthread_cond_signal(&W.cv);
    pthread_mutex_unlock(&W.mu);
    Py_RETURN_NONE;
}

/* A forked child has no worker thread (and no batch in flight): start afresh there. */
static void child_after_fork(void) {
    pthread_mutex_init(&W.mu, NULL);
    pthread_cond_init(&W.cv, NULL);
    W.started = W.pending = W.inside = W.held = 0;
    W.starts[0] = W.starts[1] = W.starts[2] = W.wake_at = 0;
}

static PyMethodDef METHODS[] = {
    {"norms", norms, METH_VARARGS, "norms(meta, out): out[i] = norm, max|x|, nan, inf of tensor i (meta: n addresses, n numels, n dtype codes); the tensors with NaN/Inf"},
    {"start", start, METH_VARARGS, "start(meta, out): the same on the monitor's thread; join() waits"},
    {"join", join, METH_NOARGS, "join(): finish the batch given to start() (the tensors not taken yet here)"},
    {"band", band_update, METH_VARARGS, "band(state..., step...): the detector judges one step (band.c)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_monstats", NULL, -1, METHODS};

PyMODINIT_FUNC PyInit__monstats(void) {
    pthread_atfork(NULL, NULL, child_after_fork);
    return PyModule_Create(&MODULE);
}
