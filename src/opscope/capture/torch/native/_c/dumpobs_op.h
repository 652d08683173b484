// What the native dump does when a recorded op starts and ends (included by dumpobs.cpp,
// inside its anonymous namespace).
// ---- the op ----------------------------------------------------------------------------------------
// The tensors of a value: a tensor, a list of them, or lists of lists (a collective's Tensor[][]).
// (No recursion: called for every argument of every recorded op, it stays inlined.)
template <typename F>
inline void each_tensor(const c10::IValue& a, F&& f) {
  if (a.isTensor()) {
    if (a.toTensor().defined()) f(a.toTensor());
  } else if (a.isTensorList()) {
    for (const at::Tensor& t : a.toTensorList()) f(t);
  } else if (a.isList()) {
    for (const auto& x : a.toListRef()) {
      if (x.isTensor()) {
        if (x.toTensor().defined()) f(x.toTensor());
      } else if (x.isTensorList()) {
        for (const at::Tensor& t : x.toTensorList()) f(t);
      }
    }
  }
}

// (slot, argument name, tensor, filled without being read)
void flatten_inputs(const Thread& T, const OpKind& k, std::vector<std::tuple<int, int, at::Tensor, bool>>& out) {
  for (size_t i = 0; i < T.args.size(); ++i) {
    int arg = i < k.arg_names.size() ? k.arg_names[i] : -1;
    bool unread = i < 64 && (k.unread >> i) & 1;
    const auto& a = T.args[i];
    if (a.isTensor()) {
      const at::Tensor& t = a.toTensor();  // a Python number passed as a tensor is an argument value
      if (t.defined() && !t.unsafeGetTensorImpl()->is_wrapped_number())
        out.emplace_back(static_cast<int>(out.size()), arg, t, unread);
    } else {
      each_tensor(a, [&](const at::Tensor& t) { out.emplace_back(static_cast<int>(out.size()), arg, t, unread); });
    }
  }
}

struct Pending {  // the recorded op running on this thread, between its start and its end
  bool valid = false;
  Head h;
  int64_t first = -1;
  Base base;  // of the first input: where its views lie in its data
  std::vector<intptr_t> wrote_empty;  // arguments it writes in place that held no data (g_wrote_empty)
};

bool held_no_data(const Pending& p, const at::Tensor& t) {
  return !p.wrote_empty.empty() && std::find(p.wrote_empty.begin(), p.wrote_empty.end(), storage_of(t)) != p.wrote_empty.end();
}
thread_local Pending t_pending;

void flatten_inputs(const Thread& T, const OpKind& k, std::vector<std::tuple<int, int, at::Tensor, bool>>& out);
int args_of(const Thread& T, const OpKind& k);
const OpKind& schema_of(const OpKind& k);

// A recorded op starts: its head (phase, module, call, arguments) and its input rows, taken
// now, before an in-place op changes what it received.
void before_op(Thread& T, const at::RecordFunction& fn, const OpKind& k) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  Pending& pending = kept(t_pending);  // this thread's, reached once
  pending.valid = false;
  forget_views_written(T, k);
  // an op run with Python dispatch excluded (torch.tensor() filling its new tensor) is one no
  // dispatch mode sees: not recorded either
  if (c10::impl::tls_is_dispatch_key_excluded(c10::DispatchKey::Python)) return;
  rng_before(T, k);
  Head h{0, 0, g_phase, g_module, k.name, -1, -1, -1};
  if (in_node(T)) {
    h.phase = BACKWARD, h.node = T.nodes.back().second, h.module = -1;
    // what runs after backward until the optimizer step or the next forward (the outermost
    // module's call; see DumpSession) is backward too: gradient clipping, unscaling, all-reduce
    if (g_phase == FORWARD) g_phase = BACKWARD;
    if (const Owner* o = owner_of(T.nodes.back().first)) h.module = o->module, h.fwd = o->op;
  } else if ((h.phase == FORWARD || h.phase == RECOMPUTE) && fn.seqNr() >= 0) {
    // a recomputed op's node is the one a reentrant checkpoint's nested backward runs
    own(fn.seqNr(), h.module, k.name);
  }
  if (!selected(h.module, k.name, h.phase)) return;
  set_data(h);
  h.call = calls[std::make_tuple(h.module, static_cast<int>(h.phase), k.name)]++;
  h.seq = g_seq++;
  h.args = args_of(T, k);
  static std::vector<std::tuple<int, int, at::Tensor, bool>> ins;  // kept: no allocation per op (under mu)
  ins.clear();
  flatten_inputs(T, k, ins);
  int64_t first = -1;
  Base base;
  std::vector<Held>& held = kept(t_held);
  held.clear();
  g_share = k.copies && !h.data && !g_probe && !g_route_slow && k.written.empty();
  g_elements = k.copies_elements;
  g_view_op = k.view_outputs != 0;
  g_wrote_empty.clear();
  if (g_inputs || k.view_outputs)
    for (auto& [slot, arg, t, unread] : ins) {
      if (unread) {  // filled without being read (copy_'s destination, out=): what is there is not data
        if (g_inputs) unread_row(h, slot, arg, t);
        continue;
      }
      g_measure_here = writes_arg(k, arg);
      int64_t r = input_row(h, slot, arg, t);
      g_measure_here = false;
      hold_input(held, r, t, slot == 0);
      if (first < 0 && r >= 0) {
        first = r;
        if (k.view_outputs) base = base_of(t);  // (its order, for views' rows; with h.place, its geometry)
      }
    }
  g_share = g_view_op = false;
  ins.clear();  // its tensors are not held past the op's start
  pending.valid = true, pending.h = h, pending.first = first, pending.base = base;
  pending.wrote_empty.swap(g_wrote_empty);
  g_wrote_empty.clear();
}

// The op wrote its written arguments: counted per storage (g_writes), before their output rows, so
// that no row made before is taken for a tensor of that storage again, also where no version
// counter moved (an argument the schema does not mark written: batch norm's running statistics).
__attribute__((noinline)) void count_list_writes(const c10::IValue& a) {
  each_tensor(a, [](const at::Tensor& x) { ++g_writes[storage_of(x)]; });
}

void count_writes(const Thread& T, const OpKind& k) {
  for (int pos : k.written) {
    if (pos >= static_cast<int>(T.args.size())) continue;
    const auto& a = T.args[pos];
    if (a.isTensor() && a.toTensor().defined()) ++g_writes[storage_of(a.toTensor())];
    else if (a.isTensorList())
      for (const at::Tensor& x : a.toTensorList()) ++g_writes[storage_of(x)];
    else if (a.isList())  // (a collective's lists of lists)
      count_list_writes(a);
  }
}

// An op of a thread doing a collective's work (foreign in observer.h) ended: what it wrote is
// counted (no row made before is taken for that storage again), and where it read a
// collective's result (a communication hook's decompression into DDP's bucket), what it wrote
// holds that result.
void foreign_op(Thread& T, const at::RecordFunction&, const OpKind& k) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  count_writes(T, k);
  int64_t source = -1;
  for (const auto& a : T.args)
    each_tensor(a, [&](const at::Tensor& t) {
      const WrittenBase* w = source >= 0 ? nullptr : written_entry(t);
      if (w && w->collective) source = static_cast<int64_t>(w->row);
    });
  if (source >= 0)
    for (int pos : k.written)
      if (pos < static_cast<int>(T.args.size()))
        each_tensor(T.args[pos], [&](const at::Tensor& t) { holds_result(t, static_cast<size_t>(source)); });
}

void on_op(Thread& T, const at::RecordFunction& fn, const OpKind& k) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  if (!k.written.empty()) count_writes(T, k);  // (views on them were forgotten at the op's start)
  Pending& pending = kept(t_pending);  // this thread's, reached once
  if (!pending.valid) return;
  pending.valid = false;
  const Head& h = pending.h;
  int64_t first = pending.first;
  // an op that raised (torch's end callback runs while its exception unwinds) made no outputs:
  // its inputs stay, as on the Python path (a checkpoint's early stop raises inside the op that
  // saves the last tensor it needs; the in-place index_add_ it stopped had written nothing)
  if (!g_outputs || std::uncaught_exceptions() > 0) return;
  static std::vector<std::pair<int, at::Tensor>> outs;  // kept: no allocation per op (under mu)
  outs.clear();
  const auto& ov = fn.outputs();
  for (size_t i = 0; i < ov.size(); ++i) {
    if (ov[i].isTensor()) {
      if (ov[i].toTensor().defined()) outs.emplace_back(static_cast<int>(i), ov[i].toTensor());
    } else {
      each_tensor(ov[i], [&](const at::Tensor& t) { outs.emplace_back(static_cast<int>(outs.size()), t); });
    }
  }
  uint64_t mutated = k.written_outputs;
  bool all_written = false;  // (a fused optimizer writes hundreds: past the mask's 64 slots too)
  if (outs.empty() && !k.written.empty()) {  // _foreach_add_ and friends return nothing
    for (int pos : k.written) {
      if (pos >= static_cast<int>(T.args.size())) continue;
      each_tensor(T.args[pos], [&](const at::Tensor& t) { outs.emplace_back(static_cast<int>(outs.size()), t); });
    }
    all_written = true;
  }
  std::vector<Held>& held = kept(t_held);
  g_share = !held.empty(), g_copies = k.copies, g_elements = k.copies_elements;
  for (auto& [slot, t] : outs) {
    bool is_view = slot < 64 && (k.view_outputs >> slot) & 1;
    bool written = all_written || (slot < 64 && (mutated >> slot) & 1);
    if (k.uninitialized || (slot < 64 && (k.unfilled >> slot) & 1) || (written && held_no_data(pending, t))) {
      empty_row(h, slot, t);
    } else if (k.collective) {
      collective_row(h, slot, t);
    } else {
      output_row(h, slot, t, is_view ? first : -1, written, &pending.base);
    }
  }
  g_share = g_copies = g_elements = false;
  held.clear();
  // what it wrote unmarked (batch norm's running statistics) follows its outputs, as on the Python
  // path: their next use links to these rows (their version did not move)
  int slot = static_cast<int>(outs.size());
  outs.clear();
  if (k.written.empty()) return;
  for (int pos : schema_of(k).unmarked) {
    const auto& a = pos < static_cast<int>(T.args.size()) ? T.args[pos] : c10::IValue();
    if (a.isTensor() && a.toTensor().defined()) output_row(h, slot++, a.toTensor(), -1, false, nullptr);
  }
}
