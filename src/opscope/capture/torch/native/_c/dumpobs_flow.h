// Included by dumpobs.cpp inside its anonymous namespace, after the state, the Python hooks and
// the measurement: a call's head, its rows, and the step's data flow (the rules of Recorder:
// which row last measured each tensor, its views by geometry, autograd's saved tensors).

// ---- rows and data flow (the rules of Recorder) -----------------------------------------------
struct Head {
  int64_t seq, call;
  int8_t phase;
  int module, op, fwd, node, args;
  bool data = false, place = false;  // full tensors stored for this call; its views kept as geometry (set_data)
};

bool keeps_tensors(int op);

// A call's data flags: its full tensors are stored; its views are kept as geometry on their
// input's data (only when every call keeps its tensors, as on the Python path)
void set_data(Head& h) {
  h.data = g_want && !g_probe && keeps_tensors(h.op);
  h.place = g_want && !g_tensor_ops;
}

size_t new_row(const Head& h, int8_t io, int slot, int arg, const at::Tensor& t, int param = -1,
               int64_t producer = -1) {
  Row& r = rows.emplace_back();  // made in place: no Row (and its shape) moved
  r.id = g_next_id++, r.seq = h.seq, r.call = h.call, r.phase = h.phase, r.module = h.module, r.op = h.op;
  r.io = io, r.slot = slot, r.arg = arg, r.dtype = static_cast<int>(t.scalar_type());
  at::IntArrayRef sizes = t.sizes();
  r.shape.assign(sizes.begin(), sizes.end());
  r.device = t.is_cpu() ? -1 : intern(t.device().str());
  r.numel = t.numel(), r.producer = producer, r.param = param, r.fwd = h.fwd, r.node = h.node, r.args = h.args;
  return rows.size() - 1;
}

int param_of(const at::Tensor& t) {
  auto it = params.find(reinterpret_cast<intptr_t>(t.unsafeGetTensorImpl()));
  return it == params.end() ? -1 : it->second;
}

// The parameter a tensor read anew is, or is a view of: at the API level a weight is often read
// through a view no recorded call made (Falcon's `x @ self.weight.T`: Tensor.T is a property).
// Unnamed, the transposed weight, which the last update changed, was a root at step 1.
int param_or_base_of(const at::Tensor& t) {
  int param = param_of(t);
  if (param >= 0 || params.empty() || !t.is_view()) return param;
  return param_of(at::Tensor(t._base()));
}

int64_t writes_to(const at::Tensor& t) {
  if (g_writes.empty()) return 0;
  auto it = g_writes.find(storage_of(t));
  return it == g_writes.end() ? 0 : it->second;
}

void record_flow(const at::Tensor& t, size_t row, int64_t version, int param, bool view) {
  int64_t writes = writes_to(t);
  Flow f{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(t.getIntrusivePtr()), row, version,
         param, std::nullopt, writes};
  flow[reinterpret_cast<intptr_t>(t.unsafeGetTensorImpl())] = f;
  if (auto k = shared_key(t)) {
    auto* target = reinterpret_cast<c10::intrusive_ptr_target*>(k->place);  // the version counter
    c10::raw::weak_intrusive_ptr::incref(target);
    shared.insert_or_assign(*k, SharedFlow{row, version, param,
                                           c10::weak_intrusive_ptr<c10::intrusive_ptr_target>::reclaim(target), writes});
  }
  if (view) {
    auto g = geometry(t);
    if (!g) return;
    Flow v{std::nullopt, row, version, param, t.storage().getWeakStorageImpl()};
    views[g->place].push_back(*g);
    geo[*g] = std::move(v);
  }
}

// The record of this very tensor (alive, unchanged since), or null. A weak reference that has
// not expired means the TensorImpl at that address is still the one recorded.
const Flow* same_tensor(const at::Tensor& t, int64_t version) {
  auto it = flow.find(reinterpret_cast<intptr_t>(t.unsafeGetTensorImpl()));
  if (it != flow.end() && it->second.ref && !it->second.ref->expired() && it->second.version == version &&
      it->second.writes == writes_to(t))
    return &it->second;
  return nullptr;
}

const Flow* find_flow(const at::Tensor& t) {
  if (const Flow* f = same_tensor(t, version_of(t))) return f;
  if (auto k = shared_key(t)) {  // a saved tensor of autograd: the same elements and version counter
    auto si = shared.find(*k);
    if (si != shared.end() && !si->second.keep.expired() && si->second.version == version_of(t) &&
        si->second.writes == writes_to(t)) {
      static Flow found;  // (under mu)
      found = Flow{std::nullopt, si->second.row, si->second.version, si->second.param, std::nullopt};
      return &found;
    }
  }
  if (!views.empty()) {  // autograd wraps view outputs in new tensors: found by storage and geometry
    auto g = geometry(t);
    if (g) {
      auto gi = geo.find(*g);
      if (gi != geo.end() && gi->second.on_storage_of(t)) return &gi->second;
    }
  }
  return nullptr;
}

// The row whose statistics row `i` has in the end (following links and shared bytes).
size_t stats_source(size_t i) {
  while (rows[i].link >= 0 || rows[i].same >= 0) i = static_cast<size_t>(rows[i].link >= 0 ? rows[i].link : rows[i].same);
  return i;
}
