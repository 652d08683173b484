// The Python functions of the native dump observer (included by dumpobs.cpp).
#include "dumpobs_columns.h"

namespace {

int64_t g_installs = 0;  // install() calls so far (see dumpobs_calls.h)
void api_forget();        // (dumpobs_apicall.h)

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
  g_shard_bytes = std::max(shard_bytes, 1LL), g_want = g_probe = false, g_stop = Stop();
  // (route_slow and route_device stay as a test set them: it sets them before the dump starts)
  device_stats::release();
  {  // the pool keeps what the writer may hold at once: its queue and a shard being filled
    std::lock_guard<std::mutex> plock(pool_mu);
    g_pool_size = static_cast<size_t>((std::max(queue_bytes, 0LL) + g_shard_bytes) / CHUNK + 2);
  }
  std::lock_guard<std::recursive_mutex> lock(mu);
  N_VIEW = intern("view"), N_ALIAS = intern("alias");
  N_UNINITIALIZED = intern("uninitialized memory (empty): not measured");  // model/records.py
  N_UNREAD = intern("overwritten without being read: not measured");
  N_COLLECTIVE = intern("filled by a collective when it completes: measured at its next read");
  N_WRITTEN = intern("written in place by a call that returns nothing: measured at its next read");
  Py_RETURN_NONE;
}

PyObject* py_uninstall(PyObject*, PyObject*) {
  stop_observer([] {
    clear_step();
    reset_arena(true);  // its buffer given back
    pool_clear();
    chosen.clear(), params.clear(), learned.clear(), op_keeps.clear();
    g_tensor_ops = false;
    for (auto& [s, _] : path_ids) Py_DECREF(s);
    path_ids.clear();
    api_forget();
  });
  Py_CLEAR(g_hooks);
  Py_CLEAR(g_no_stats);
  g_rng.clear();
  Py_RETURN_NONE;
}

PyObject* py_configure(PyObject*, PyObject* a) {
  int on, phase;
  if (!PyArg_ParseTuple(a, "pi", &on, &phase)) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);
  g_on = on, g_phase = static_cast<int8_t>(phase);
  if (phase == RECOMPUTE) g_recompute_nodes = here().nodes.size();
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
  std::lock_guard<std::recursive_mutex> lock(mu);
  device_stats::release();
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

// kernel_clock(on) -> the statistics kernel's time on the capturing thread, in seconds, since the
// clock was last turned on (then reset; off: the time it had)
PyObject* py_kernel_clock(PyObject*, PyObject* on) {
  double seconds = static_cast<double>(g_kernel_ns) / 1e9;
  int want = PyObject_IsTrue(on);
  if (want < 0) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);
  if (want) g_kernel_ns = 0;
  g_kernel_clock = want != 0;
  return PyFloat_FromDouble(seconds);
}

PyObject* py_kernel_seconds(PyObject*, PyObject*) { return PyFloat_FromDouble(static_cast<double>(g_kernel_ns) / 1e9); }

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

// set_tensor_ops(on): full tensors only for the ops hooks.tensor_op(name) names (tensor_ops)
PyObject* py_set_tensor_ops(PyObject*, PyObject* a) {
  int on = PyObject_IsTrue(a);
  if (on < 0) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);
  g_tensor_ops = on;
  op_keeps.clear();
  Py_RETURN_NONE;
}

// route_slow(on): every tensor takes the path of tensors neither C++ path reads (Python's
// statistics, torch's copy to the host): lets tests run that path
PyObject* py_route_slow(PyObject*, PyObject* a) {
  int on = PyObject_IsTrue(a);
  if (on < 0) return nullptr;
  g_route_slow = on;
  Py_RETURN_NONE;
}

// set_device_staging(bytes): the staging buffer of each device and dtype (0: each tensor reduced alone)
PyObject* py_set_device_staging(PyObject*, PyObject* a) {
  long long n = PyLong_AsLongLong(a);
  if (n == -1 && PyErr_Occurred()) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);
  device_stats::release();
  device_stats::g_staging = std::max(n, 0LL);
  Py_RETURN_NONE;
}

// route_device(mode): 1, every tensor measured as one on another device is (torch reductions
// issued from C++, read back at the step's end: dumpobs_device.h), on a machine without one; 2,
// as on a device without the ops a staging buffer's reduction needs; 0, off
PyObject* py_route_device(PyObject*, PyObject* a) {
  long on = PyLong_AsLong(a);
  if (on == -1 && PyErr_Occurred()) return nullptr;
  device_stats::g_route = static_cast<int>(on);
  Py_RETURN_NONE;
}

// The args record of entry k's JSON text in `texts` (None, or a list beside the entries; -1:
// none). Entries of one parameter group share one text object: its record is made once a call.
int entry_args(PyObject* texts, Py_ssize_t k, PyObject*& last, int& last_at) {
  if (texts == Py_None || k >= PySequence_Fast_GET_SIZE(texts)) return -1;
  PyObject* t = PySequence_Fast_GET_ITEM(texts, k);
  if (t == last) return last_at;
  Py_ssize_t n = 0;
  const char* s = PyUnicode_Check(t) ? PyUnicode_AsUTF8AndSize(t, &n) : nullptr;
  last = t;
  last_at = s ? args_doc(s, static_cast<size_t>(n)) : -1;
  return last_at;
}

// The parameters of the optimizer step under way, as it began: (version, writes seen). One whose
// version and writes have not moved when the step ends was written where no op or version
// counter shows it (a fused optimizer's kernel: `AdamW(fused=True)` moves no version counter),
// so that write is counted (g_writes) and its row after the step is measured, not taken from
// a row made before the step.
std::unordered_map<const c10::TensorImpl*, std::pair<int64_t, int64_t>> g_stepping;  // (under mu)

void stepped(const at::Tensor& param) {
  auto it = g_stepping.find(param.unsafeGetTensorImpl());
  if (it == g_stepping.end()) return;
  if (it->second == std::make_pair(version_of(param), writes_to(param))) {
    forget_views(param);
    ++g_writes[storage_of(param)];
  }
  g_stepping.erase(it);
}

// record_params(op, [(call, module, param, grad or None, name or None)], before, texts=None):
// the optimizer step's parameters (and gradients) before it, with texts[k] (JSON: entry k's
// settings) as their args, its parameters after, as Recorder.record_params records them, one
// call per parameter. An entry of four, (call, module, param, name), has its gradient read
// here (`param.grad`; plain tensors only).
PyObject* py_record_params(PyObject*, PyObject* a) {
  const char* op;
  PyObject *items, *texts = Py_None;
  int before;
  if (!PyArg_ParseTuple(a, "sOp|O", &op, &items, &before, &texts)) return nullptr;
  PyObject* fast = PySequence_Fast(items, "a sequence of parameter entries is expected");
  if (!fast) return nullptr;
  if (texts != Py_None && !(texts = PySequence_Fast(texts, "a sequence of JSON texts is expected"))) {
    Py_DECREF(fast);
    return nullptr;
  }
  PyObject* last_text = nullptr;
  int last_at = -1;
  std::lock_guard<std::recursive_mutex> lock(mu);
  int op_name = intern(op), a_param = intern("param"), a_grad = intern("grad");
  if (before) g_stepping.clear();
  for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(fast); ++k) {
    long long call;
    const char* module;
    PyObject *p, *g = nullptr, *name, *entry = PySequence_Fast_GET_ITEM(fast, k);
    bool four = PyTuple_Check(entry) && PyTuple_GET_SIZE(entry) == 4;
    if (!(four ? PyArg_ParseTuple(entry, "LsOO", &call, &module, &p, &name)
               : PyArg_ParseTuple(entry, "LsOOO", &call, &module, &p, &g, &name)) ||
        !THPVariable_Check(p) || (four && !THPVariable_CheckExact(p))) {
      Py_DECREF(fast);
      if (texts != Py_None) Py_DECREF(texts);
      if (!PyErr_Occurred())
        PyErr_SetString(PyExc_TypeError, "(call, module, param, grad, name) or (call, module, plain tensor, name) expected");
      return nullptr;
    }
    Head h{g_seq++, call, OPTIMIZER, *module ? intern(module) : -1, op_name, -1, -1, -1};
    set_data(h);
    const at::Tensor& param = THPVariable_Unpack(p);
    if (!before) {
      stepped(param);
      if (!g_outputs) continue;
      output_row(h, 0, param, -1, false, nullptr);
      rows.back().arg = a_param;
      continue;
    }
    h.args = entry_args(texts, k, last_text, last_at);
    g_stepping[param.unsafeGetTensorImpl()] = {version_of(param), writes_to(param)};
    input_row(h, 0, a_param, param);
    const at::Tensor* grad = four ? (param.grad().defined() ? &param.grad() : nullptr)
                                  : (g != Py_None && THPVariable_Check(g) ? &THPVariable_Unpack(g) : nullptr);
    if (grad) {
      Head hg = h;
      hg.seq = g_seq++;
      int64_t r = input_row(hg, 1, a_grad, *grad, IO_GRAD);
      if (r >= 0 && name != Py_None) rows[r].param = intern(PyUnicode_AsUTF8(name));
    }
  }
  Py_DECREF(fast);
  if (texts != Py_None) Py_DECREF(texts);
  Py_RETURN_NONE;
}

}  // namespace

#include "dumpobs_calls.h"
#include "dumpobs_api.h"
#include "dumpobs_apicall.h"

namespace {

// collective(delta): this thread enters (1) or leaves (-1) a torch.distributed collective's call
PyObject* py_collective(PyObject*, PyObject* a) {
  long delta = PyLong_AsLong(a);
  if (delta == -1 && PyErr_Occurred()) return nullptr;
  Thread& T = here();
  T.collective = std::max(0, T.collective + static_cast<int>(delta));
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"collective", py_collective, METH_O, "collective(delta): this thread enters (1) or leaves (-1) a collective's call"},
    {"install", py_install, METH_VARARGS,
     "install(classify, hooks, rank, want_inputs, want_outputs, no_stats, shard_bytes, queue_bytes)"},
    {"uninstall", py_uninstall, METH_NOARGS, "remove the observer and forget everything"},
    {"configure", py_configure, METH_VARARGS, "configure(on, phase)"},
    {"register", py_register, METH_O, "register(on): the callback is registered only while capturing"},
    {"set_module", py_set_module, METH_O, "set_module(path): the module being executed"},
    {"set_params", py_set_params, METH_O, "set_params([(tensor, name)]): names of parameters and buffers"},
    {"begin_step", py_begin_step, METH_VARARGS, "begin_step(step, tensors, probe, budget): start recording a step"},
    {"tensor_counts", py_tensor_counts, METH_NOARGS, "tensor_counts(): (bytes, tensors, stop) of the step"},
    {"route_slow", py_route_slow, METH_O, "route_slow(on): every tensor through Python's statistics (tests)"},
    {"set_device_staging", py_set_device_staging, METH_O,
     "set_device_staging(bytes): each device's and dtype's staging buffer (0: tensors reduced one by one)"},
    {"route_device", py_route_device, METH_O,
     "route_device(mode): every tensor as one on another device (1; 2: no buffer reduced; 0: off; tests)"},
    {"set_tensor_ops", py_set_tensor_ops, METH_O, "set_tensor_ops(on): full tensors only for tensor_op(name) ops"},
    {"take_columns", py_take_columns, METH_NOARGS, "take_columns(): the step's rows as columns (see source)"},
    {"args_json", py_args_json, METH_VARARGS, "args_json(n, records, at, names): take_columns' arguments as JSON"},
    {"record_params", py_record_params, METH_VARARGS, "record_params(op, entries, before, texts=None): the optimizer's parameters"},
    {"record_call", py_record_call, METH_VARARGS, "record_call(op, module, phase, inputs, outputs, call): a module call"},
    {"record_module", py_record_module, METH_VARARGS,
     "record_module(op, module, phase, value, params, call, grads, kwargs) -> call or None: a module call, walked natively"},
    {"set_leaves", py_set_leaves, METH_O, "set_leaves(types): the types record_module's walk skips"},
    {"api_begin", py_api_begin, METH_VARARGS, "api_begin(op, module, phase, inputs, args, unread) -> token: an API call starts"},
    {"api_end", py_api_end, METH_VARARGS, "api_end(token, outputs, mutated, grads): an API call ended"},
    {"api_call", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(py_api_call)), METH_FASTCALL,
     "api_call(func, args, kwargs, op, module, phase, flags, failed): an API call, recorded and run"},
    {"api_setup", py_api_setup, METH_VARARGS,
     "api_setup(tensors_of, args_text) -> the object api_call returns for Python's walk"},
    {"api_write", py_api_write, METH_O, "api_write(items): tensors an API call writes without a version bump"},
    {"meta_skipped", py_meta_skipped, METH_NOARGS, "meta tensors seen (not measured)"},
    {"idle", py_idle, METH_NOARGS, "idle(): no step captured until begin_step: the chunk pool returns its memory"},
    {"set_async", py_set_async, METH_O, "set_async(on): statistics measured by the worker thread (opt-in)"},
    {"pool_bytes", py_pool_bytes, METH_NOARGS, "pool_bytes(): (bytes of tensor chunks allocated, idle in the pool)"},
    {"read_bytes", py_read_bytes, METH_NOARGS, "read_bytes(): bytes the statistics kernel was given, since loaded"},
    {"kernel_clock", py_kernel_clock, METH_O, "kernel_clock(on): time the statistics kernel (benchmarks); the seconds so far"},
    {"kernel_seconds", py_kernel_seconds, METH_NOARGS, "kernel_seconds(): the statistics kernel's time since kernel_clock(True)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_opscope_dump", "opscope.dump native observer", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__opscope_dump(void) { return chunk_type_ready() ? PyModule_Create(&module_def) : nullptr; }
