/* The native worker thread of _fastats (included by fastats.c, after the kernel and stats()):
 * submit, wait, take, done, results and reset, and submit_job for stats_many. */

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
