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

// record_call(op, module, phase, inputs, outputs, call) -> call: one module call's rows.
// inputs / outputs: sequences of (slot, arg name or None, tensor); call < 0 takes the next
// call index of (module, phase, op) (a module's entry), else the entry's index (its exit).
PyObject* py_record_call(PyObject*, PyObject* a) {
  const char *op, *module;
  int phase;
  long long call;
  PyObject *ins, *outs;
  if (!PyArg_ParseTuple(a, "ssiOOL", &op, &module, &phase, &ins, &outs, &call)) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);
  int op_name = intern(op), mod = *module ? intern(module) : -1;
  if (call < 0) call = calls[std::make_tuple(mod, phase, op_name)]++;
  Head h{g_seq++, call, static_cast<int8_t>(phase), mod, op_name, -1, -1, -1, g_want && !g_probe, g_want};
  bool ok = !g_inputs || each_call_item(ins, [&](int slot, int arg, const at::Tensor& t) {
    input_row(h, slot, arg, t);
  });
  ok = ok && (!g_outputs || each_call_item(outs, [&](int slot, int arg, const at::Tensor& t) {
    output_row(h, slot, t, -1, false, nullptr);
    if (arg >= 0) rows.back().arg = arg;
  }));
  if (!ok) return nullptr;
  return PyLong_FromLongLong(call);
}

}  // namespace
