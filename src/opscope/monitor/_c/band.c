/* The monitor's detector (opscope.monitor.detect.BandDetector) judging one step in one call:
 * the work its numpy path does in ~70 calls on arrays of ~100 series (each call's overhead,
 * not the arithmetic, was the cost), done in one pass per series, the GIL released.
 *
 * band(state, size, nlin,                                             the detector's state, packed (unpack)
 *      rows, x, raw, bad,                                              the step: ids, log10|raw|, raw, NaN/Inf counts
 *      z, band_med, out,                                               written: z-score, the band's median, departs
 *      step, window, warmup, threshold, move_decades, loss_rise, zero_value, few, refresh)
 *
 * Per series, as the numpy path does it (detect.py is the reference; a unit test holds the
 * two to the same state and events): the band (median and MAD of the window, in float64 from
 * a sort) refreshed when stale, the log window re-centred on it; the robust z-score against
 * it with the floor and the smallest move of the series' kind; the threshold raised below
 * `few` values; then the value into the window. After all series: a step whose departures
 * are all finite inner series (activations) has none; the departed are quiet for `window`
 * steps. Returns the number of departures, or -1 (nothing changed) when an id repeats in
 * `rows`: numpy's fancy assignment then keeps one value, which the caller's numpy path does.
 * Every expression keeps the numpy path's float64 operations and their order (no FMA).
 */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=off")
#endif
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "band.h"

enum { LINEAR = 1, UPWARD = 2, SET = 4, SQUARED = 8, INNER = 16 };
enum { QUANTUM = 32, LIMIT = 127, ZERO_CODE = -128, BASE_LIMIT = 30 * QUANTUM };
static const double ZERO = -29.0, LOG_FLOOR = 0.05, LINEAR_FLOOR = 0.01, MAD_SCALE = 1.4826;

typedef struct {
    uint8_t *flags;
    int8_t *logs;
    int16_t *base;
    const int64_t *lin_ids;
    double *lins;
    int32_t *count, *quiet;
    float *med, *mad;
    Py_ssize_t size, nlin, window;
    double zero_value; /* log10 of the detector's TINY: what a norm of 0 reads as */
    double *v, *d;     /* room for a window's values and their deviations */
} state_t;

static double clipd(double v, double lo, double hi) { return v < lo ? lo : v > hi ? hi : v; }

static void sort(double *v, Py_ssize_t n) { /* insertion sort: a window is a few dozen values */
    for (Py_ssize_t i = 1; i < n; i++) {
        double a = v[i];
        Py_ssize_t j = i;
        for (; j > 0 && v[j - 1] > a; j--) v[j] = v[j - 1];
        v[j] = a;
    }
}

static double middle(const double *sorted, Py_ssize_t n) { return (sorted[(n - 1) / 2] + sorted[n / 2]) / 2; }

static Py_ssize_t lin_row(const state_t *s, int64_t id) { /* lin_ids is ascending */
    Py_ssize_t lo = 0, hi = s->nlin;
    while (lo < hi) {
        Py_ssize_t mid = (lo + hi) / 2;
        if (s->lin_ids[mid] < id) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

/* The log window of series i re-centred on med (a band of zeros keeps its base). */
static void rebase(state_t *s, int64_t i, double med) {
    if (!(med > ZERO)) return;
    int16_t fresh = (int16_t)clipd(rint(med * QUANTUM), -BASE_LIMIT, BASE_LIMIT);
    int32_t shift = (int32_t)fresh - s->base[i];
    int8_t *row = s->logs + i * s->window;
    for (Py_ssize_t k = 0; k < s->window; k++)
        if (row[k] != ZERO_CODE) {
            int32_t v = (int32_t)row[k] - shift;
            row[k] = (int8_t)(v < -LIMIT ? -LIMIT : v > LIMIT ? LIMIT : v);
        }
    s->base[i] = fresh;
}

/* The band of series i from the first n values of its window: median and MAD. */
static void refresh(state_t *s, int64_t i, int linear, Py_ssize_t n) {
    double *v = s->v, *d = s->d;
    if (linear) {
        memcpy(v, s->lins + lin_row(s, i) * s->window, (size_t)n * sizeof(double));
    } else {
        const int8_t *row = s->logs + i * s->window;
        for (Py_ssize_t k = 0; k < n; k++)
            v[k] = row[k] == ZERO_CODE ? s->zero_value : ((double)row[k] + (double)s->base[i]) / QUANTUM;
    }
    sort(v, n);
    double m = middle(v, n);
    for (Py_ssize_t k = 0; k < n; k++) d[k] = fabs(v[k] - m);
    sort(d, n);
    s->med[i] = (float)m;
    s->mad[i] = (float)middle(d, n);
    if (!linear) rebase(s, i, m);
}

typedef struct {
    double threshold, move_decades, loss_rise;
    int32_t step, warmup, few, refresh;
} rule_t;

/* The z-score of value x of a judged series against its band (0 within its smallest move). */
static double score(const state_t *s, const rule_t *r, int64_t i, uint8_t flags, double x) {
    int linear = flags & LINEAR;
    double m = (double)s->med[i], mad = (double)s->mad[i];
    double floor = LOG_FLOOR;
    if (linear) {
        floor = LINEAR_FLOOR * fabs(m); /* two statements: no contraction on compilers that do it within one */
        floor = floor + 1e-12;
    }
    double spread = MAD_SCALE * mad;
    double scale = isnan(spread) || isnan(floor) ? NAN : spread > floor ? spread : floor; /* np.maximum */
    double delta = x - m;
    double least = linear ? r->loss_rise * fabs(m) : flags & SET ? 0.0 : r->move_decades * ((flags & SQUARED) ? 2 : 1);
    int within = fabs(delta) < least || (delta < 0 && (flags & UPWARD)) || (!linear && m <= ZERO);
    return within ? 0.0 : fabs(delta) / scale;
}

/* Value x of series i into its window (the oldest one out), if finite. */
static void remember(state_t *s, const rule_t *r, int64_t i, int linear, double x, int ok) {
    int32_t c = s->count[i];
    Py_ssize_t slot = c % s->window;
    if (!ok) return;
    if (linear) {
        s->lins[lin_row(s, i) * s->window + slot] = x;
    } else {
        double q = rint(x * QUANTUM);
        int zero = x <= ZERO;
        int unjudged = c < r->warmup || !(s->med[i] > (float)ZERO);
        if (!zero && unjudged && (c == 0 || fabs(q - (double)s->base[i]) > LIMIT)) rebase(s, i, q / QUANTUM);
        s->logs[i * s->window + slot] = zero ? ZERO_CODE : (int8_t)clipd(q - (double)s->base[i], -LIMIT, LIMIT);
    }
    s->count[i] = c + 1;
}

typedef struct {
    const int64_t *rows;
    const double *x, *raw, *bad;
    double *z, *band_med;
    uint8_t *out;
    Py_ssize_t n;
} step_t;

static Py_ssize_t judge(state_t *s, const rule_t *r, step_t *t) {
    Py_ssize_t departed = 0, loud = 0;
    for (Py_ssize_t j = 0; j < t->n; j++) {
        int64_t i = t->rows[j];
        uint8_t flags = s->flags[i];
        int linear = flags & LINEAR;
        double x = linear ? t->raw[j] : t->x[j];
        int nonfinite = !isfinite(t->raw[j]) || t->bad[j] > 0;
        int32_t c = s->count[i];
        Py_ssize_t n = c < s->window ? c : s->window;
        double z = 0.0;
        t->band_med[j] = NAN;
        if (c >= r->warmup) {
            if (c % r->refresh == 0 || c < s->window) refresh(s, i, linear, n);
            z = score(s, r, i, flags, x);
            t->band_med[j] = (double)s->med[i];
        }
        double few = (double)r->few / (double)(n > 1 ? n : 1);
        double limit = r->threshold * sqrt(few > 1.0 ? few : 1.0);
        int out = s->quiet[i] < r->step && (nonfinite || z > limit);
        t->z[j] = z;
        t->out[j] = (uint8_t)out;
        departed += out;
        loud += out && (nonfinite || !(flags & INNER));
        remember(s, r, i, linear, x, isfinite(x) && !nonfinite);
    }
    if (!loud) { /* activations alone: backward and the optimizer absorbed it */
        for (Py_ssize_t j = 0; j < t->n; j++) t->out[j] = 0;
        return 0;
    }
    for (Py_ssize_t j = 0; j < t->n; j++)
        if (t->out[j]) s->quiet[t->rows[j]] = r->step + (int32_t)s->window;
    return departed;
}

/* -1 when an id repeats or is out of range (ids below size, checked; numpy's semantics differ). */
static int distinct(const int64_t *rows, Py_ssize_t n, Py_ssize_t size) {
    uint8_t *seen = calloc((size_t)size + 1, 1);
    int ok = seen != NULL;
    for (Py_ssize_t j = 0; ok && j < n; j++) {
        ok = rows[j] >= 0 && rows[j] < size && !seen[rows[j]];
        if (ok) seen[rows[j]] = 1;
    }
    free(seen);
    return ok;
}

enum { NBUF = 8 };

/* The detector's state packed in one buffer, as BandDetector._fields lays it out for size series
 * (nlin linear), the widest first: lins double [nlin, window], lin_ids int64 [nlin], count,
 * quiet int32 [size], med, mad float [size], base int16 [size], flags uint8 [size], logs int8
 * [size, window]. Returns its length in bytes. */
static Py_ssize_t unpack(char *p, Py_ssize_t size, Py_ssize_t nlin, Py_ssize_t window, state_t *s) {
    Py_ssize_t at = 0;
    s->lins = (double *)(p + at), at += 8 * nlin * window;
    s->lin_ids = (const int64_t *)(p + at), at += 8 * nlin;
    s->count = (int32_t *)(p + at), at += 4 * size;
    s->quiet = (int32_t *)(p + at), at += 4 * size;
    s->med = (float *)(p + at), at += 4 * size;
    s->mad = (float *)(p + at), at += 4 * size;
    s->base = (int16_t *)(p + at), at += 2 * size;
    s->flags = (uint8_t *)(p + at), at += size;
    s->logs = (int8_t *)(p + at), at += size * window;
    s->size = size;
    s->nlin = nlin;
    s->window = window;
    return at;
}

PyObject *band_update(PyObject *self, PyObject *args) {
    Py_buffer b[NBUF];
    memset(b, 0, sizeof b);
    Py_ssize_t size, nlin;
    int step, window, warmup, few, refresh_every;
    double threshold, move_decades, loss_rise, zero_value;
    if (!PyArg_ParseTuple(args, "w*nny*y*y*y*w*w*w*iiidddiid", &b[0], &size, &nlin, &b[1], &b[2], &b[3], &b[4], &b[5],
                          &b[6], &b[7], &step, &window, &warmup, &threshold, &move_decades, &loss_rise, &few,
                          &refresh_every, &zero_value))
        return NULL;
    Py_ssize_t n = b[1].len / 8;
    /* the sizes in bytes each buffer of the step must have (the state's: unpack) */
    Py_ssize_t want[NBUF] = {0, 8 * n, 8 * n, 8 * n, 8 * n, 8 * n, 8 * n, n};
    long result = -2;
    state_t s = {0};
    int fits = window > 0 && refresh_every > 0 && size >= 0 && nlin >= 0 && nlin <= size;
    if (fits) want[0] = unpack(b[0].buf, size, nlin, window, &s);
    for (int k = 0; k < NBUF; k++) fits = fits && b[k].len == want[k];
    if (fits) {
        s.zero_value = zero_value;
        rule_t r = {threshold, move_decades, loss_rise, step, warmup, few, refresh_every};
        step_t t = {b[1].buf, b[2].buf, b[3].buf, b[4].buf, b[5].buf, b[6].buf, b[7].buf, n};
        Py_BEGIN_ALLOW_THREADS
        s.v = malloc(2 * (size_t)window * sizeof(double));
        s.d = s.v == NULL ? NULL : s.v + window;
        result = s.v == NULL ? -3 : distinct(t.rows, n, size) ? (long)judge(&s, &r, &t) : -1;
        free(s.v);
        Py_END_ALLOW_THREADS
    }
    for (int k = 0; k < NBUF; k++) PyBuffer_Release(&b[k]);
    if (result == -3) return PyErr_NoMemory();
    if (result == -2) {
        PyErr_SetString(PyExc_ValueError, "band: buffers of the wrong size (the state for its series, the step by id)");
        return NULL;
    }
    return PyLong_FromLong(result);
}
