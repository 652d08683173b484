// Included by dumpobs.cpp inside its anonymous namespace, after the rows and data flow: an
// output that holds the bytes of an input already read takes that row's statistics; a tensor
// written in place through a view of it has that write for its producer at its next read.

// ---- statistics shared by tensors holding the same bytes --------------------------------------
// The inputs of the recorded op running on this thread that a new output may hold element for
// element: CPU tensors the kernel reads (contiguous ones for `_unsafe_view`), with their rows,
// where a row holds statistics of the input's own elements in row-major order (own_order). An
// output with the same elements in the same order has the same statistics (the kernel reads only
// them, in that order), so it is not read again.
// Only for the ops known to return their first input's values (OpKind::copies: `_unsafe_view`
// returns its memory without declaring a view, `clone` and `_to_copy` copy it), not for any
// output found in an input's memory: an op whose schema hides an in-place write could have
// changed it. Set between a statistics-only op's start and its end, when that op declares no
// argument written in place.
struct Held {
  int64_t row;
  int64_t numel;
  int8_t dtype;
  bool first;  // the op's first tensor input (what a copying op copies)
};
thread_local std::vector<Held> t_held;
// (under mu) set within a before_op or an on_op; g_elements: the op copies its first input's
// elements in their logical order (clone, _to_copy), whatever the strides of either
bool g_share = false, g_copies = false, g_elements = false;

bool kernel_reads(const at::Tensor& t) {  // measured by the kernel, its elements in row-major order
  return t.is_cpu() && t.layout() == at::kStrided && !t.is_complex() && !t.is_conj() && !t.is_neg() &&
         !wrapper_tensor(t) && code_of(t.scalar_type()) >= 0 && t.numel() > 0;
}

bool plain_bytes(const at::Tensor& t) {  // read by the kernel as it lies in memory
  return kernel_reads(t) && t.is_contiguous();
}

// Were row `i`'s statistics taken of its tensor's own elements in their row-major order (read
// from it, from the very same tensor, or from a copy of its elements), not from the base of a
// view (whose row-major order may be another: a transpose's)? Sums and hash follow that order.
bool own_order(size_t i) {
  for (;;) {
    const Row& r = rows[i];
    if (r.link >= 0) {
      if (r.reordered) return false;
      i = static_cast<size_t>(r.link);
    } else if (r.same >= 0) {
      i = static_cast<size_t>(r.same);
    } else {
      return r.stats == HAVE && !r.memory_order;
    }
  }
}

void hold_input(std::vector<Held>& held, int64_t row, const at::Tensor& t, bool first) {
  if (!g_share || !first || row < 0 || !own_order(static_cast<size_t>(row))) return;
  // clone and _to_copy copy the elements of an input of any strides, _unsafe_view its memory
  if (g_elements ? kernel_reads(t) : plain_bytes(t))
    held.push_back(Held{row, t.numel(), static_cast<int8_t>(t.scalar_type()), first});
}

// The row of the first input whose bytes (or elements, g_elements) output `t` of a copying op
// holds, or -1.
int64_t same_bytes(const at::Tensor& t) {
  if (!g_share || !g_copies || t_held.empty() || !(g_elements ? kernel_reads(t) : plain_bytes(t))) return -1;
  for (const Held& h : t_held)
    if (h.first && h.numel == t.numel() && h.dtype == static_cast<int8_t>(t.scalar_type()))
      return h.row;  // (held only where own_order found its statistics taken)
  return -1;
}

// `base` was written in place through a view of it (`buf[:, 2] = x`: copy_ into a select),
// whose output is `row`: the base's next read has that op for its producer. Without it the
// base had none, and looked like a value that differed at the start of the step (beam search's
// running sequences, a root listed before the fault that changed what was written).
void record_written_base(const at::Tensor& base, size_t row, bool collective = false) {
  g_written.insert_or_assign(reinterpret_cast<intptr_t>(base.unsafeGetTensorImpl()),
                             WrittenBase{c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>(
                                             base.getIntrusivePtr()), row, version_of(base), collective});
}

const WrittenBase* written_entry(const at::Tensor& t) {
  if (g_written.empty()) return nullptr;
  auto it = g_written.find(reinterpret_cast<intptr_t>(t.unsafeGetTensorImpl()));
  if (it == g_written.end() || it->second.ref.expired()) return nullptr;
  return &it->second;
}

// The id of the write that last made part of `t` through a view of it (alive and unwritten
// since), or of the collective whose result it holds, or -1.
int64_t written_by(const at::Tensor& t) {
  const WrittenBase* w = written_entry(t);
  if (!w || (!w->collective && w->version != version_of(t))) return -1;
  return rows[w->row].id;
}

// Does `t` hold a collective's result (holds_result)?
bool holds_collective(const at::Tensor& t) {
  const WrittenBase* w = written_entry(t);
  return w && w->collective;
}

// `t` and, if it is a view, its base have output row `row` for the producer of their next read
// (measured there): a collective's result (`collective`: however often its arrival writes it),
// or a tensor an API call wrote in place and did not return (api_end).
void written_here(const at::Tensor& t, size_t row, bool collective) {
  record_written_base(t, row, collective);
  if (t.is_view()) {
    at::TensorBase base = t._base();
    record_written_base(at::Tensor(std::move(base)), row, collective);
  }
}

// `t` holds the result of the collective whose output row is `row`.
void holds_result(const at::Tensor& t, size_t row) { written_here(t, row, true); }

// An output of a collective (capture/torch/dispatch.py COLLECTIVES): what it holds arrives when
// the collective completes, after its op returned (gloo's worker thread, NCCL's stream). Not
// measured here: its next read is, with this row for its producer.
void collective_row(const Head& h, int slot, const at::Tensor& t) {
  size_t i = new_row(h, IO_OUTPUT, slot, -1, t);
  rows[i].note = N_COLLECTIVE;
  holds_result(t, i);
}

// `base`: the op's first input, when output `t` is a view of it (src >= 0)
// An output that holds no data yet (an empty-like op's): registered for the ops that view it;
// its memory may be filled without any op (a custom kernel writing empty_like's), so whatever
// reads it next measures what is there.
void empty_row(const Head& h, int slot, const at::Tensor& t) {
  size_t i = new_row(h, IO_OUTPUT, slot, -1, t);
  rows[i].note = N_UNINITIALIZED, rows[i].marks = NODATA;
  record_flow(t, i, version_of(t), param_of(t), false);
}

void output_row(const Head& h, int slot, const at::Tensor& t, int64_t src, bool mutated, const Base* base) {
  size_t i = new_row(h, IO_OUTPUT, slot, -1, t);
  int64_t version = version_of(t);  // at the op's end the in-place bump has happened already
  int param = param_of(t);
  int note = N_VIEW;
  if (src < 0 && !mutated) {
    if (const Flow* f = same_tensor(t, version))
      src = static_cast<int64_t>(f->row), note = N_ALIAS;  // the very tensor measured before
  }
  bool view = src >= 0 && note == N_VIEW;
  if (view && !mutated && (rows[src].marks & NODATA)) {
    rows[i].note = N_UNINITIALIZED, rows[i].marks = NODATA;  // a view of memory that holds no data yet
    record_flow(t, i, version, param, true);
    return;
  }
  // the same elements: a view reinterpreting them as another dtype (`x.view(torch.int32)`) is read
  bool link = src >= 0 && !mutated && rows[src].numel == rows[i].numel && rows[src].dtype == rows[i].dtype;
  // with full tensors a view is kept as its input's data plus its geometry, else stored itself
  int geometry = link && view && h.place && base ? view_geometry(t, *base) : -1;
  if (link && view && h.data && geometry < 0) link = false;
  if (link) {
    rows[i].producer = rows[src].id, rows[i].note = note, rows[i].link = src, rows[i].view = geometry;
    // a view over its whole contiguous input, lying contiguously itself, keeps its elements' order
    rows[i].reordered = view && !(base && base->contiguous && t.is_contiguous() && address_of(t) == base->ptr);
    rows[i].marks = rows[src].marks;
    if (rows[src].param >= 0) param = rows[src].param;
  } else if (int64_t same = mutated || h.data ? -1 : same_bytes(t); same >= 0) {
    rows[i].same = same;
  } else {
    measure(i, t, h.data);
  }
  rows[i].param = param;
  record_flow(t, i, version, param, view);
  if (mutated && t.is_view()) {
    at::TensorBase base = t._base();  // (a new reference: the TensorBase torch holds is const)
    record_written_base(at::Tensor(std::move(base)), i);
  }
}

void rng_before(const Thread& T, const OpKind& k);

// Its storages are about to be written in place: views registered on them are forgotten, and
// the statistics still to be taken of them are taken first.
void forget_views(const at::Tensor& t) {
  if (!t.defined()) return;
  wait_storage(t);
  auto it = views.find(storage_of(t));
  if (it == views.end()) return;
  for (const Elems& g : it->second) geo.erase(g);
  views.erase(it);
}

void forget_views_written(const Thread& T, const OpKind& k) {
  if (k.written.empty() || (views.empty() && g_async.last.empty())) return;
  for (int pos : k.written) {  // each tensor where it lies (no list of them made per op)
    if (pos >= static_cast<int>(T.args.size())) continue;
    const auto& a = T.args[pos];
    if (a.isTensor()) forget_views(a.toTensor());
    else if (a.isTensorList())
      for (const at::Tensor& x : a.toTensorList()) forget_views(x);
  }
}
