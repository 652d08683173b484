// Included by observer.h before on_start: the ops that are a collective's own work, which no
// observer records (capture/torch/collectives.py says why).

// An op of a thread that did not register the callbacks and runs no autograd node: torch hands
// a thread's callbacks to the threads doing work for it, and gloo's worker threads run a
// collective's own ops (the all-gather's copies into its output), in an order against the
// training thread's that the scheduler picks. Not recorded: the collective's outputs show
// what they did (measured at their next read).
inline bool foreign(Thread& T) {
  if (T.home_generation != g_home_generation)
    T.home = std::this_thread::get_id() == g_home, T.home_generation = g_home_generation;
  return !T.home && T.nodes.empty();
}

// An outermost op while ops are recorded: is it a collective's own work (on its worker thread,
// or beside its c10d op inside its Python call: gloo's reduce-scatter splits its all-reduced
// buffer into the output)? Then it is not recorded (true): what it writes is told at its end
// (foreign_op), its inner ops not at all.
bool collective_work(Thread& T, const at::RecordFunction& fn) {
  if (T.collective == 0 && !foreign(T)) return false;
  const OpKind& k = kind_of(T, fn);
  if (k.composite) {  // its parts come next, each judged here
    T.open.push_back({&k, 0, T.inner});
    return true;
  }
  if (k.collective && !foreign(T)) return false;  // the collective's own op, inside its call
  bool writes = !k.written.empty();
  if (writes) {
    auto in = fn.inputs();
    T.args.assign(in.begin(), in.end());
  }
  ++T.opaque;
  T.open.push_back({&k, static_cast<uint8_t>(OPAQUE | (writes ? FOREIGN : 0)), T.inner});
  return true;
}
