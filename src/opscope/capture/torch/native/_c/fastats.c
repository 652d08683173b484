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
    acc_init(&a);
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
    acc_init(&a);
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

#include "fastats_worker.h"

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
