// The Python functions of the native dump observer (included by dumpobs.cpp).
namespace {

// Python strings of interned names, made once and shared by every row that holds them
std::vector<PyObject*> py_names;
PyObject* py_text[9] = {nullptr};  // "input" "output" "param" "forward" "backward" "optimizer" "cpu" "" "grad"

PyObject* name_obj(int i) {  // a new reference
  if (i < 0) Py_RETURN_NONE;
  if (static_cast<size_t>(i) >= py_names.size()) py_names.resize(names.size(), nullptr);
  PyObject*& o = py_names[i];
  if (!o) o = PyUnicode_FromString(names[i].c_str());
  Py_INCREF(o);
  return o;
}

const int IO_TEXT_AT[] = {0, 1, 2, 8};  // Io -> its text

PyObject* text(int i) {
  static const char* const t[] = {"input", "output", "param", "forward", "backward", "optimizer", "cpu", "", "grad"};
  if (!py_text[i]) py_text[i] = PyUnicode_InternFromString(t[i]);
  Py_INCREF(py_text[i]);
  return py_text[i];
}

std::vector<PyObject*> py_args;  // this step's argument texts, one object per call (take_columns)

PyObject* args_obj(int i) {
  if (i < 0) Py_RETURN_NONE;
  if (static_cast<size_t>(i) >= py_args.size()) py_args.resize(args_json.size(), nullptr);
  PyObject*& o = py_args[i];
  if (!o) o = PyUnicode_FromStringAndSize(args_json[i].data(), static_cast<Py_ssize_t>(args_json[i].size()));
  Py_INCREF(o);
  return o;
}

void clear_step() {
  rows.clear(), args_json.clear(), flow.clear(), geo.clear(), views.clear(), calls.clear(), seq_owner.clear();
  shared.clear(), views_json.clear(), shard_names.clear(), g_writes.clear();
  drop_shard();  // a step left unfinished (capture stopped): its tensors go
  g_seq = 0;
}

template <typename T>
PyObject* bytes_of(const std::vector<T>& v) {
  return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(v.data()), static_cast<Py_ssize_t>(v.size() * sizeof(T)));
}

void resolve_links() {  // sources come first: one pass resolves chains
  for (size_t i = 0; i < rows.size(); ++i) {
    Row& r = rows[i];
    if (r.same >= 0) {  // the statistics of the same bytes (resolved already: an earlier row)
      const Row& src = rows[r.same];
      r.stats = src.stats;
      std::memcpy(r.st, src.st, sizeof r.st);
      std::memcpy(r.cnt, src.cnt, sizeof r.cnt);
    }
    if (r.link < 0) continue;
    const Row& s = rows[r.link];
    // the same tensor's data; an input that is a view recorded earlier has its geometry too
    // (not in a size probe: its views count as what they are, as Recorder counts them)
    if (!g_probe && s.view >= 0 && r.view < 0 && r.numel == s.numel && r.shape == s.shape) r.view = s.view;
    r.shard = s.shard, r.key = s.key;
    // a note travels from the row linked to (an "alias" output, a meta tensor's), as Recorder
    // passes it on: not from the end of the chain
    if (s.note >= 0 && s.note != N_VIEW && r.note < 0) r.note = s.note;
    if (s.link >= 0) r.link = s.link;
    const Row& src = rows[r.link];
    r.stats = src.stats;
    std::memcpy(r.st, src.st, sizeof r.st);
    std::memcpy(r.cnt, src.cnt, sizeof r.cnt);
  }
}

// A string column as Arrow's buffers: int32 offsets, characters, validity bits.
struct Strings {
  std::vector<int32_t> offsets{0};
  std::string chars;
  std::vector<uint8_t> bits;
  explicit Strings(size_t n) : bits((n + 7) / 8) {}
  void add(size_t i, const std::string* s) {
    if (s) chars += *s, bits[i / 8] |= static_cast<uint8_t>(1u << (i % 8));
    offsets.push_back(static_cast<int32_t>(chars.size()));
  }
  PyObject* take() {
    return Py_BuildValue("NNN", bytes_of(offsets), PyBytes_FromStringAndSize(chars.data(), chars.size()),
                         bytes_of(bits));
  }
};

// The data columns of row i: its shard (index among the step's shards, -1: none) and the key
// and view strings.
int data_of(const Row& r, size_t i, Strings& keys, Strings& geometry) {
  bool stored = r.shard >= 0 && static_cast<size_t>(r.shard) < shard_names.size() && shard_names[r.shard];
  std::string key = stored ? "r" + std::to_string(r.key) : std::string();
  keys.add(i, stored ? &key : nullptr);
  geometry.add(i, r.view >= 0 ? &views_json[r.view] : nullptr);
  return stored ? r.shard : -1;
}

// take_columns() -> the step's rows as columns, ready for Arrow without a Python object per
// value (see native/table.py, Columns): (n, ints, strs, names, args, shape_offsets,
// shape_values, stats_f, stats_i, stats_valid, slow_links, keys, views). ints: int64 id, seq,
// call, slot, numel, producer (-1: none), column after column; strs: int32 indices into names
// (-1: none) of phase, module, op, io, arg, dtype, device, param, fwd_op, node, note, data;
// stats_f: float64 min..absmax; stats_i: uint64 nan, inf, zeros, hash; stats_valid: one byte
// per row, bit i set when statistic i (STAT_NAMES order) has a value; keys, views: string
// columns (Strings). The step's last shard is handed over first; the step's state is cleared.
PyObject* py_take_columns(PyObject*, PyObject*) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  flush_shard();
  resolve_links();
  size_t n = rows.size();
  int fixed = static_cast<int>(names.size());  // phase, io and "cpu" texts follow the names
  std::vector<int64_t> ints(n * 6);
  std::vector<int32_t> strs(n * 12), offsets(n + 1);
  Strings keys(n), geometry(n);
  std::vector<int64_t> shape;
  std::vector<double> sf(n * 6);
  std::vector<uint64_t> si(n * 4);
  std::vector<uint16_t> valid(n);
  std::unordered_map<int, int> dtype_slots;  // dtype -> its place among the step's dtype names
  PyObject* args = PyList_New(static_cast<Py_ssize_t>(n));
  PyObject* links = PyList_New(0);
  for (size_t i = 0; i < n; ++i) {
    const Row& r = rows[i];
    int64_t iv[6] = {r.id, r.seq, r.call, r.slot, r.numel, r.producer};
    for (int c = 0; c < 6; ++c) ints[c * n + i] = iv[c];
    int32_t sv[11] = {fixed + 3 + r.phase, r.module < 0 ? fixed + 7 : r.module, r.op, fixed + IO_TEXT_AT[r.io], r.arg, -1, r.device < 0 ? fixed + 6 : r.device,
                      r.param, r.fwd, r.node, r.note};
    for (int c = 0; c < 11; ++c) strs[c * n + i] = sv[c];
    auto slot = dtype_slots.try_emplace(r.dtype, static_cast<int>(dtype_slots.size())).first->second;
    strs[5 * n + i] = fixed + 9 + slot;  // the step's dtype names follow the fixed texts
    offsets[i] = static_cast<int32_t>(shape.size());
    shape.insert(shape.end(), r.shape.begin(), r.shape.end());
    uint16_t bits = 0;
    if (r.stats == HAVE) {
      bool empty = r.numel == 0;
      for (int c = 0; c < 6; ++c) {
        sf[c * n + i] = r.st[c];
        if (!empty || c == 4) bits |= 1u << c;
      }
      for (int c = 0; c < 4; ++c) si[c * n + i] = (empty && c < 3) ? 0 : r.cnt[c], bits |= 1u << (6 + c);
    }
    valid[i] = bits;
    strs[11 * n + i] = data_of(r, i, keys, geometry);
    PyList_SET_ITEM(args, i, args_obj(r.args));
    if (r.link >= 0 && rows[r.link].stats == SLOW) {
      PyObject* pair = Py_BuildValue("nn", static_cast<Py_ssize_t>(i), static_cast<Py_ssize_t>(r.link));
      PyList_Append(links, pair);
      Py_DECREF(pair);
    }
  }
  offsets[n] = static_cast<int32_t>(shape.size());
  PyObject* dict = PyList_New(0);
  for (int i = 0; i < fixed; ++i) {
    PyObject* o = name_obj(i);
    PyList_Append(dict, o);
    Py_DECREF(o);
  }
  for (int i = 0; i < 9; ++i) {  // input output param forward backward optimizer cpu "" grad
    PyObject* o = text(i);
    PyList_Append(dict, o);
    Py_DECREF(o);
  }
  std::vector<int> by_slot(dtype_slots.size());
  for (auto& [dtype, slot] : dtype_slots) by_slot[slot] = dtype;
  for (int d : by_slot) {
    PyObject* o = PyUnicode_FromString(dtype_name(d).c_str());
    PyList_Append(dict, o);
    Py_DECREF(o);
  }
  int shards_at = static_cast<int>(PyList_GET_SIZE(dict));  // the step's shard names follow
  for (const auto& name : shard_names) {
    PyObject* o = PyUnicode_FromString(name ? name->c_str() : "");
    PyList_Append(dict, o);
    Py_DECREF(o);
  }
  for (size_t i = 0; i < n; ++i)
    if (strs[11 * n + i] >= 0) strs[11 * n + i] += shards_at;
  PyObject* out = Py_BuildValue("nNNNNNNNNNNNN", static_cast<Py_ssize_t>(n), bytes_of(ints), bytes_of(strs), dict,
                                args, bytes_of(offsets), bytes_of(shape), bytes_of(sf), bytes_of(si), bytes_of(valid),
                                links, keys.take(), geometry.take());
  for (PyObject* o : py_args) Py_XDECREF(o);
  py_args.clear();
  clear_step();
  return out;
}

int64_t g_installs = 0;  // install() calls so far (see dumpobs_calls.h)

PyObject* py_install(PyObject*, PyObject* a) {
  PyObject *classify, *hooks, *no_stats;
  long long rank, shard_bytes, queue_bytes;
  int inputs, outputs;
  if (!PyArg_ParseTuple(a, "OOLppOLL", &classify, &hooks, &rank, &inputs, &outputs, &no_stats, &shard_bytes,
                        &queue_bytes))
    return nullptr;
  if (!start_observer(classify, "dump")) return nullptr;
  Py_INCREF(hooks), Py_INCREF(no_stats);
  g_hooks = hooks, g_no_stats = no_stats;
  g_rank = rank, g_inputs = inputs, g_outputs = outputs, g_next_id = 0, g_meta = 0, g_step = -1;
  ++g_installs;  // gradient hooks of an earlier dump go quiet
  g_shard_bytes = std::max(shard_bytes, 1LL), g_want = g_probe = g_route_slow = false, g_stop = Stop();
  {  // the pool keeps what the writer may hold at once: its queue and a shard being filled
    std::lock_guard<std::mutex> plock(pool_mu);
    g_pool_size = static_cast<size_t>((std::max(queue_bytes, 0LL) + g_shard_bytes) / CHUNK + 2);
  }
  std::lock_guard<std::recursive_mutex> lock(mu);
  N_VIEW = intern("view"), N_ALIAS = intern("alias");
  Py_RETURN_NONE;
}

PyObject* py_uninstall(PyObject*, PyObject*) {
  stop_observer([] {
    clear_step();
    pool_clear();
    chosen.clear(), params.clear(), op_keeps.clear();
    g_tensor_ops = false;
    for (auto& [s, _] : path_ids) Py_DECREF(s);
    path_ids.clear();
  });
  Py_CLEAR(g_hooks);
  Py_CLEAR(g_no_stats);
  t_rng.clear();
  Py_RETURN_NONE;
}

PyObject* py_configure(PyObject*, PyObject* a) {
  int on, phase;
  if (!PyArg_ParseTuple(a, "pi", &on, &phase)) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);
  g_on = on, g_phase = static_cast<int8_t>(phase);
  Py_RETURN_NONE;
}

// set_module(path): the module being executed; path strings are held and interned once
PyObject* py_set_module(PyObject*, PyObject* a) {
  if (!PyUnicode_Check(a)) {
    PyErr_SetString(PyExc_TypeError, "a module path (str) is expected");
    return nullptr;
  }
  std::lock_guard<std::recursive_mutex> lock(mu);
  auto it = path_ids.find(a);
  if (it == path_ids.end()) {
    Py_INCREF(a);
    it = path_ids.emplace(a, PyUnicode_GET_LENGTH(a) ? intern(PyUnicode_AsUTF8(a)) : -1).first;
  }
  g_module = it->second;
  Py_RETURN_NONE;
}

// set_params([(tensor, name), ...]): parameters and buffers by name
PyObject* py_set_params(PyObject*, PyObject* a) {
  PyObject* fast = PySequence_Fast(a, "a sequence of (tensor, name) is expected");
  if (!fast) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    PyObject *t, *name;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "OU", &t, &name) || !THPVariable_Check(t)) {
      Py_DECREF(fast);
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "(tensor, name) pairs are expected");
      return nullptr;
    }
    params.emplace(reinterpret_cast<intptr_t>(THPVariable_Unpack(t).unsafeGetTensorImpl()),
                   intern(PyUnicode_AsUTF8(name)));
  }
  Py_DECREF(fast);
  Py_RETURN_NONE;
}

// begin_step(step, tensors, probe, budget): full tensors wanted (data="tensor", until the limit),
// or a size probe (nothing measured); budget: bytes the step may store (-1: no limit)
PyObject* py_begin_step(PyObject*, PyObject* a) {
  long long step, budget;
  int want, probe;
  if (!PyArg_ParseTuple(a, "LppL", &step, &want, &probe, &budget)) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);
  clear_step();
  g_step = step, g_want = want, g_probe = probe, g_budget = budget, g_stored = g_stored_n = 0;
  t_pending = Pending{};
  pool_keep(want && !probe);
  Py_RETURN_NONE;
}

// idle(): no step is captured until the next begin_step: the chunk pool returns its memory
// (also each chunk the writer lets go of from now on)
PyObject* py_idle(PyObject*, PyObject*) {
  pool_keep(false);
  Py_RETURN_NONE;
}

// pool_bytes() -> (bytes of chunks allocated, bytes of them idle in the pool)
PyObject* py_set_async(PyObject*, PyObject* on) {
  g_async_on = PyObject_IsTrue(on) == 1;
  Py_RETURN_NONE;
}

PyObject* py_pool_bytes(PyObject*, PyObject*) {
  std::lock_guard<std::mutex> lock(pool_mu);
  return Py_BuildValue("LL", static_cast<long long>(g_chunks_live * CHUNK), static_cast<long long>(pool.size() * CHUNK));
}

PyObject* py_meta_skipped(PyObject*, PyObject*) { return PyLong_FromLongLong(g_meta); }

PyObject* py_read_bytes(PyObject*, PyObject*) { return PyLong_FromLongLong(g_read_bytes); }

// tensor_counts() -> (bytes, tensors) stored this step, and where tensor_limit_mb stopped it:
// None or (nbytes of the tensor refused, phase, module, op, io, slot)
PyObject* py_tensor_counts(PyObject*, PyObject*) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  PyObject* stop = Py_None;
  Py_INCREF(Py_None);
  if (g_stop.nbytes >= 0) {
    Py_DECREF(Py_None);
    static const char* const io_text[] = {"input", "output", "param", "grad"};  // Io
    const Stop& s = g_stop;
    stop = Py_BuildValue("Lssssi", static_cast<long long>(s.nbytes), PHASE_TEXT[s.phase],
                         s.module < 0 ? "" : names[s.module].c_str(), names[s.op].c_str(), io_text[s.io], s.slot);
  }
  return Py_BuildValue("LLN", static_cast<long long>(g_stored), static_cast<long long>(g_stored_n), stop);
}

// route_slow(on): every tensor takes the path of tensors on another device (Python statistics,
// torch's copy to the host): lets tests run that path on a machine without one
// set_tensor_ops(on): full tensors only for the ops hooks.tensor_op(name) names (tensor_ops)
PyObject* py_set_tensor_ops(PyObject*, PyObject* a) {
  int on = PyObject_IsTrue(a);
  if (on < 0) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);
  g_tensor_ops = on;
  op_keeps.clear();
  Py_RETURN_NONE;
}

PyObject* py_route_slow(PyObject*, PyObject* a) {
  int on = PyObject_IsTrue(a);
  if (on < 0) return nullptr;
  g_route_slow = on;
  Py_RETURN_NONE;
}

// record_params(op, [(call, module, param, grad or None, name or None)], before): the
// optimizer step's parameters (and gradients) before it, its parameters after, as
// Recorder.record_params records them, one call per parameter.
PyObject* py_record_params(PyObject*, PyObject* a) {
  const char* op;
  PyObject* items;
  int before;
  if (!PyArg_ParseTuple(a, "sOp", &op, &items, &before)) return nullptr;
  PyObject* fast = PySequence_Fast(items, "a sequence of parameter entries is expected");
  if (!fast) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);
  int op_name = intern(op), a_param = intern("param"), a_grad = intern("grad");
  for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(fast); ++k) {
    long long call;
    const char* module;
    PyObject *p, *g, *name;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, k), "LsOOO", &call, &module, &p, &g, &name) ||
        !THPVariable_Check(p)) {
      Py_DECREF(fast);
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "(call, module, param, grad, name) expected");
      return nullptr;
    }
    Head h{g_seq++, call, OPTIMIZER, *module ? intern(module) : -1, op_name, -1, -1, -1};
    set_data(h);
    const at::Tensor& param = THPVariable_Unpack(p);
    if (!before) {
      if (!g_outputs) continue;
      output_row(h, 0, param, -1, false, nullptr);
      rows.back().arg = a_param;
      continue;
    }
    input_row(h, 0, a_param, param);
    if (g != Py_None && THPVariable_Check(g)) {
      Head hg = h;
      hg.seq = g_seq++;
      int64_t r = input_row(hg, 1, a_grad, THPVariable_Unpack(g), IO_GRAD);
      if (r >= 0 && name != Py_None) rows[r].param = intern(PyUnicode_AsUTF8(name));
    }
  }
  Py_DECREF(fast);
  Py_RETURN_NONE;
}

}  // namespace

#include "dumpobs_calls.h"
#include "dumpobs_api.h"

namespace {

PyMethodDef methods[] = {
    {"install", py_install, METH_VARARGS,
     "install(classify, hooks, rank, want_inputs, want_outputs, no_stats, shard_bytes, queue_bytes)"},
    {"uninstall", py_uninstall, METH_NOARGS, "remove the observer and forget everything"},
    {"configure", py_configure, METH_VARARGS, "configure(on, phase)"},
    {"register", py_register, METH_O, "register(on): the callback is registered only while capturing"},
    {"set_module", py_set_module, METH_O, "set_module(path): the module being executed"},
    {"set_params", py_set_params, METH_O, "set_params([(tensor, name)]): names of parameters and buffers"},
    {"begin_step", py_begin_step, METH_VARARGS, "begin_step(step, tensors, probe, budget): start recording a step"},
    {"tensor_counts", py_tensor_counts, METH_NOARGS, "tensor_counts(): (bytes, tensors, stop) of the step"},
    {"route_slow", py_route_slow, METH_O, "route_slow(on): every tensor as one on another device (tests)"},
    {"set_tensor_ops", py_set_tensor_ops, METH_O, "set_tensor_ops(on): full tensors only for tensor_op(name) ops"},
    {"take_columns", py_take_columns, METH_NOARGS, "take_columns(): the step's rows as columns (see source)"},
    {"record_params", py_record_params, METH_VARARGS, "record_params(op, entries, before): the optimizer's parameters"},
    {"record_call", py_record_call, METH_VARARGS, "record_call(op, module, phase, inputs, outputs, call): a module call"},
    {"api_begin", py_api_begin, METH_VARARGS, "api_begin(op, module, phase, inputs, args) -> token: an API call starts"},
    {"api_end", py_api_end, METH_VARARGS, "api_end(token, outputs, mutated, grads): an API call ended"},
    {"meta_skipped", py_meta_skipped, METH_NOARGS, "meta tensors seen (not measured)"},
    {"idle", py_idle, METH_NOARGS, "idle(): no step captured until begin_step: the chunk pool returns its memory"},
    {"set_async", py_set_async, METH_O, "set_async(on): statistics measured by the worker thread (opt-in)"},
    {"pool_bytes", py_pool_bytes, METH_NOARGS, "pool_bytes(): (bytes of tensor chunks allocated, idle in the pool)"},
    {"read_bytes", py_read_bytes, METH_NOARGS, "read_bytes(): bytes the statistics kernel was given, since loaded"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_opscope_dump", "opscope.dump native observer", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__opscope_dump(void) { return chunk_type_ready() ? PyModule_Create(&module_def) : nullptr; }
