// Statistics measured by a native worker thread while the step goes on (included by dumpobs.cpp
// inside its anonymous namespace, before dumpobs_measure.h). Used while the per-op observer is
// registered (the aten level), for statistics only: a full tensor's bytes are copied at the op.
//
// The training thread hands over (row, data, numel, dtype) and a reference to the tensor's
// storage, which keeps the memory alive (never the tensor: an extra reference would change what
// autograd does, e.g. AccumulateGrad steals a gradient only when nothing else holds it). The
// worker runs the same one-pass kernel, so the statistics are those measured at the op, as long
// as nothing writes the elements before the worker read them: an op about to write a storage in
// place (its schema's written arguments, seen by the observer before it runs) first waits for
// the jobs reading that storage (wait_storage). The step's results reach their rows before the
// rows are taken (async_finish).
#include <condition_variable>
#include <deque>
#include <pthread.h>

#include <thread>

struct Job {
  size_t row;
  const void* p;
  int64_t numel;
  int code;
  int64_t bytes;
  c10::Storage keep;
  acc_t acc;
};

struct Async {  // never destroyed: a worker blocked at exit must not see its state go
  std::mutex m;
  std::condition_variable work, finished;
  std::deque<Job> jobs;  // this step's; references stay valid while more are added
  size_t next = 0, done = 0, waiting = 0;
  bool asleep = false;  // the worker waits for work: woken for a batch, not for each job (a system call)
  int64_t pending_bytes = 0;
  bool started = false;
  std::unordered_map<intptr_t, size_t> last;  // storage -> its last job (training thread only)
};
Async& g_async = *new Async();

constexpr size_t MAX_JOBS = 4096;                         // pending jobs before the training thread waits
constexpr int64_t MAX_PENDING_BYTES = int64_t(64) << 20;  // pending bytes likewise
constexpr size_t WAKE_JOBS = 32;                          // jobs, or
constexpr int64_t WAKE_BYTES = int64_t(1) << 20;          // bytes waiting that wake a sleeping worker

void worker_loop() {
  Async& a = g_async;
  std::unique_lock<std::mutex> lock(a.m);
  for (;;) {
    if (a.next >= a.jobs.size()) {
      a.asleep = true;
      a.work.wait(lock, [&] { return a.next < a.jobs.size(); });
      a.asleep = false;
    }
    Job& j = a.jobs[a.next++];
    lock.unlock();
    acc_init(&j.acc);
    run(j.p, j.numel, j.code, &j.acc);
    lock.lock();
    ++a.done;
    a.pending_bytes -= j.bytes;
    if (a.waiting) a.finished.notify_all();
  }
}

// Wait (lock held) until the first `n` jobs are done.
void wait_done(std::unique_lock<std::mutex>& lock, size_t n) {
  Async& a = g_async;
  if (a.done >= n) return;
  if (a.asleep) a.work.notify_one();
  ++a.waiting;
  a.finished.wait(lock, [&] { return a.done >= n; });
  --a.waiting;
}

// Set while the inputs of an op that writes them in place are measured: at once, on this thread
// (the op writes them as soon as it runs)
bool g_measure_here = false;  // (under mu) set by before_op around its inputs

// Does the op write its argument named `arg` (an interned name; -1: unknown, so maybe)?
bool writes_arg(const OpKind& k, int arg) {
  if (k.written.empty()) return false;
  if (arg < 0) return true;
  for (int pos : k.written)
    if (pos < static_cast<int>(k.arg_names.size()) && k.arg_names[pos] == arg) return true;
  return false;
}

bool g_forked_child = false;  // the worker thread does not exist in a forked child
bool g_async_on = false;  // opt-in (OPSCOPE_STATS_BACKEND=async): an op whose schema hides an
// in-place write (batch norm's running stats did) would be measured after the write

// Hand the statistics of row `row` (contiguous CPU data at p, numel > 0) to the worker; false
// when it cannot take them (in a forked child): then they are measured here.
bool submit(size_t row, const at::Tensor& x, const void* p, int code) {
  if (g_forked_child || !g_async_on) return false;
  Async& a = g_async;
  intptr_t storage = storage_of(x);
  int64_t bytes = x.numel() * static_cast<int64_t>(x.element_size());
  std::unique_lock<std::mutex> lock(a.m);
  if (!a.started) {
    a.started = true;
    pthread_atfork(nullptr, nullptr, [] { g_forked_child = true; });
    std::thread(worker_loop).detach();
  }
  if (a.jobs.size() - a.done >= MAX_JOBS || a.pending_bytes >= MAX_PENDING_BYTES) wait_done(lock, a.jobs.size());
  a.jobs.push_back(Job{row, p, x.numel(), code, bytes, x.storage(), acc_t{}});
  a.pending_bytes += bytes;
  a.last[storage] = a.jobs.size();
  if (a.asleep && (a.jobs.size() - a.next >= WAKE_JOBS || a.pending_bytes >= WAKE_BYTES)) a.work.notify_one();
  return true;
}

// `t` is about to be written in place: the jobs reading its storage finish first.
void wait_storage(const at::Tensor& t) {
  Async& a = g_async;
  if (a.last.empty() || g_forked_child) return;  // (in a child the worker, maybe holding its lock, is gone)
  auto it = a.last.find(storage_of(t));
  if (it == a.last.end()) return;
  size_t n = it->second;
  a.last.erase(it);
  std::unique_lock<std::mutex> lock(a.m);
  wait_done(lock, n);
}

void finish_row(Row& r, const acc_t& a, int64_t n);

// Every job of the step done, its statistics in its row; the jobs let go of their storages.
void async_finish() {
  Async& a = g_async;
  if (g_forked_child) return;
  std::unique_lock<std::mutex> lock(a.m);
  if (a.jobs.empty()) return;
  wait_done(lock, a.jobs.size());
  for (Job& j : a.jobs)
    if (j.row < rows.size()) finish_row(rows[j.row], j.acc, j.numel);
  a.jobs.clear();
  a.next = a.done = 0;
  a.pending_bytes = 0;
  a.last.clear();
}
