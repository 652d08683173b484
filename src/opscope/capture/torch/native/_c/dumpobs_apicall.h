// One torch-function call recorded in one native call (included by dumpobs_module.h after
// dumpobs_api.h): api_call walks the call's arguments, makes its input rows, calls it, walks
// what it returned and makes its output rows, as native/api.py's begin, the call and its end
// do through api_begin and api_end, without the Python lists of items and the two calls
// between (~5 us a call: a transformer step's optimizer alone makes ~800 calls).
namespace {

PyObject* g_api_fallback = nullptr;  // returned, uncalled, where only Python walks the arguments
PyObject* g_tensors_of = nullptr;    // modules.tensors_of, for a result only Python walks
PyObject* g_args_text = nullptr;     // native/api.args_text, for arguments seen first or not plain

enum : long { AC_UNREAD = 1, AC_WRITES = 2, AC_MUTATED = 4, AC_GRADS = 8, AC_MADE = 16, AC_VIEWS = 64 };

// Hands the Python error set now (opscope's own failure, not the user's call) to `failed`;
// false where that raised (an OpscopeError, which the user's call must see).
bool api_failed(PyObject* failed) {
  PyObject *type, *value, *tb;
  PyErr_Fetch(&type, &value, &tb);
  PyErr_NormalizeException(&type, &value, &tb);
  if (tb && value) PyException_SetTraceback(value, tb);
  PyObject* r = PyObject_CallOneArg(failed, value ? value : Py_None);
  Py_XDECREF(type), Py_XDECREF(value), Py_XDECREF(tb);
  Py_XDECREF(r);
  return r != nullptr;
}

// The call's inputs as levels.call_inputs gives them: the tensors of the positional
// arguments, then each keyword's (with its keyword); false where a value holds what only Python
// walks. No Python code runs here, and no lock is taken.
bool api_inputs(PyObject* args, PyObject* kwargs, std::vector<PyObject*>& found,
                std::vector<std::pair<PyObject*, PyObject*>>& keywords) {
  return walk_tensors(args, found) && keyword_tensors(kwargs, keywords);
}

// The tensors of what the call returned, as tensors_of gives them (a new reference to what
// holds them, or nullptr with a Python error set).
PyObject* api_outputs(PyObject* out, std::vector<CallItem>& items) {
  std::vector<PyObject*> found;
  PyObject* held = nullptr;
  if (walk_tensors(out, found)) {
    held = Py_NewRef(out);
  } else {
    if (!g_tensors_of) return PyErr_Format(PyExc_RuntimeError, "api_setup was not called");
    if (!(held = PyObject_CallOneArg(g_tensors_of, out))) return nullptr;
    found.clear();
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(held); ++i) found.push_back(PyList_GET_ITEM(held, i));
  }
  int slot = 0;
  for (PyObject* t : found) items.push_back(CallItem{slot++, -1, t});
  return held;
}

// ---- the args JSON of a call, kept by what it is made of ------------------------------------------
// A call's text depends on its non-tensor arguments only, and the same ones recur every step
// (the optimizer's coefficients): the text args_text gave is kept under a key of their positions,
// exact types and values (a float's bits: 0.0 and -0.0 differ). Values other than int, float,
// bool, None and str (a dtype, a torch.Size, a list of numbers) have no key here: args_text then.
std::unordered_map<std::string, std::pair<std::string, bool>> api_texts;  // key -> (text, has text)

void api_forget() { api_texts.clear(); }  // the dump is over (uninstall): a dump's own texts

bool key_value(std::string& key, PyObject* v) {
  if (v == Py_None) {
    key += 'n';
  } else if (PyBool_Check(v)) {
    key += v == Py_True ? 'T' : 'F';
  } else if (PyLong_CheckExact(v)) {
    int overflow = 0;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) return false;
    key += 'i';
    key.append(reinterpret_cast<const char*>(&x), sizeof x);
  } else if (PyFloat_CheckExact(v)) {
    double x = PyFloat_AS_DOUBLE(v);
    key += 'f';
    key.append(reinterpret_cast<const char*>(&x), sizeof x);
  } else if (PyUnicode_CheckExact(v)) {
    Py_ssize_t n;
    const char* s = PyUnicode_AsUTF8AndSize(v, &n);
    if (!s) return false;
    key += 's';
    key.append(reinterpret_cast<const char*>(&n), sizeof n).append(s, static_cast<size_t>(n));
  } else {
    return false;
  }
  return true;
}

bool only_tensors(PyObject* v) {  // a list or tuple of tensors: no part of the text
  if (!PyList_CheckExact(v) && !PyTuple_CheckExact(v)) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(v); ++i)
    if (!THPVariable_Check(PySequence_Fast_GET_ITEM(v, i))) return false;
  return PySequence_Fast_GET_SIZE(v) > 0;
}

// The key of a call's non-tensor arguments; false where one has none (see above).
bool args_key(PyObject* args, PyObject* kwargs, std::string& key) {
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(args); ++i) {
    PyObject* v = PyTuple_GET_ITEM(args, i);
    if (THPVariable_Check(v) || only_tensors(v)) continue;
    key += 'p';
    key.append(reinterpret_cast<const char*>(&i), sizeof i);
    if (!key_value(key, v)) return false;
  }
  PyObject *k, *v;
  for (Py_ssize_t pos = 0; PyDict_Next(kwargs, &pos, &k, &v);) {
    if (THPVariable_Check(v)) continue;
    key += 'k';
    if (!key_value(key, k) || !key_value(key, v)) return false;
  }
  return true;
}

// The call's args JSON into (text, n): nullptr where it has none; false with a Python error set.
// `keep` holds a text args_text made that no key keeps.
bool api_args_text(PyObject* args, PyObject* kwargs, const char*& text, Py_ssize_t& n, PyObject*& keep) {
  std::string key;
  bool keyed = args_key(args, kwargs, key);
  if (PyErr_Occurred()) return false;
  if (keyed) {
    auto it = api_texts.find(key);
    if (it != api_texts.end()) {
      text = it->second.second ? it->second.first.data() : nullptr;
      n = static_cast<Py_ssize_t>(it->second.first.size());
      return true;
    }
  }
  if (!g_args_text) return PyErr_Format(PyExc_RuntimeError, "api_setup was not called"), false;
  keep = PyObject_CallFunctionObjArgs(g_args_text, args, kwargs, nullptr);
  if (!keep) return false;
  text = nullptr;
  if (keep != Py_None && !(text = PyUnicode_AsUTF8AndSize(keep, &n))) return false;
  if (keyed && api_texts.size() < 4096) {
    auto& kept = api_texts[key] = {text ? std::string(text, static_cast<size_t>(n)) : std::string(), text != nullptr};
    if (text) text = kept.first.data();
  }
  return true;
}

// A call's input rows (api_begin's): its token, or -1 (a Python error set where that failed).
// args_text is Python, which may hand the GIL to a thread that waits for mu: asked unlocked.
Py_ssize_t api_call_begin(PyObject* const* a, long flags, const std::vector<PyObject*>& found,
                          const std::vector<std::pair<PyObject*, PyObject*>>& keywords) {
  const long phase = PyLong_AsLong(a[5]);
  const char *op = PyUnicode_AsUTF8(a[3]), *module = PyUnicode_AsUTF8(a[4]), *t = nullptr;
  Py_ssize_t tn = 0, token = -1;
  PyObject* keep = nullptr;
  try {
    if (!PyErr_Occurred() && op && module && api_args_text(a[1], a[2], t, tn, keep)) {
      std::lock_guard<std::recursive_mutex> lock(mu);  // (intern)
      std::vector<CallItem> ins;
      int slot = 0;
      for (PyObject* x : found) ins.push_back(CallItem{slot++, -1, x});
      for (auto& [key, x] : keywords) ins.push_back(CallItem{slot++, intern(PyUnicode_AsUTF8(key)), x});
      token = api_begin_items(intern(op), *module ? intern(module) : -1, static_cast<int>(phase), ins, t, tn,
                              flags & AC_UNREAD, flags & AC_WRITES, flags & AC_VIEWS);
    }
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  Py_XDECREF(keep);
  return token;
}

// A call's output rows (api_end's) from what it returned; false with a Python error set.
bool api_call_end(Py_ssize_t token, PyObject* args, PyObject* out, long flags) {
  std::vector<CallItem> items;
  PyObject* held = api_outputs(out, items);
  if (!held) return false;
  try {
    PyObject* first = (flags & AC_MUTATED) && PyTuple_GET_SIZE(args) ? PyTuple_GET_ITEM(args, 0) : nullptr;
    api_end_items(token, items, flags & AC_MUTATED, flags & AC_GRADS, flags & AC_MADE, first);
  } catch (const std::exception& e) {
    PyErr_SetString(PyExc_RuntimeError, e.what());
  }
  Py_DECREF(held);
  return !PyErr_Occurred();
}

// api_call(func, args, kwargs, op, module, phase, flags, failed) -> what
// func(*args, **kwargs) returns; api_setup's fallback, with func not called, where the arguments
// hold what only Python walks. flags: AC_UNREAD (api_begin's unread), AC_WRITES (its writes),
// AC_MUTATED (api_end's mutated; the first argument is its `first`), AC_GRADS, AC_MADE (api_end's
// empty: the call returns an empty), AC_VIEWS (api_begin's views). opscope's own failures go to
// failed(exc), and the call runs all the same.
PyObject* py_api_call(PyObject*, PyObject* const* a, Py_ssize_t n) {
  if (!g_api_fallback) return PyErr_Format(PyExc_RuntimeError, "api_setup was not called");
  if (n != 8 || !PyTuple_Check(a[1]) || !PyDict_Check(a[2]))
    return PyErr_Format(PyExc_TypeError, "api_call(func, args: tuple, kwargs: dict, op, module, phase, flags, failed)");
  PyObject *func = a[0], *args = a[1], *kwargs = a[2], *failed = a[7];
  const long flags = PyLong_AsLong(a[6]);
  if (PyErr_Occurred()) return nullptr;
  std::vector<PyObject*> found;
  std::vector<std::pair<PyObject*, PyObject*>> keywords;
  if (!api_inputs(args, kwargs, found, keywords)) return Py_NewRef(g_api_fallback);
  Py_ssize_t token = api_call_begin(a, flags, found, keywords);
  if (PyErr_Occurred() && !api_failed(failed)) return nullptr;
  PyObject* out = PyObject_Call(func, args, kwargs);
  if (!out || token < 0) return out;
  if (!api_call_end(token, args, out, flags) && !api_failed(failed)) {
    Py_DECREF(out);
    return nullptr;
  }
  return out;
}

// api_setup(tensors_of, args_text) -> fallback: the walk api_call falls back on for a result,
// the args JSON of a call, and the object api_call returns where only Python walks a call's
// arguments.
PyObject* py_api_setup(PyObject*, PyObject* a) {
  PyObject *tensors_of, *args_text;
  if (!PyArg_ParseTuple(a, "OO", &tensors_of, &args_text)) return nullptr;
  Py_XSETREF(g_tensors_of, Py_NewRef(tensors_of));
  Py_XSETREF(g_args_text, Py_NewRef(args_text));
  if (!g_api_fallback && !(g_api_fallback = PyObject_CallNoArgs(reinterpret_cast<PyObject*>(&PyBaseObject_Type))))
    return nullptr;
  return Py_NewRef(g_api_fallback);
}

}  // namespace
