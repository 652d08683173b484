// Included by observer.h before on_start: the ops that are a collective's own work, which no
// observer records (capture/torch/collectives.py says why).

// An op of a thread that did not register the callbacks and runs no autograd node: torch hands
// a thread's callbacks to the threads doing work for it, and gloo's worker threads run a
// collective's own ops (the all-gather's copies into its output), in an order against the
// training thread's that the scheduler picks. Not recorded: the collective's outputs show
// what they did (measured at their next read).
inline bool foreign(Thread& T) {
  if (T.home_generation != g_home_generation) [[unlikely]]
    T.home = std::this_thread::get_id() == g_home, T.home_generation = g_home_generation;
  return !T.home && T.nodes.empty();
}

// An outermost op while ops are recorded, on a foreign thread or inside a collective's Python
// call: is it the collective's own work (gloo's worker copying into an all-gather's output; its
// reduce-scatter splitting its all-reduced buffer beside the c10d op)? Then it is not recorded
// (true): what it writes is told at its end (foreign_op), its inner ops not at all.
__attribute__((noinline)) bool collective_work(Thread& T, const at::RecordFunction& fn) {
  const OpKind& k = kind_of(T, fn);
  // (the entries made by emplace_back() then filled: on_start's own push_back stays inlined there)
  if (k.composite) {  // its parts come next, each judged here
    T.open.emplace_back() = Open{&k, 0, T.inner};
    return true;
  }
  if (k.collective && !foreign(T)) return false;  // the collective's own op, inside its call
  bool writes = !k.written.empty();
  if (writes) {  // (copied one by one: on_start's own copy of the arguments stays inlined there)
    T.args.clear();
    for (const c10::IValue& v : fn.inputs()) T.args.push_back(v);
  }
  ++T.opaque;
  T.open.emplace_back() = Open{&k, static_cast<uint8_t>(OPAQUE | (writes ? FOREIGN : 0)), T.inner};
  return true;
}

