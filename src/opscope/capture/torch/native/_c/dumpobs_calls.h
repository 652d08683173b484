// Module-level calls recorded by the native dump (included by dumpobs_module.h): the module
// hooks hand each call's inputs, own parameters and outputs (and the gradients of its
// outputs in backward) to record_call, which makes the rows as Recorder.record does,
// measures at once (no per-op observer is registered at module level) and keeps the data
// flow, so that a module's input that an earlier module returned is linked, not measured.
namespace {

// Calls fn(slot, arg name index or -1, tensor) for each (slot, arg or None, tensor) item;
// false (a Python error set) when an item is malformed.
template <typename F>
bool each_call_item(PyObject* items, F fn) {
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
    fn(slot, arg == Py_None ? -1 : intern(PyUnicode_AsUTF8(arg)), THPVariable_Unpack(t));
  }
  Py_DECREF(fast);
  return true;
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

void hook_gradients(const Head& h, const std::vector<std::pair<int, at::Tensor>>& outs) {
  for (const auto& [slot, t] : outs) {
    if (!t.requires_grad()) continue;
    int64_t install = g_installs;
    int op = h.op, mod = h.module, s = slot;
    t.register_hook([install, op, mod, s](const at::TensorBase& grad) { grad_row(install, op, mod, s, grad); });
  }
}

// record_call(op, module, phase, inputs, outputs, call, grads) -> call: one module call's
// rows. inputs / outputs: sequences of (slot, arg name or None, tensor); call < 0 takes the
// next call index of (module, phase, op) (a module's entry), else the entry's index (its
// exit); grads: hook the outputs that require grad, for a row of their gradient in backward.
PyObject* py_record_call(PyObject*, PyObject* a) {
  const char *op, *module;
  int phase, grads = 0;
  long long call;
  PyObject *ins, *outs;
  if (!PyArg_ParseTuple(a, "ssiOOL|p", &op, &module, &phase, &ins, &outs, &call, &grads)) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);
  int op_name = intern(op), mod = *module ? intern(module) : -1;
  if (call < 0) call = calls[std::make_tuple(mod, phase, op_name)]++;
  Head h{g_seq++, call, static_cast<int8_t>(phase), mod, op_name, -1, -1, -1};
  set_data(h);
  bool ok = !g_inputs || each_call_item(ins, [&](int slot, int arg, const at::Tensor& t) {
    input_row(h, slot, arg, t);
  });
  std::vector<std::pair<int, at::Tensor>> hooked;
  ok = ok && each_call_item(outs, [&](int slot, int arg, const at::Tensor& t) {
    if (g_outputs) {
      output_row(h, slot, t, -1, false, nullptr);
      if (arg >= 0) rows.back().arg = arg;
    }
    if (grads) hooked.emplace_back(slot, t);
  });
  if (!ok) return nullptr;
  hook_gradients(h, hooked);
  return PyLong_FromLongLong(call);
}

}  // namespace
