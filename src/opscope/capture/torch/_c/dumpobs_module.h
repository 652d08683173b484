// The Python functions of the native dump observer (included by dumpobs.cpp).
namespace {

PyObject* str_or_none(int i) {
  if (i < 0) Py_RETURN_NONE;
  return PyUnicode_FromString(names[i].c_str());
}

PyObject* stats_of(const Row& r) {
  if (r.stats != HAVE) {
    Py_INCREF(g_no_stats);
    return g_no_stats;
  }
  if (r.numel == 0)
    return Py_BuildValue("OOOOdOKKKK", Py_None, Py_None, Py_None, Py_None, 0.0, Py_None, 0ULL, 0ULL, 0ULL, r.cnt[3]);
  return Py_BuildValue("ddddddKKKK", r.st[0], r.st[1], r.st[2], r.st[3], r.st[4], r.st[5], r.cnt[0], r.cnt[1],
                       r.cnt[2], r.cnt[3]);
}

PyObject* shape_of(const Row& r) {
  PyObject* l = PyList_New(static_cast<Py_ssize_t>(r.shape.size()));
  for (size_t i = 0; i < r.shape.size(); ++i) PyList_SET_ITEM(l, i, PyLong_FromLongLong(r.shape[i]));
  return l;
}

PyObject* row_list(const Row& r, std::unordered_map<int, PyObject*>& dtypes) {
  auto d = dtypes.find(r.dtype);
  if (d == dtypes.end()) d = dtypes.emplace(r.dtype, PyUnicode_FromString(dtype_name(r.dtype).c_str())).first;
  Py_INCREF(d->second);
  PyObject* args = r.args < 0 ? (Py_INCREF(Py_None), Py_None) : PyUnicode_FromString(args_json[r.args].c_str());
  PyObject* producer = r.producer < 0 ? (Py_INCREF(Py_None), Py_None) : PyLong_FromLongLong(r.producer);
  PyObject* device = r.device < 0 ? PyUnicode_FromString("cpu") : PyUnicode_FromString(names[r.device].c_str());
  PyObject* module = r.module < 0 ? PyUnicode_FromString("") : PyUnicode_FromString(names[r.module].c_str());
  return Py_BuildValue("[LLLLsNNLsiNNNNLOONNNNNONON]", static_cast<long long>(r.id), static_cast<long long>(g_rank),
                       static_cast<long long>(g_step), static_cast<long long>(r.seq), PHASE_TEXT[r.phase], module,
                       str_or_none(r.op), static_cast<long long>(r.call), IO_TEXT[r.io], r.slot, str_or_none(r.arg),
                       d->second, shape_of(r), device, static_cast<long long>(r.numel), Py_None, Py_None, producer,
                       str_or_none(r.param), str_or_none(r.fwd), str_or_none(r.node), args, Py_None,
                       str_or_none(r.note), Py_None, stats_of(r));
}

void clear_step() {
  rows.clear(), args_json.clear(), flow.clear(), geo.clear(), views.clear(), calls.clear(), seq_owner.clear();
  shared.clear();
  g_seq = 0;
}

// take_rows() -> (rows, slow_links): the step's rows in the Python recorder's layout; each
// (row, source) in slow_links shares statistics that Python computes (see slow()).
PyObject* py_take_rows(PyObject*, PyObject*) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  for (size_t i = 0; i < rows.size(); ++i) {  // sources come first: one pass resolves chains
    Row& r = rows[i];
    if (r.link < 0) continue;
    const Row& s = rows[r.link];
    if (s.link >= 0) r.link = s.link;
    const Row& src = rows[r.link];
    r.stats = src.stats == SLOW ? SLOW : src.stats;
    std::memcpy(r.st, src.st, sizeof r.st);
    std::memcpy(r.cnt, src.cnt, sizeof r.cnt);
    if (src.note >= 0 && src.note != intern("view") && r.note < 0) r.note = src.note;
  }
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(rows.size()));
  PyObject* links = PyList_New(0);
  std::unordered_map<int, PyObject*> dtypes;
  for (size_t i = 0; i < rows.size(); ++i) {
    PyList_SET_ITEM(out, i, row_list(rows[i], dtypes));
    if (rows[i].link >= 0 && rows[rows[i].link].stats == SLOW) {
      PyObject* pair = Py_BuildValue("nn", static_cast<Py_ssize_t>(i), static_cast<Py_ssize_t>(rows[i].link));
      PyList_Append(links, pair);
      Py_DECREF(pair);
    }
  }
  for (auto& [_, s] : dtypes) Py_DECREF(s);
  clear_step();
  return Py_BuildValue("NN", out, links);
}

PyObject* py_install(PyObject*, PyObject* a) {
  PyObject *classify, *hooks, *no_stats;
  long long rank;
  int inputs, outputs;
  if (!PyArg_ParseTuple(a, "OOLppO", &classify, &hooks, &rank, &inputs, &outputs, &no_stats)) return nullptr;
  if (g_installed) {
    PyErr_SetString(PyExc_RuntimeError, "the native dump observer is already installed");
    return nullptr;
  }
  Py_INCREF(classify), Py_INCREF(hooks), Py_INCREF(no_stats);
  g_classify = classify, g_hooks = hooks, g_no_stats = no_stats;
  g_rank = rank, g_inputs = inputs, g_outputs = outputs, g_next_id = 0, g_meta = 0, g_step = -1;
  g_installed = true;
  t_opaque = 0;
  t_open.clear();
  Py_RETURN_NONE;
}

PyObject* py_uninstall(PyObject*, PyObject*) {
  set_registered(false);
  g_installed = false;
  g_on = false;
  {
    std::lock_guard<std::recursive_mutex> lock(mu);
    clear_step();
    kinds.clear(), chosen.clear(), params.clear();
    ++g_generation;
    for (auto& [s, _] : path_ids) Py_DECREF(s);
    path_ids.clear();
  }
  Py_CLEAR(g_classify);
  Py_CLEAR(g_hooks);
  Py_CLEAR(g_no_stats);
  t_args.clear(), t_nodes.clear(), t_rng.clear();
  Py_RETURN_NONE;
}

PyObject* py_configure(PyObject*, PyObject* a) {
  int on, phase;
  if (!PyArg_ParseTuple(a, "pi", &on, &phase)) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);
  g_on = on, g_phase = static_cast<int8_t>(phase);
  Py_RETURN_NONE;
}

PyObject* py_register(PyObject*, PyObject* a) {
  int on = PyObject_IsTrue(a);
  if (on < 0) return nullptr;
  set_registered(on);
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

PyObject* py_begin_step(PyObject*, PyObject* a) {
  long long step = PyLong_AsLongLong(a);
  if (PyErr_Occurred()) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);
  clear_step();
  g_step = step;
  Py_RETURN_NONE;
}

PyObject* py_meta_skipped(PyObject*, PyObject*) { return PyLong_FromLongLong(g_meta); }

// lookup(tensor) -> id of the row that holds this tensor's current content this step, or None
PyObject* py_lookup(PyObject*, PyObject* a) {
  if (!THPVariable_Check(a)) {
    PyErr_SetString(PyExc_TypeError, "a tensor is expected");
    return nullptr;
  }
  std::lock_guard<std::recursive_mutex> lock(mu);
  const Flow* f = find_flow(THPVariable_Unpack(a));
  if (!f) Py_RETURN_NONE;
  return PyLong_FromLongLong(rows[f->row].id);
}

// counters() -> (next row id, next seq); set_counters(id, seq): shared with rows Python adds
PyObject* py_counters(PyObject*, PyObject*) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  return Py_BuildValue("LL", static_cast<long long>(g_next_id), static_cast<long long>(g_seq));
}

PyObject* py_set_counters(PyObject*, PyObject* a) {
  long long id, seq;
  if (!PyArg_ParseTuple(a, "LL", &id, &seq)) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);
  g_next_id = id, g_seq = seq;
  Py_RETURN_NONE;
}

PyMethodDef methods[] = {
    {"install", py_install, METH_VARARGS, "install(classify, hooks, rank, want_inputs, want_outputs, no_stats)"},
    {"uninstall", py_uninstall, METH_NOARGS, "remove the observer and forget everything"},
    {"configure", py_configure, METH_VARARGS, "configure(on, phase)"},
    {"register", py_register, METH_O, "register(on): the callback is registered only while capturing"},
    {"set_module", py_set_module, METH_O, "set_module(path): the module being executed"},
    {"set_params", py_set_params, METH_O, "set_params([(tensor, name)]): names of parameters and buffers"},
    {"begin_step", py_begin_step, METH_O, "begin_step(step): start recording a step"},
    {"take_rows", py_take_rows, METH_NOARGS, "take_rows() -> (rows, slow_links); the step's state is cleared"},
    {"counters", py_counters, METH_NOARGS, "counters() -> (next row id, next seq)"},
    {"set_counters", py_set_counters, METH_VARARGS, "set_counters(id, seq)"},
    {"lookup", py_lookup, METH_O, "lookup(tensor): the id of the row holding its content this step, or None"},
    {"meta_skipped", py_meta_skipped, METH_NOARGS, "meta tensors seen (not measured)"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_opscope_dump", "opscope.dump native observer", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__opscope_dump(void) { return PyModule_Create(&module_def); }
