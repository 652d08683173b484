// The monitor's torch extension (built against the installed torch on first use by
// opscope.capture.torch.native.build, as the dump's observers are): what the batched kernel
// needs of an optimizer's gradients, read from the tensors' C++ fields in one call.
//
// In the optimizer's pre-hook the monitor hands every gradient to the kernel's thread
// (monstats.c start()). Found from Python, that is ~6 binding calls a tensor (.grad, dtype,
// is_cpu, is_contiguous, data_ptr, numel) and a numpy array built from a list: ~0.1 ms a step
// on the reference transformer's 30 parameters, its code cold after backward. Here:
//
// grads(params, meta) -> int   for each parameter of the sequence `params`, its gradient's
//     address, element count and dtype code (0 float32, 1 float64, 2 float16, 3 bfloat16) into
//     meta, a writable C-contiguous int64 [3n] buffer (addresses, then counts, then codes, as
//     monstats.c reads it), and a reference to each gradient held until release(); returns n.
//     Returns -1 (nothing held; meta partly written) unless every parameter is a plain Tensor
//     or Parameter whose gradient is a non-empty, contiguous, strided CPU tensor of one of those
//     dtypes without a Python subclass's dispatch: the caller then takes its Python path.
//     Raises if gradients are still held (the batch before was not released).
// release()                    drops the gradients held (once the kernel has read them).
// held() -> int                how many are held (tests).
#include <Python.h>

#include <torch/csrc/autograd/python_variable.h>

#include <cstdint>
#include <vector>

namespace {

std::vector<at::Tensor> g_held;  // the gradients of the batch in flight (GIL held to touch it)

int code_of(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float: return 0;
    case c10::ScalarType::Double: return 1;
    case c10::ScalarType::Half: return 2;
    case c10::ScalarType::BFloat16: return 3;
    default: return -1;
  }
}

// The kernel reads g's bytes as a flat array of its dtype: it must be a plain CPU tensor.
bool readable(const at::Tensor& g) {
  return g.defined() && g.layout() == c10::kStrided && g.device().is_cpu() &&
         !g.unsafeGetTensorImpl()->is_python_dispatch() && g.has_storage() && g.numel() > 0 &&
         g.is_contiguous();
}

bool fill(PyObject* seq, int64_t* meta, Py_ssize_t n) {
  PyObject** items = PySequence_Fast_ITEMS(seq);
  g_held.reserve(static_cast<size_t>(n));  // (kept by clear(): no allocation after the first step)
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* p = items[i];
    if (!THPVariable_CheckExact(p)) return false;  // a subclass may define .grad otherwise
    const at::Tensor& g = THPVariable_Unpack(p).grad();
    int code = readable(g) ? code_of(g.scalar_type()) : -1;
    if (code < 0) return false;
    meta[i] = static_cast<int64_t>(reinterpret_cast<uintptr_t>(g.const_data_ptr()));
    meta[n + i] = g.numel();
    meta[2 * n + i] = code;
    g_held.push_back(g);
  }
  return true;
}

PyObject* py_grads(PyObject*, PyObject* args) {
  PyObject *params, *meta;
  if (!PyArg_ParseTuple(args, "OO", &params, &meta)) return nullptr;
  if (!g_held.empty()) {
    PyErr_SetString(PyExc_RuntimeError, "grads(): the gradients of the last batch are still held (release() first)");
    return nullptr;
  }
  PyObject* seq = PySequence_Fast(params, "grads(): params must be a sequence of tensors");
  if (!seq) return nullptr;
  Py_buffer buf;
  if (PyObject_GetBuffer(meta, &buf, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) {
    Py_DECREF(seq);
    return nullptr;
  }
  Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
  bool ok = buf.len == 24 * n && buf.itemsize == 8;
  if (!ok) PyErr_SetString(PyExc_ValueError, "grads(): meta must be int64 [3n] for n parameters");
  bool filled = false;
  if (ok) {
    try {
      filled = fill(seq, static_cast<int64_t*>(buf.buf), n);
    } catch (const std::exception& e) {
      PyErr_SetString(PyExc_RuntimeError, e.what());
      ok = false;
    }
  }
  PyBuffer_Release(&buf);
  Py_DECREF(seq);
  if (!filled) g_held.clear();
  if (!ok) return nullptr;
  return PyLong_FromSsize_t(filled ? n : -1);
}

PyObject* py_release(PyObject*, PyObject*) {
  g_held.clear();
  Py_RETURN_NONE;
}

PyObject* py_held(PyObject*, PyObject*) { return PyLong_FromSize_t(g_held.size()); }

PyMethodDef METHODS[] = {
    {"grads", py_grads, METH_VARARGS,
     "grads(params, meta): the gradients' addresses, element counts and dtype codes into meta (int64 [3n]), "
     "held until release(); n, or -1 when one is not for the batched kernel"},
    {"release", py_release, METH_NOARGS, "release(): drop the gradients held"},
    {"held", py_held, METH_NOARGS, "held(): how many gradients are held"},
    {nullptr, nullptr, 0, nullptr},
};

PyModuleDef MODULE = {PyModuleDef_HEAD_INIT, "_opscope_monitor", nullptr, -1, METHODS};

}  // namespace

PyMODINIT_FUNC PyInit__opscope_monitor(void) { return PyModule_Create(&MODULE); }
