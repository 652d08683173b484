// Native aten-level dump: the per-op work of recorder.Recorder and dispatch.DumpDispatchMode,
// run from the shared RecordFunction observer (observer.h) instead of a Python
// TorchDispatchMode. Used for aten-level dumps of statistics or of every full tensor (see
// native/aten.py, which falls back to the Python mode for everything else).
//
// Rows are kept in C++ and handed to Python once per step (take_rows), in the Python
// recorder's row layout. Each tensor is measured once: an input that an earlier recorded op
// produced links to that row (producer); views and aliases link to the row they share
// elements with; a row that holds bytes already read (a copy, or a tensor the rules measure
// anew, unchanged since) takes that row's statistics without reading them again. Statistics of CPU tensors come from the same one-pass kernel as the Python
// path (fastats_kernel.h), run by a worker thread while the step goes on (dumpobs_async.h; an
// op that writes a storage in place first waits for the measurements reading it), or at the op
// where no per-op observer sees such writes (module and api levels) and for full tensors.
// Tensors on another device (CUDA, NPU) are measured by torch reductions issued from C++ and read
// back at the step's end (dumpobs_device.h); what neither reads (an unusual dtype) goes to Python (`slow`).
// With data="tensor" each measured tensor's bytes are copied into the step's tensor shards at
// the op too (dumpobs_measure.h, dumpobs_shards.h), and a view keeps its input's data.
#include "observer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/aminmax.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/bitwise_right_shift.h>
#include <ATen/ops/bitwise_xor.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/isinf.h>
#include <ATen/ops/isnan.h>
#include <ATen/ops/linalg_vector_norm.h>
#include <ATen/ops/repeat_interleave.h>
#include <ATen/ops/segment_reduce.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/view_as_real.h>
#include <ATen/ops/zeros.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <chrono>
#include <map>
#include <typeinfo>
#include <sys/mman.h>

#include "fastats_kernel.h"

#include <c10/util/SmallVector.h>

#include <charconv>
#include <memory_resource>
#include <optional>
#include <unordered_set>

namespace {

enum Io : int8_t { IO_INPUT = 0, IO_OUTPUT = 1, IO_PARAM = 2, IO_GRAD = 3 };
// sizes and strides kept inline (no allocation per row or per data-flow key up to 5 dimensions)
using Dims = c10::SmallVector<int64_t, 5>;
Dims dims(at::IntArrayRef v) { return Dims(v.begin(), v.end()); }
const char* PHASE_TEXT[] = {"forward", "backward", "optimizer"};
enum Stats : int8_t { NONE = 0, HAVE = 1, SLOW = 2 };

struct Row {
  int64_t id, seq, call, numel, producer = -1;
  int8_t phase, io, stats = NONE;
  int module, op, slot, arg, dtype, device, param = -1, fwd = -1, node = -1, args = -1, note = -1;
  Dims shape;
  int64_t link = -1;  // index of the row whose statistics this one shares
  int shard = -1, view = -1;  // the step's shard holding its data, its view geometry (views_json)
  int64_t key = -1;           // id of the row whose tensor (key r<id>) holds its data
  int64_t same = -1;          // an earlier row holding the very same bytes: its statistics, nothing else
  uint8_t marks = 0;          // NODATA, VIEW_READ (carried along links)
  // a view's row holding its base's statistics, whose elements may lie in another row-major
  // order than the view's (a transpose's): its copies are read (own_order)
  bool reordered = false;
  // statistics summed in memory order (a transposed plane's, measure_transposed): its copies
  // are read, as the Python path reads them (own_order), their sums in row-major order
  bool memory_order = false;
  double st[6];
  unsigned long long cnt[4];  // nan, inf, zeros, hash
};

struct Flow {
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> ref;
  size_t row;
  int64_t version;
  int param;
  // views (keyed by their data's address and geometry): their storage, held weakly, so that no
  // other storage takes its address while the step runs and its memory is freed as without the dump
  std::optional<c10::weak_intrusive_ptr<c10::StorageImpl>> storage;
  int64_t writes = 0;  // in-place calls seen writing its storage by then (g_writes)

  // Is `t`'s storage the one this view was recorded on? (Its data's address alone may be a new
  // storage's, once the recorded one freed its memory.)
  bool on_storage_of(const at::Tensor& t) const {
    return storage && storage->_unsafe_get_target() == t.storage().unsafeGetStorageImpl();
  }
};

// Where a tensor's elements are: a place (a storage's base, or a version counter), a start
// in it (an element offset, or the data address), their layout and dtype. Keys the views
// registered by geometry, and autograd's saved tensors, which are new tensors sharing the
// elements and version counter of the one recorded (a dispatch mode sees them made by `detach`).
struct Elems {
  intptr_t place;
  int64_t start;
  Dims shape, stride;
  int8_t dtype;
  bool operator==(const Elems&) const = default;
};
struct ElemsHash {
  size_t operator()(const Elems& g) const {
    size_t h = std::hash<intptr_t>()(g.place) ^ (std::hash<int64_t>()(g.start) << 1) ^ g.dtype;
    for (int64_t v : g.shape) h = h * 31 + std::hash<int64_t>()(v);
    for (int64_t v : g.stride) h = h * 17 + std::hash<int64_t>()(v);
    return h;
  }
};
struct SharedFlow {
  size_t row;
  int64_t version;
  int param;
  // A weak reference to the counter: its address is not reused while held, and autograd
  // still sees the counter unshared (make_variable would copy a tensor whose counter is shared).
  c10::weak_intrusive_ptr<c10::intrusive_ptr_target> keep;
  int64_t writes = 0;  // in-place writes seen on its storage by then (g_writes)
};

struct KeyHash {
  size_t operator()(const std::tuple<int, int, int>& k) const {
    return (static_cast<size_t>(std::get<0>(k)) * 1000003u) ^ (static_cast<size_t>(std::get<1>(k)) << 8) ^
           static_cast<size_t>(std::get<2>(k));
  }
};

// ---- state ---------------------------------------------------------------------------------
PyObject* g_hooks = nullptr;  // rng(device), slow(row, tensor), selected(module, op, phase), error(text)
PyObject* g_no_stats = nullptr;
int64_t g_rank = 0, g_step = -1, g_next_id = 0, g_seq = 0, g_meta = 0;
bool g_inputs = true, g_outputs = true;
std::vector<Row> rows;
std::string args_bin;  // the step's calls' arguments (dumpobs_args.h), under mu
// The step's data-flow maps take their nodes from one arena, given back whole at the step's end
// (clear_step): no malloc and free per entry (~300 instructions an entry). The arena's buffer
// is kept between steps, grown to what the largest step took.
struct Counted : std::pmr::memory_resource {  // what the arena took beyond its buffer, since its last reset
  size_t taken = 0;
  void* do_allocate(size_t n, size_t align) override {
    taken += n;
    return std::pmr::new_delete_resource()->allocate(n, align);
  }
  void do_deallocate(void* p, size_t n, size_t align) override {
    std::pmr::new_delete_resource()->deallocate(p, n, align);
  }
  bool do_is_equal(const std::pmr::memory_resource& o) const noexcept override { return this == &o; }
};
Counted g_beyond;
std::vector<std::byte> g_arena_buffer(64 << 10);
std::optional<std::pmr::monotonic_buffer_resource> g_arena{std::in_place, g_arena_buffer.data(), g_arena_buffer.size(),
                                                           &g_beyond};
template <typename K, typename V, typename H = std::hash<K>>
using StepMap = std::pmr::unordered_map<K, V, H>;
StepMap<intptr_t, Flow> flow{&*g_arena};
StepMap<Elems, Flow, ElemsHash> geo{&*g_arena};
StepMap<intptr_t, std::vector<Elems>> views{&*g_arena};  // storage -> geometries registered on it
StepMap<Elems, SharedFlow, ElemsHash> shared{&*g_arena};
StepMap<std::tuple<int, int, int>, int64_t, KeyHash> calls{&*g_arena};
// storage -> in-place calls seen writing it this step (aten level: ops writing an argument; api
// level: in-place calls). A write through another tensor of the same storage (`p.data.mul_()`,
// whose version counter is not p's) moves no version counter of `p`: this does, and a row of
// `p` made before it is no longer taken for `p` (same_tensor, find_flow).
StepMap<intptr_t, int64_t> g_writes{&*g_arena};
// Bases of views written in place (`buf[:, 2] = x`), by TensorImpl: the write's output row and
// the base's version then (dumpobs_same.h). Looked up only by a read measured anew anyway.
struct WrittenBase {
  c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl> ref;
  size_t row;
  int64_t version;
  bool collective;  // a collective's result: written again as it arrives (its version moves on)
};
StepMap<intptr_t, WrittenBase> g_written{&*g_arena};

template <typename M>
void renew(M& m) {  // emptied, its nodes and buckets left to the arena (a new map's buckets are inline)
  M(m.get_allocator()).swap(m);
}

// Row::marks. NODATA: memory no op has written yet (an empty-like op's output, a view of one).
// VIEW_READ: measured anew by an op that only views it (on the row measured: cleared when an op
// reads its data; the rows linked to it keep the mark, to find it).
constexpr uint8_t NODATA = 1, VIEW_READ = 2;
int64_t g_view_reads = 0;  // rows marked VIEW_READ and not read since (see unmeasure_overwritten)

// The step's maps emptied and the arena reset (its buffer grown when the step took more); under mu.
// shrink: the buffer given back too (the dump stops).
void reset_arena(bool shrink = false) {
  renew(flow), renew(geo), renew(views), renew(shared), renew(calls), renew(g_writes), renew(g_written);
  g_view_reads = 0;
  g_arena->release();
  if (g_beyond.taken == 0 && !shrink) return;
  size_t size = shrink ? (64 << 10) : g_arena_buffer.size() + g_beyond.taken;
  g_arena.reset();  // the maps keep its address: the new resource is made in the same place
  std::vector<std::byte>(size).swap(g_arena_buffer);
  g_arena.emplace(g_arena_buffer.data(), g_arena_buffer.size(), &g_beyond);
  g_beyond.taken = 0;
}
std::unordered_map<std::tuple<int, int, int>, bool, KeyHash> chosen;
bool g_tensor_ops = false;                  // full tensors only for the ops tensor_op() names
std::unordered_map<int, bool> op_keeps;     // op -> keeps full tensors (with g_tensor_ops)
std::unordered_map<intptr_t, int> params;     // TensorImpl -> interned name
// parameters named where a module holds them (learn_param): held weakly, so that no other
// tensor takes a freed one's TensorImpl address (and its name) while the dump runs
std::vector<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> learned;
std::unordered_map<PyObject*, int> path_ids;  // module path strings (held) -> interned
std::string g_rng;  // "rng" JSON of the random op starting (under mu: set and read within its before_op)
// full tensors (data="tensor"): wanted this step (until tensor_limit_mb stops them), or only
// counted by a size probe; bytes the step may store (-1: no limit), stored; where the limit hit
bool g_want = false, g_probe = false, g_route_slow = false;
int64_t g_budget = -1, g_stored = 0, g_stored_n = 0;
struct Stop {
  int64_t nbytes = -1;  // -1: not stopped
  int8_t phase = 0, io = 0;
  int module = -1, op = -1, slot = 0;
};
Stop g_stop;
std::vector<std::string> views_json;  // this step's view geometries
int N_VIEW = -1, N_ALIAS = -1, N_UNINITIALIZED = -1, N_UNREAD = -1, N_COLLECTIVE = -1, N_WRITTEN = -1;  // interned notes (set at install)

int64_t version_of(const at::Tensor& t) { return t.is_inference() ? -1 : static_cast<int64_t>(t._version()); }

// Made in the optional it is returned in (no shape moved: ~200 instructions a key, ~190 keys a
// tiny step).
std::optional<Elems> elems(intptr_t place, int64_t start, const at::Tensor& t) {
  std::optional<Elems> e(std::in_place);
  e->place = place, e->start = start, e->dtype = static_cast<int8_t>(t.scalar_type());
  at::IntArrayRef sizes = t.sizes(), strides = t.strides();
  e->shape.assign(sizes.begin(), sizes.end());
  e->stride.assign(strides.begin(), strides.end());
  return e;
}

std::optional<Elems> geometry(const at::Tensor& t) {
  if (!t.has_storage() || t.is_meta()) return std::nullopt;
  return elems(reinterpret_cast<intptr_t>(t.storage().data()), t.storage_offset(), t);
}

std::optional<Elems> shared_key(const at::Tensor& t) {
  if (t.is_inference() || !t.has_storage() || t.is_meta()) return std::nullopt;
  const c10::VariableVersion& v = t.unsafeGetTensorImpl()->version_counter();
  if (!v.enabled()) return std::nullopt;
  const void* counter = *reinterpret_cast<const void* const*>(&v);  // its only member: the counter
  return elems(reinterpret_cast<intptr_t>(counter), reinterpret_cast<intptr_t>(t.const_data_ptr()), t);
}

intptr_t storage_of(const at::Tensor& t) {
  return t.has_storage() ? reinterpret_cast<intptr_t>(t.storage().data()) : reinterpret_cast<intptr_t>(t.unsafeGetTensorImpl());
}

// ---- Python hooks ----------------------------------------------------------------------------
void on_error(const char* what);

// A hook raised (with the GIL held): opscope's own failure, reported; capture stops.
void hook_failed(const char* hook) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyObject* text = value ? PyObject_Str(value) : nullptr;
  std::string message = c10::str(hook, ": ", type ? reinterpret_cast<PyTypeObject*>(type)->tp_name : "error", ": ",
                                 text && PyUnicode_Check(text) ? PyUnicode_AsUTF8(text) : "");
  Py_XDECREF(text), Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
  PyErr_Clear();
  std::lock_guard<std::recursive_mutex> lock(mu);  // (held already, but for api_backward_ran's call)
  g_on = false;
  on_error(message.c_str());
}

bool selected(int module, int op, int8_t phase) {
  auto key = std::make_tuple(module, op, static_cast<int>(phase));
  auto it = chosen.find(key);
  if (it != chosen.end()) return it->second;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* r = PyObject_CallMethod(g_hooks, "selected", "ssi", module < 0 ? "" : names[module].c_str(),
                                    names[op].c_str(), static_cast<int>(phase));
  bool yes = r && PyObject_IsTrue(r) == 1;
  if (!r) hook_failed("selected");
  Py_XDECREF(r);
  PyGILState_Release(gil);
  return chosen[key] = yes;
}

// With tensor_ops (set_tensor_ops), does op `op` keep full tensors? Asked once per op.
bool keeps_tensors(int op) {
  if (!g_tensor_ops) return true;
  auto it = op_keeps.find(op);
  if (it != op_keeps.end()) return it->second;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* r = PyObject_CallMethod(g_hooks, "tensor_op", "s", names[op].c_str());
  bool yes = r && PyObject_IsTrue(r) == 1;
  if (!r) hook_failed("tensor_op");
  Py_XDECREF(r);
  PyGILState_Release(gil);
  return op_keeps[op] = yes;
}

void slow(size_t row, const at::Tensor& t) {
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* pt = wrap(t);
  PyObject* r = PyObject_CallMethod(g_hooks, "slow", "nO", static_cast<Py_ssize_t>(row), pt);
  if (!r) hook_failed("slow statistics");
  Py_XDECREF(r);
  Py_DECREF(pt);
  PyGILState_Release(gil);
}

void on_error(const char* what) {
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* r = PyObject_CallMethod(g_hooks, "error", "s", what);
  if (!r) PyErr_WriteUnraisable(g_hooks);
  Py_XDECREF(r);
  PyGILState_Release(gil);
}

#include "dumpobs_shards.h"

#include "dumpobs_async.h"

#include "dumpobs_measure.h"

#include "dumpobs_flow.h"

#include "dumpobs_inputs.h"

#include "dumpobs_same.h"

}  // namespace

namespace {
#include "dumpobs_args.h"

#include "dumpobs_op.h"
}  // namespace

#include "dumpobs_rng.h"

#include "dumpobs_module.h"
