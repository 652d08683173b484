// Module-level calls recorded by the native dump (included by dumpobs_module.h): the module
// hooks hand each call's inputs, own parameters and outputs (and the gradients of its
// outputs in backward) to record_call, which makes the rows as Recorder.record does,
// measures at once (no per-op observer is registered at module level) and keeps the data
// flow, so that a module's input that an earlier module returned is linked, not measured.
namespace {

// Calls fn(slot, arg name index or -1, tensor) for each (slot, arg or None, tensor) item;
// false (a Python error set) when an item is malformed.
template <typename F>
bool each_call_item_obj(PyObject* items, F fn) {
  PyObject* fast = PySequence_Fast(items, "a sequence of (slot, arg, tensor) is expected");
  if (!fast) return false;
  for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(fast); ++k) {
    int slot;
    PyObject *arg, *t;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, k), "iOO", &slot, &arg, &t) || !THPVariable_Check(t) ||
        (arg != Py_None && !PyUnicode_Check(arg))) {
      Py_DECREF(fast);
      if (!PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "(slot, arg name or None, tensor) expected");
      return false;
    }
    fn(slot, arg == Py_None ? -1 : intern(PyUnicode_AsUTF8(arg)), t);
  }
  Py_DECREF(fast);
  return true;
}

// The same, each tensor unpacked.
template <typename F>
bool each_call_item(PyObject* items, F fn) {
  return each_call_item_obj(items, [&](int slot, int arg, PyObject* t) { fn(slot, arg, THPVariable_Unpack(t)); });
}

// The gradient at module output `slot`, in backward: one row, as the Python path's tensor
// hook makes it. A C++ tensor hook: the autograd engine calls it without taking the GIL.
// (g_installs, counted by install(): a hook left on a tensor by an earlier dump does nothing)
void grad_row(int64_t install, int op, int mod, int slot, const at::TensorBase& grad) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  if (install != g_installs || !g_on || !grad.defined()) return;
  try {
    static const int a_grad = intern("grad_output");
    int64_t call = calls[std::make_tuple(mod, static_cast<int>(BACKWARD), op)]++;
    Head h{g_seq++, call, BACKWARD, mod, op, -1, -1, -1};
    set_data(h);
    input_row(h, slot, a_grad, at::Tensor(grad));
  } catch (const std::exception& e) {
    g_on = false;
    on_error(e.what());
  }
}

// An output of activation checkpointing's reentrant Function gets none: its gradient is that of
// its uses outside the checkpointed block only (T5's position bias, also read inside the block
// that makes it: the other block's share, not the module's). When no output gets one at all:
// capture/torch/levels.py hooks_gradients.
bool reentrant_output(const at::Tensor& t) {
  // only a Python Function's node (torch::autograd::PyNode, whose type information torch does not
  // export) can be it: no name is made for the others (a C++ node's is demangled each time)
  const torch::autograd::Node* fn = t.grad_fn().get();
  return fn && std::strcmp(typeid(*fn).name(), "N5torch8autograd6PyNodeE") == 0 &&
         fn->name() == "CheckpointFunctionBackward";
}

void hook_gradients(const Head& h, const std::vector<std::pair<int, at::Tensor>>& outs) {
  for (const auto& [slot, t] : outs) {
    if (!t.requires_grad() || reentrant_output(t)) continue;
    int64_t install = g_installs;
    int op = h.op, mod = h.module, s = slot;
    t.register_hook([install, op, mod, s](const at::TensorBase& grad) { grad_row(install, op, mod, s, grad); });
  }
}

// The arguments of record_call and record_module: (op, module, phase, first, second, call[,
// grads[, kwargs]])
struct CallArgs {
  const char *op, *module;
  int phase, grads = 0;
  long long call;
  PyObject *first, *second, *kwargs = Py_None;
  bool parse(PyObject* a) {
    return PyArg_ParseTuple(a, "ssiOOL|pO", &op, &module, &phase, &first, &second, &call, &grads, &kwargs);
  }
};

// The head of a module call's rows (under `mu`); call < 0 takes the next call index of
// (module, phase, op) (a module's entry), else it is the entry's index (its exit).
Head call_head(const char* op, const char* module, int phase, long long& call) {
  int op_name = intern(op), mod = *module ? intern(module) : -1;
  if (call < 0) call = calls[std::make_tuple(mod, phase, op_name)]++;
  Head h{g_seq++, call, static_cast<int8_t>(phase), mod, op_name, -1, -1, -1};
  set_data(h);
  return h;
}

// record_call(op, module, phase, inputs, outputs, call, grads) -> call: one module call's
// rows. inputs / outputs: sequences of (slot, arg name or None, tensor); call < 0 takes the
// next call index of (module, phase, op) (a module's entry), else the entry's index (its
// exit); grads: hook the outputs that require grad, for a row of their gradient in backward.
PyObject* py_record_call(PyObject*, PyObject* a) {
  CallArgs c;
  if (!c.parse(a)) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);
  Head h = call_head(c.op, c.module, c.phase, c.call);
  bool grads = c.grads;
  bool ok = !g_inputs || each_call_item(c.first, [&](int slot, int arg, const at::Tensor& t) {
    input_row(h, slot, arg, t);
  });
  std::vector<std::pair<int, at::Tensor>> hooked;
  ok = ok && each_call_item(c.second, [&](int slot, int arg, const at::Tensor& t) {
    if (g_outputs) {
      output_row(h, slot, t, -1, false, nullptr);
      if (arg >= 0) rows.back().arg = arg;
    }
    if (grads) hooked.emplace_back(slot, t);
  });
  if (!ok) return nullptr;
  hook_gradients(h, hooked);
  return PyLong_FromLongLong(c.call);
}

// ---- module calls walked natively (record_module) ------------------------------------------
PyObject* g_leaves = nullptr;  // the types tensors_of skips (modules.py's LEAVES), given by set_leaves

// The tensors of a module call's arguments or output, in tensors_of's order (borrowed): plain
// tensors, tuples, lists, dicts and the leaf types are walked here; false when anything else
// is met (a namedtuple, a registered pytree class, a tensor subclass): Python's walk then.
bool walk_tensors(PyObject* v, std::vector<PyObject*>& out, int depth = 0) {
  if (THPVariable_CheckExact(v)) {
    out.push_back(v);
    return true;
  }
  PyTypeObject* tp = Py_TYPE(v);
  if (tp == &PyTuple_Type || tp == &PyList_Type) {
    if (depth > 32) return false;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(v); ++i)
      if (!walk_tensors(PySequence_Fast_GET_ITEM(v, i), out, depth + 1)) return false;
    return true;
  }
  if (tp == &PyDict_Type) {
    if (depth > 32) return false;
    PyObject *key, *value;
    for (Py_ssize_t pos = 0; PyDict_Next(v, &pos, &key, &value);)
      if (!walk_tensors(value, out, depth + 1)) return false;
    return true;
  }
  return v == Py_None || (g_leaves && PySet_Contains(g_leaves, reinterpret_cast<PyObject*>(tp)) == 1);
}

// A module's own parameters as named_parameters(recurse=False) gives them: its `_parameters`
// in order, None and repeats left out; false when it is not a dict of tensors by name.
bool own_params(PyObject* d, std::vector<std::pair<PyObject*, PyObject*>>& out) {
  if (!PyDict_CheckExact(d)) return false;
  PyObject *name, *p;
  for (Py_ssize_t pos = 0; PyDict_Next(d, &pos, &name, &p);) {
    if (p == Py_None) continue;
    if (!THPVariable_Check(p) || !PyUnicode_Check(name)) return false;
    if (std::none_of(out.begin(), out.end(), [p](const auto& o) { return o.second == p; })) out.emplace_back(name, p);
  }
  return true;
}

// A module's own parameter that set_params did not name takes the name its module gives it
// (`module`.`name`): a wrapper put it there after the model was indexed, as FSDP2 puts each
// layer's unsharded parameters before its forward (modules.ModuleTracker.learn, the same on the
// Python path). Without a name it read as a tensor no op made, the enclosing module's own code.
void learn_param(const char* module, PyObject* name, const at::Tensor& t) {
  auto key = reinterpret_cast<intptr_t>(t.unsafeGetTensorImpl());
  // (at most 2^16 learnt: a model that makes a new parameter object at every call keeps them
  // unnamed rather than holding ~200 bytes a call)
  if (params.count(key) || learned.size() >= (1u << 16)) return;
  std::string full = *module ? std::string(module) + "." + PyUnicode_AsUTF8(name) : PyUnicode_AsUTF8(name);
  params.emplace(key, intern(full));
  learned.emplace_back(t.getIntrusivePtr());
}

// The tensors of a call's keyword arguments (a dict, or None), each with its keyword, in
// module_inputs' order; false when a value holds what only Python walks.
bool keyword_tensors(PyObject* kwargs, std::vector<std::pair<PyObject*, PyObject*>>& out) {
  if (kwargs == Py_None) return true;
  if (!PyDict_CheckExact(kwargs)) return false;
  std::vector<PyObject*> found;
  PyObject *key, *value;
  for (Py_ssize_t pos = 0; PyDict_Next(kwargs, &pos, &key, &value);) {
    found.clear();
    if (!PyUnicode_Check(key) || !walk_tensors(value, found)) return false;
    for (PyObject* t : found) out.emplace_back(key, t);
  }
  return true;
}

// record_module(op, module, phase, value, params, call, grads, kwargs) -> call, or None:
// nothing recorded, `value`, `params` or `kwargs` holds what only Python walks (the hooks
// then call record_call). call < 0: a module's entry, its inputs the tensors of `value` (its
// arguments), then `params` (its `_parameters`) by name, then the tensors of `kwargs` by
// keyword; else its exit, its outputs the tensors of `value`. The rows are those record_call
// makes from module_inputs / tensors_of, without their Python lists.
PyObject* py_record_module(PyObject*, PyObject* a) {
  CallArgs c;
  if (!c.parse(a)) return nullptr;
  std::vector<PyObject*> tensors;
  std::vector<std::pair<PyObject*, PyObject*>> own, keywords;
  bool entry = c.call < 0;
  if (!walk_tensors(c.first, tensors)) Py_RETURN_NONE;
  if (entry && !(own_params(c.second, own) && keyword_tensors(c.kwargs, keywords))) Py_RETURN_NONE;
  std::lock_guard<std::recursive_mutex> lock(mu);
  Head h = call_head(c.op, c.module, c.phase, c.call);
  long long call = c.call;
  bool grads = c.grads;
  int n = static_cast<int>(tensors.size());
  if (entry) {
    if (!g_inputs) return PyLong_FromLongLong(call);
    for (int i = 0; i < n; ++i) input_row(h, i, -1, THPVariable_Unpack(tensors[i]));
    for (auto& [name, p] : own) learn_param(c.module, name, THPVariable_Unpack(p));
    own.insert(own.end(), keywords.begin(), keywords.end());  // named inputs: params, then keywords
    for (size_t j = 0; j < own.size(); ++j)
      input_row(h, n + static_cast<int>(j), intern(PyUnicode_AsUTF8(own[j].first)), THPVariable_Unpack(own[j].second));
    return PyLong_FromLongLong(call);
  }
  std::vector<std::pair<int, at::Tensor>> hooked;
  for (int i = 0; i < n; ++i) {
    const at::Tensor& t = THPVariable_Unpack(tensors[i]);
    if (g_outputs) output_row(h, i, t, -1, false, nullptr);
    if (grads) hooked.emplace_back(i, t);
  }
  hook_gradients(h, hooked);
  return PyLong_FromLongLong(call);
}

// set_leaves(types): the types that never hold a tensor (a set), for record_module's walk
PyObject* py_set_leaves(PyObject*, PyObject* types) {
  if (!PyAnySet_Check(types)) {
    PyErr_SetString(PyExc_TypeError, "a set of types is expected");
    return nullptr;
  }
  Py_INCREF(types);
  Py_XSETREF(g_leaves, types);
  Py_RETURN_NONE;
}

}  // namespace
