// Included by dumpobs.cpp inside its anonymous namespace, after the rows and data flow: an op's
// input rows, linked to the row that last measured the tensor or measured anew, and what an op
// fills without reading it.

// The measured row a VIEW_READ-marked row `i` has its statistics from, if no op read its data
// since (else -1).
int64_t unread_view_read(size_t i) {
  size_t src = stats_source(i);
  return rows[src].marks & VIEW_READ ? static_cast<int64_t>(src) : -1;
}

// An argument an op overwrites unread was read before only by an op that viewed it: FSDP's
// unsharded parameters, whose memory is given back after the forward and allocated again
// without an op, are viewed, then filled by split_with_sizes_copy(out=). That read measured
// memory that held no data yet: taken back (its statistics were taken: forget_views waited).
void unmeasure_overwritten(const at::Tensor& t) {
  if (g_view_reads == 0) return;
  const Flow* f = find_flow(t);
  int64_t src = f && (rows[f->row].marks & VIEW_READ) ? unread_view_read(f->row) : -1;
  if (src < 0) return;
  --g_view_reads;
  for (size_t i : {static_cast<size_t>(src), f->row}) {
    Row& r = rows[i];
    r.stats = NONE, r.note = N_UNINITIALIZED, r.shard = -1, r.key = -1, r.marks = NODATA;
  }
}

// An argument an op fills without reading it (copy_'s destination, dropout's bernoulli_ into
// empty_like, an out= argument, a collective's destination): recorded, not measured, linked to
// nothing (model/calls.py OVERWRITES_FIRST, capture/torch/dispatch.py OpInfo.unread).
void unread_row(const Head& h, int slot, int arg, const at::Tensor& t) {
  unmeasure_overwritten(t);
  int param = param_of(t);
  size_t i = new_row(h, param >= 0 ? IO_PARAM : IO_INPUT, slot, arg, t, param);
  rows[i].note = N_UNREAD;
}

int64_t written_by(const at::Tensor& t);  // dumpobs_same.h
bool holds_collective(const at::Tensor& t);  // dumpobs_same.h

// `t` is the very tensor an empty-like op made this step, written since only through views of
// it (its row is stale): DeepSeek-V3 fills `q = k.new_empty(...)` a half at a time, `q[..., :n]
// = a`, then takes `q[..., n:]` to write the other half. An op that only views it then finds
// one half still unwritten (before session 27 measured: other bytes each run, a difference).
// (A collective's result, which fills it whole, is data: FSDP's all-gather buffer.)
bool made_empty(const at::Tensor& t) {
  auto it = flow.find(reinterpret_cast<intptr_t>(t.unsafeGetTensorImpl()));
  return it != flow.end() && it->second.ref && !it->second.ref->expired() && (rows[it->second.row].marks & NODATA);
}

// The op being recorded only makes views of its inputs (set by before_op): it reads no element,
// so memory that holds no data yet (an empty's) is linked to, not measured.
bool g_view_op = false;
// The storages of the arguments the op writes in place that held no data (set by input_row,
// under mu): those written outputs hold none either, measured at their next read (another
// in-place write of the rest, MoE's `out[idx0] = y0; out[idx1] = y1`, then fills it). Only
// those: a fused optimizer writes parameters that hold data beside momentum buffers
// `empty_like` just made (SGD(fused=True)'s first step).
std::vector<intptr_t> g_wrote_empty;

int64_t input_row(const Head& h, int slot, int arg, const at::Tensor& t, int8_t io = IO_INPUT) {
  const Flow* f = find_flow(t);
  int64_t left = -1;  // the row of the op that left it holding no data: the producer of a read measured anew
  // A tensor made by an empty-like op: whatever wrote it since without an op (a custom
  // kernel filling empty_like's memory) is measured at a read. An op that only views it (DDP's
  // bucket views, FSDP's unsharded parameters, before an out= argument fills them) is linked.
  if (f && rows[f->row].marks && !g_view_op) {
    if (rows[f->row].marks & NODATA) {
      // an op that writes it in place (scatter_ into new_empty's memory: Reformer's and MoE
      // routers' inverse permutations) reads no data there: recorded unmeasured, as the API
      // level's first argument of such a call is; what it leaves is measured at its next read
      if (g_measure_here) {
        g_wrote_empty.push_back(storage_of(t));
        if (!g_inputs) return -1;
        size_t i = new_row(h, io, slot, arg, t, -1);
        rows[i].note = N_UNINITIALIZED, rows[i].marks = NODATA;
        return static_cast<int64_t>(i);
      }
      left = rows[f->row].id;
      f = nullptr;
    } else if (int64_t src = unread_view_read(f->row); src >= 0) {  // its data is read: it was data
      rows[src].marks &= ~VIEW_READ;
      --g_view_reads;
    }
  }
  if (f) {
    if (!g_inputs) return static_cast<int64_t>(f->row);
    size_t src = f->row;
    int param = f->param;
    size_t i = new_row(h, param >= 0 ? IO_PARAM : io, slot, arg, t, param, rows[src].id);
    rows[i].link = static_cast<int64_t>(src);
    rows[i].marks = rows[src].marks;
    return static_cast<int64_t>(i);
  }
  if (!g_inputs) return -1;
  int param = param_or_base_of(t);
  // (made in part by an in-place write through a view of it: that write is its producer; else
  // the op that left it holding no data, whose memory it is: compare/unfilled.py)
  int64_t made = written_by(t);
  size_t i = new_row(h, param >= 0 ? IO_PARAM : io, slot, arg, t, param, made >= 0 ? made : left);
  if (g_view_op && made_empty(t) && !holds_collective(t)) {  // written in part since: its next read measures it
    rows[i].note = N_UNINITIALIZED, rows[i].marks = NODATA;
    record_flow(t, i, version_of(t), param, false);
    return static_cast<int64_t>(i);
  }
  measure(i, t, h.data);
  if (g_view_op && param < 0) rows[i].marks = VIEW_READ, ++g_view_reads;
  record_flow(t, i, version_of(t), param, false);
  return static_cast<int64_t>(i);
}
