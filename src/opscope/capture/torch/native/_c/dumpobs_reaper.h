// The data flow of a finished step, freed by a thread of its own (included by dumpobs_columns.h,
// inside its anonymous namespace). Freeing it is most of the step boundary's native cost on a
// small step: each entry's weak reference is often the last one to its TensorImpl (or version
// counter), whose memory goes only then, and each map node is freed one by one. The training
// thread hands the filled maps over (a swap) and goes on with empty ones; nothing else reads them.
#include <condition_variable>
#include <pthread.h>

#include <thread>

struct StepFlow {  // what clear_step() would otherwise free on the training thread
  std::unordered_map<intptr_t, Flow> flow;
  std::unordered_map<Elems, Flow, ElemsHash> geo;
  std::unordered_map<intptr_t, std::vector<Elems>> views;
  std::unordered_map<Elems, SharedFlow, ElemsHash> shared;
  std::vector<std::string> args_json;
};

struct Reaper {  // never destroyed: a thread blocked at exit must not see its state go
  std::mutex m;
  std::condition_variable work;
  std::vector<StepFlow*> bins;
  bool started = false, forked = false;
};
Reaper& g_reaper = *new Reaper();

void reaper_loop() {
  Reaper& r = g_reaper;
  std::unique_lock<std::mutex> lock(r.m);
  for (;;) {
    r.work.wait(lock, [&] { return !r.bins.empty(); });
    std::vector<StepFlow*> bins;
    bins.swap(r.bins);
    lock.unlock();
    for (StepFlow* b : bins) delete b;
    lock.lock();
  }
}

// The step's data flow goes to the reaper thread (freed there), or is freed here in a forked
// child (which has no such thread). The maps keep their size's worth of buckets for the next step.
void discard_flow() {
  Reaper& r = g_reaper;
  if (flow.empty() && geo.empty() && shared.empty() && args_json.empty()) return;
  if (r.forked) {
    flow.clear(), geo.clear(), views.clear(), shared.clear(), args_json.clear();
    return;
  }
  auto* bin = new StepFlow();
  bin->flow.swap(flow), bin->geo.swap(geo), bin->views.swap(views), bin->shared.swap(shared);
  bin->args_json.swap(args_json);
  flow.reserve(bin->flow.size()), shared.reserve(bin->shared.size());
  args_json.reserve(bin->args_json.size());
  std::lock_guard<std::mutex> lock(r.m);
  if (!r.started) {
    r.started = true;
    pthread_atfork(nullptr, nullptr, [] { g_reaper.forked = true; });
    std::thread(reaper_loop).detach();
  }
  r.bins.push_back(bin);
  r.work.notify_one();
}
