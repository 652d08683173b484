/* One-pass tensor statistics for CPU tensors, used by opscope's dump on CPU.
 *
 * stats(ptr, numel, code) reads `numel` contiguous elements at address `ptr` and returns
 * (min, max, sum, sumsq, nan, inf, zeros, hash, m2) in a single pass (m2: the squared
 * deviations from the mean; near-constant blocks are read again, fastats_spread.h), with the GIL released so
 * the training step goes on while a worker thread reduces. min/max ignore NaN here; the
 * caller turns them into NaN when nan > 0, matching torch's propagating reductions.
 * The content hash ("wsum64-v2") is defined next to hash_mix in fastats_kernel.h.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <string.h>
#include <pthread.h>
#include <stdlib.h>

#include "fastats_kernel.h"

#define GIL_FREE_BYTES ((size_t)8 << 20) /* about half a millisecond of work */

/* The sums and counts of `a`, as stats() returns them. */
static PyObject *raw_tuple(const acc_t *a) {
    return Py_BuildValue("ddddKKKKd", a->mn, a->mx, a->sum, a->sumsq, (unsigned long long)a->nan,
                         (unsigned long long)a->inf, (unsigned long long)a->zeros,
                         (unsigned long long)a->hash, acc_m2(a));
}

static PyObject *stats(PyObject *self, PyObject *args) {
    unsigned long long ptr;
    Py_ssize_t n;
    int code;
    if (!PyArg_ParseTuple(args, "Kni", &ptr, &n, &code)) return NULL;
    if (code < 0 || code > BOOL || n < 0) {
        PyErr_SetString(PyExc_ValueError, "bad dtype code or size");
        return NULL;
    }
    acc_t a;
    memset(&a, 0, sizeof a);
    a.mn = INFINITY;
    a.mx = -INFINITY;
    if (n > 0 && (size_t)n * ITEMSIZE[code] < GIL_FREE_BYTES) {
        /* a small tensor: done before another thread could use the GIL, and getting it back
         * can cost a whole switch interval (5 ms) when the writer thread holds it */
        run((const void *)(uintptr_t)ptr, n, code, &a);
    } else if (n > 0) {
        Py_BEGIN_ALLOW_THREADS
        run((const void *)(uintptr_t)ptr, n, code, &a);
        Py_END_ALLOW_THREADS
    }
    return raw_tuple(&a);
}

/* stats_t(ptr, planes, rows, cols, code): as stats() for `planes` planes of rows x cols stored
 * transposed one after another (run_transposed, fastats_transposed.h); None for the dtypes
 * and shapes it does not take (1-byte elements, 2-byte ones with an odd cols). */
static PyObject *stats_t(PyObject *self, PyObject *args) {
    unsigned long long ptr;
    Py_ssize_t planes, rows, cols;
    int code, done;
    if (!PyArg_ParseTuple(args, "Knnni", &ptr, &planes, &rows, &cols, &code)) return NULL;
    if (code < 0 || code > BOOL || planes < 1 || rows < 1 || cols < 1) {
        PyErr_SetString(PyExc_ValueError, "bad dtype code or size");
        return NULL;
    }
    acc_t a;
    memset(&a, 0, sizeof a);
    a.mn = INFINITY;
    a.mx = -INFINITY;
    if ((size_t)(planes * rows * cols) * ITEMSIZE[code] < GIL_FREE_BYTES) { /* as stats() */
        done = run_transposed((const void *)(uintptr_t)ptr, planes, rows, cols, code, &a);
    } else {
        Py_BEGIN_ALLOW_THREADS
        done = run_transposed((const void *)(uintptr_t)ptr, planes, rows, cols, code, &a);
        Py_END_ALLOW_THREADS
    }
    if (!done) Py_RETURN_NONE;
    return raw_tuple(&a);
}

/* A native worker thread: jobs are (address, numel, code) triples reduced in FIFO order
 * without ever taking the GIL, so the training thread pays only for submitting them. */
typedef struct {
    unsigned long long ptr;
    unsigned long long dst; /* when set, the elements are also copied there (full-tensor dumps) */
    Py_ssize_t n;
    int code;
    int taken;    /* reduced by the submitting thread itself (see take) */
    int finished; /* a taken job's result is in place */
    acc_t acc;
} job_t;

static struct {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work, done_cv;
    job_t *jobs;
    Py_ssize_t cap, tail, next, done;
    int started, stop, idle;
} W = {.mu = PTHREAD_MUTEX_INITIALIZER, .work = PTHREAD_COND_INITIALIZER, .done_cv = PTHREAD_COND_INITIALIZER};

/* Reduce one job and, for full-tensor dumps, copy its bytes out while they are in cache. */
static void run_job(job_t *job) {
    job->acc.mn = INFINITY;
    job->acc.mx = -INFINITY;
    if (job->n > 0) {
        run((const void *)(uintptr_t)job->ptr, job->n, job->code, &job->acc);
        if (job->dst)
            memcpy((void *)(uintptr_t)job->dst, (const void *)(uintptr_t)job->ptr, (size_t)job->n * ITEMSIZE[job->code]);
    }
}

static void *worker_main(void *unused) {
    (void)unused;
    pthread_mutex_lock(&W.mu);
    for (;;) {
        while (W.next == W.tail && !W.stop) {
            W.idle = 1; /* submitters signal only an idle worker: no syscall per job otherwise */
            pthread_cond_wait(&W.work, &W.mu);
        }
        W.idle = 0;
        if (W.next == W.tail && W.stop) break;
        Py_ssize_t i = W.next++;
        if (W.jobs[i].taken) { /* reduced by the submitter: wait for its result, then move on */
            while (!W.jobs[i].finished) pthread_cond_wait(&W.done_cv, &W.mu);
            W.done = i + 1;
            pthread_cond_broadcast(&W.done_cv);
            continue;
        }
        job_t job = W.jobs[i];
        pthread_mutex_unlock(&W.mu);
        run_job(&job);
        pthread_mutex_lock(&W.mu);
        W.jobs[i].acc = job.acc; /* the array may have moved while unlocked: index again */
        W.done = i + 1;
        pthread_cond_broadcast(&W.done_cv);
    }
    pthread_mutex_unlock(&W.mu);
    return NULL;
}

/* A forked child has no worker thread: start afresh there if it ever submits. */
static void child_after_fork(void) {
    pthread_mutex_init(&W.mu, NULL);
    pthread_cond_init(&W.work, NULL);
    pthread_cond_init(&W.done_cv, NULL);
    W.started = 0;
    W.idle = 0;
    W.tail = W.next = W.done = 0;
}

/* Queue one job for the worker thread (started on first use). Needs no GIL. Returns its id,
 * -1 when the thread cannot start, -2 when out of memory. */
static Py_ssize_t submit_job(unsigned long long ptr, Py_ssize_t n, int code, unsigned long long dst) {
    pthread_mutex_lock(&W.mu);
    if (!W.started) {
        W.stop = 0;
        if (pthread_create(&W.thread, NULL, worker_main, NULL) != 0) {
            pthread_mutex_unlock(&W.mu);
            return -1;
        }
        W.started = 1;
    }
    if (W.tail == W.cap) {
        Py_ssize_t cap = W.cap ? 2 * W.cap : 4096;
        job_t *jobs = realloc(W.jobs, sizeof(job_t) * cap);
        if (!jobs) { pthread_mutex_unlock(&W.mu); return -2; }
        W.jobs = jobs;
        W.cap = cap;
    }
    Py_ssize_t id = W.tail++;
    memset(&W.jobs[id], 0, sizeof(job_t));
    W.jobs[id].ptr = ptr; W.jobs[id].dst = dst; W.jobs[id].n = n; W.jobs[id].code = code;
    if (W.idle) pthread_cond_signal(&W.work);
    pthread_mutex_unlock(&W.mu);
    return id;
}

static PyObject *w_submit(PyObject *self, PyObject *args) {
    unsigned long long ptr, dst = 0;
    Py_ssize_t n;
    int code;
    if (!PyArg_ParseTuple(args, "Kni|K", &ptr, &n, &code, &dst)) return NULL;
    if (code < 0 || code > BOOL || n < 0) { PyErr_SetString(PyExc_ValueError, "bad dtype code or size"); return NULL; }
    Py_ssize_t id = submit_job(ptr, n, code, dst);
    if (id == -1) { PyErr_SetString(PyExc_RuntimeError, "cannot start the statistics thread"); return NULL; }
    if (id == -2) return PyErr_NoMemory();
    return PyLong_FromSsize_t(id);
}

static PyObject *w_wait(PyObject *self, PyObject *arg) {
    Py_ssize_t id = PyLong_AsSsize_t(arg);
    if (id == -1 && PyErr_Occurred()) return NULL;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&W.mu);
    while (W.done <= id && id < W.tail) pthread_cond_wait(&W.done_cv, &W.mu);
    pthread_mutex_unlock(&W.mu);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

/* take(job_id): make sure nobody will read that job's memory after this returns. A job
 * the worker has not started is reduced right here (GIL released), so a thread about to
 * write a tensor in place does not wait for the whole queue ahead of it. */
static PyObject *w_take(PyObject *self, PyObject *arg) {
    Py_ssize_t id = PyLong_AsSsize_t(arg);
    if (id == -1 && PyErr_Occurred()) return NULL;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&W.mu);
    if (id >= W.next && id < W.tail && !W.jobs[id].taken) {
        W.jobs[id].taken = 1;
        job_t job = W.jobs[id];
        pthread_mutex_unlock(&W.mu);
        run_job(&job);
        pthread_mutex_lock(&W.mu);
        W.jobs[id].acc = job.acc;
        W.jobs[id].finished = 1;
        pthread_cond_broadcast(&W.done_cv);
    } else {
        while (id < W.tail && W.done <= id && !(W.jobs[id].taken && W.jobs[id].finished))
            pthread_cond_wait(&W.done_cv, &W.mu);
    }
    pthread_mutex_unlock(&W.mu);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *w_done(PyObject *self, PyObject *unused) {
    pthread_mutex_lock(&W.mu);
    Py_ssize_t d = W.done;
    pthread_mutex_unlock(&W.mu);
    return PyLong_FromSsize_t(d);
}

/* results(start, end) -> [stats tuple] for finished jobs start..end-1. */
static PyObject *w_results(PyObject *self, PyObject *args) {
    Py_ssize_t start, end;
    if (!PyArg_ParseTuple(args, "nn", &start, &end)) return NULL;
    pthread_mutex_lock(&W.mu);
    if (start < 0 || end > W.done || start > end) {
        pthread_mutex_unlock(&W.mu);
        PyErr_SetString(PyExc_ValueError, "results asked for unfinished jobs");
        return NULL;
    }
    Py_ssize_t m = end - start;
    acc_t *accs = PyMem_Malloc(sizeof(acc_t) * (m ? m : 1));
    Py_ssize_t *ns = PyMem_Malloc(sizeof(Py_ssize_t) * (m ? m : 1));
    if (accs && ns)
        for (Py_ssize_t j = 0; j < m; j++) { accs[j] = W.jobs[start + j].acc; ns[j] = W.jobs[start + j].n; }
    pthread_mutex_unlock(&W.mu);
    if (!accs || !ns) { PyMem_Free(accs); PyMem_Free(ns); return PyErr_NoMemory(); }
    PyObject *out = PyList_New(m);
    for (Py_ssize_t j = 0; out && j < m; j++) {
        PyObject *t = finish(&accs[j], ns[j]);
        if (!t) { Py_CLEAR(out); break; }
        PyList_SET_ITEM(out, j, t);
    }
    PyMem_Free(accs); PyMem_Free(ns);
    return out;
}

/* reset(): forget every job (all must be finished); ids start again at 0. */
static PyObject *w_reset(PyObject *self, PyObject *unused) {
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&W.mu);
    while (W.done < W.tail) pthread_cond_wait(&W.done_cv, &W.mu);
    W.tail = W.next = W.done = 0;
    pthread_mutex_unlock(&W.mu);
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

#define WORKER_BYTES ((Py_ssize_t)64 << 10) /* smaller arrays are reduced by the caller */

typedef struct {
    Py_buffer view;
    acc_t acc;
    Py_ssize_t n, job;
    int code, held;
} item_t;

/* Reduce every held item: the large ones (with `worker`) on the worker thread while this one
 * reduces the rest. With `worker`, the queue is the caller's alone
 * (stats.py holds its lock), so it is emptied afterwards as reset() does. */
static void reduce_items(item_t *it, Py_ssize_t m, int worker) {
    Py_ssize_t last = -1, total = 0, given = 0;
    for (Py_ssize_t i = 0; i < m; i++) total += it[i].held ? it[i].view.len : 0;
    for (Py_ssize_t i = 0; worker && i < m && 2 * given < total; i++)
        if (it[i].held && it[i].view.len >= WORKER_BYTES) {
            given += it[i].view.len;
            it[i].job = submit_job((unsigned long long)(uintptr_t)it[i].view.buf, it[i].n, it[i].code, 0);
            if (it[i].job >= 0) last = it[i].job; /* else reduced below, here */
        }
    for (Py_ssize_t i = 0; i < m; i++) {
        if (!it[i].held || it[i].job >= 0) continue;
        it[i].acc.mn = INFINITY;
        it[i].acc.mx = -INFINITY;
        if (it[i].n > 0) run(it[i].view.buf, it[i].n, it[i].code, &it[i].acc);
    }
    if (last < 0) return;
    pthread_mutex_lock(&W.mu);
    while (W.done < W.tail) pthread_cond_wait(&W.done_cv, &W.mu);
    for (Py_ssize_t i = 0; i < m; i++)
        if (it[i].held && it[i].job >= 0) it[i].acc = W.jobs[it[i].job].acc;
    W.tail = W.next = W.done = 0;
    pthread_mutex_unlock(&W.mu);
}

/* The results of stats_many: a tuple (or None) per array, or (with `out`) the columns there
 * and the list of the arrays not measured. Releases every held buffer. */
static PyObject *many_results(item_t *it, Py_ssize_t m, double *out) {
    PyObject *res = PyList_New(out ? 0 : m);
    for (Py_ssize_t i = 0; i < m; i++) {
        PyObject *t = NULL;
        if (it[i].held) {
            PyBuffer_Release(&it[i].view);
            if (!res) continue;
            if (out && it[i].n > 0) { finish_column(&it[i].acc, it[i].n, out, m, i); continue; }
            t = out ? PyLong_FromSsize_t(i) : finish(&it[i].acc, it[i].n);
        } else if (res) {
            t = out ? PyLong_FromSsize_t(i) : Py_NewRef(Py_None);
        }
        if (!res) { Py_XDECREF(t); continue; }
        if (!t) { Py_CLEAR(res); continue; }
        if (out) {
            if (PyList_Append(res, t) < 0) Py_CLEAR(res);
            Py_DECREF(t);
        } else {
            PyList_SET_ITEM(res, i, t);
        }
    }
    return res;
}

/* stats_many(arrays, codes[, worker]) -> [stats tuple or None], the tuples as results() gives
 * them. One call for a graph run's ~1,000 arrays instead of a Python step per array. `arrays`:
 * objects exporting a C-contiguous buffer; `codes`: bytes, each array's dtype code (any code
 * above BOOL: not reduced here, None). An array that exports no contiguous buffer, or whose
 * size is not a whole number of its elements, is None too; the caller takes those its own way.
 * With `out` (a writable C-contiguous buffer of 10 x len(arrays) 8-byte slots), the statistics
 * go there column by column instead: row k holds statistic k of every array (rows 0-5 the
 * float64 min, max, mean, std, norm, absmax as finish() computes them, rows 6-9 the uint64
 * NaN, Inf and zero counts and the hash), and the result is the list of the indexes of the
 * arrays not measured there: those above, and empty arrays (whose statistics are mostly None);
 * their slots are left as they were. */
static PyObject *stats_many(PyObject *self, PyObject *args) {
    PyObject *arrays;
    const char *codes;
    Py_ssize_t ncodes;
    int worker = 0;
    PyObject *out_obj = Py_None;
    if (!PyArg_ParseTuple(args, "Oy#|pO", &arrays, &codes, &ncodes, &worker, &out_obj)) return NULL;
    PyObject *seq = PySequence_Fast(arrays, "stats_many: arrays must be a sequence");
    if (!seq) return NULL;
    Py_ssize_t m = PySequence_Fast_GET_SIZE(seq);
    if (m != ncodes) {
        Py_DECREF(seq);
        PyErr_SetString(PyExc_ValueError, "stats_many: one code per array");
        return NULL;
    }
    Py_buffer outv = {0};
    if (out_obj != Py_None) {
        if (PyObject_GetBuffer(out_obj, &outv, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) { Py_DECREF(seq); return NULL; }
        if (outv.len < 10 * m * (Py_ssize_t)sizeof(double)) {
            PyBuffer_Release(&outv);
            Py_DECREF(seq);
            PyErr_SetString(PyExc_ValueError, "stats_many: out must hold 10 x len(arrays) 8-byte slots");
            return NULL;
        }
    }
    item_t *it = PyMem_Calloc(m ? m : 1, sizeof(item_t));
    if (!it) { if (outv.obj) PyBuffer_Release(&outv); Py_DECREF(seq); return PyErr_NoMemory(); }
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < m; i++) {
        int code = (unsigned char)codes[i];
        it[i].job = -1;
        if (code > BOOL) continue;
        if (PyObject_GetBuffer(items[i], &it[i].view, PyBUF_SIMPLE) < 0) { PyErr_Clear(); continue; }
        if (it[i].view.len % (Py_ssize_t)ITEMSIZE[code]) { PyBuffer_Release(&it[i].view); continue; }
        it[i].held = 1;
        it[i].code = code;
        it[i].n = it[i].view.len / (Py_ssize_t)ITEMSIZE[code];
    }
    /* The GIL is kept: ~3 ms for a graph run's 44 MB, the large arrays on the worker. Given
     * away, it came back up to a switch interval (5 ms) late, from the dump's writer thread. */
    reduce_items(it, m, worker);
    PyObject *res = many_results(it, m, outv.obj ? (double *)outv.buf : NULL);
    if (outv.obj) PyBuffer_Release(&outv);
    PyMem_Free(it);
    Py_DECREF(seq);
    return res;
}

static PyMethodDef METHODS[] = {
    {"submit", w_submit, METH_VARARGS, "submit(ptr, numel, code[, dst]) -> job id (reduced, and copied to dst, by a native thread)"},
    {"wait", w_wait, METH_O, "wait(job_id): block, without the GIL, until that job is finished"},
    {"take", w_take, METH_O, "take(job_id): reduce it here if not started, else wait for it"},
    {"done", w_done, METH_NOARGS, "done() -> number of finished jobs (a prefix of the ids)"},
    {"results", w_results, METH_VARARGS, "results(start, end) -> [stats tuple] of finished jobs"},
    {"reset", w_reset, METH_NOARGS, "reset(): wait for every job, then forget them"},
    {"stats_many", stats_many, METH_VARARGS, "stats_many(arrays, codes[, worker[, out]]) -> [stats tuple or None], or with out (10 x len(arrays) 8-byte slots) the columns there and [index not measured]: many arrays in one call"},
    {"stats_t", stats_t, METH_VARARGS, "stats_t(ptr, planes, rows, cols, code) -> as stats() for planes stored transposed (rows adjacent), or None"},
    {"stats", stats, METH_VARARGS, "stats(ptr, numel, code) -> (min, max, sum, sumsq, nan, inf, zeros, hash, squared deviations from the mean)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_fastats", NULL, -1, METHODS};

PyMODINIT_FUNC PyInit__fastats(void) {
    pthread_atfork(NULL, NULL, child_after_fork);
    PyObject *m = PyModule_Create(&MODULE);
    /* SIMD: vector kernels run (float16 is then faster here than through torch); SIMD_PATH:
     * which ones, "avx512", "avx2" or "portable" */
    /* HASH: the content hash this build computes (a stale build must not be trusted); SPREAD:
     * 1 where stats() returns the squared deviations (fastats_spread.h) ninth */
    if (m && (PyModule_AddIntConstant(m, "SIMD", simd_level() > 0) < 0
              || PyModule_AddStringConstant(m, "SIMD_PATH", simd_name()) < 0
              || PyModule_AddStringConstant(m, "HASH", "wsum64-v2") < 0
              || PyModule_AddIntConstant(m, "SPREAD", 1) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
