// The Python functions of the native watch observer (included by watchobs.cpp).
namespace {

// ---- module functions ----------------------------------------------------------------------
PyObject* py_install(PyObject*, PyObject* a) {
  PyObject *on_hit, *classify;
  if (!PyArg_ParseTuple(a, "OO", &on_hit, &classify)) return nullptr;
  if (!start_observer(classify, "watch")) return nullptr;
  Py_INCREF(on_hit);
  g_on_hit = on_hit;
  Py_RETURN_NONE;
}

void clear_step() {
  entries.clear(), in_ids.clear(), recs.clear(), pending.clear();
  masked.clear(), bad.clear(), made.clear(), seq_owner.clear();
}

PyObject* py_uninstall(PyObject*, PyObject*) {
  stop_observer(clear_step);
  Py_CLEAR(g_on_hit);
  Py_RETURN_NONE;
}

PyObject* py_configure(PyObject*, PyObject* a) {
  int on, phase, defer;
  double limit;
  if (!PyArg_ParseTuple(a, "pipd", &on, &phase, &defer, &limit)) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);
  g_on = on, g_phase = static_cast<int8_t>(phase), g_defer = defer, g_limit = limit;
  Py_RETURN_NONE;
}

PyObject* py_set_module(PyObject*, PyObject* a) {
  g_module = static_cast<int>(PyLong_AsLong(a));
  if (PyErr_Occurred()) return nullptr;
  Py_RETURN_NONE;
}

PyObject* py_reset(PyObject*, PyObject*) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  clear_step();
  Py_RETURN_NONE;
}

bool unpack_tensors(PyObject* seq, std::vector<at::Tensor>& out) {
  PyObject* fast = PySequence_Fast(seq, "a sequence of tensors is expected");
  if (!fast) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    PyObject* o = PySequence_Fast_GET_ITEM(fast, i);
    if (!THPVariable_Check(o)) {
      Py_DECREF(fast);
      PyErr_SetString(PyExc_TypeError, "a sequence of tensors is expected");
      return false;
    }
    out.push_back(THPVariable_Unpack(o));
  }
  Py_DECREF(fast);
  return true;
}

// observe(name, module, phase, in_ids, outs, check, select, strict) -> index
PyObject* py_observe(PyObject*, PyObject* a) {
  const char* name;
  int module, phase, check, select, strict;
  PyObject *ids, *outs_obj;
  if (!PyArg_ParseTuple(a, "siiOOppp", &name, &module, &phase, &ids, &outs_obj, &check, &select, &strict))
    return nullptr;
  std::vector<intptr_t> ins;
  PyObject* fast = PySequence_Fast(ids, "in_ids must be a sequence of ints");
  if (!fast) return nullptr;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i)
    ins.push_back(static_cast<intptr_t>(PyLong_AsSsize_t(PySequence_Fast_GET_ITEM(fast, i))));
  Py_DECREF(fast);
  std::vector<at::Tensor> outs;
  if (PyErr_Occurred() || !unpack_tensors(outs_obj, outs)) return nullptr;
  std::vector<Hit> hits;
  size_t index;
  {
    std::lock_guard<std::recursive_mutex> lock(mu);
    index = observe(intern(name), module, static_cast<int8_t>(phase), -1, -1, ins, outs, nullptr, check, select,
                    strict, nullptr, hits);
  }
  for (auto& h : hits) h.has_args = false;
  report(hits);
  return PyLong_FromSize_t(index);
}

// Read every pending device range (one transfer per dtype) and judge them in order.
PyObject* py_resolve(PyObject*, PyObject*) {
  std::vector<Hit> hits;
  {
    std::lock_guard<std::recursive_mutex> lock(mu);
    std::map<int, std::vector<size_t>> by_dtype;
    for (size_t i = 0; i < pending.size(); ++i) by_dtype[static_cast<int>(pending[i].mn.scalar_type())].push_back(i);
    std::vector<size_t> found;
    {
      Internal guard;
      for (auto& [dtype, items] : by_dtype) {
        std::vector<at::Tensor> mns, mxs;
        for (size_t i : items) mns.push_back(pending[i].mn), mxs.push_back(pending[i].mx);
        at::Tensor los = at::stack(mns).to(at::kCPU, at::kDouble).contiguous();
        at::Tensor his = at::stack(mxs).to(at::kCPU, at::kDouble).contiguous();
        const double* lp = los.const_data_ptr<double>();
        const double* hp = his.const_data_ptr<double>();
        for (size_t j = 0; j < items.size(); ++j) {
          Rec& rec = recs[pending[items[j]].rec];
          rec.lo = lp[j], rec.hi = hp[j], rec.ranged = true;
          if (!(rec.lo > -g_limit && rec.hi < g_limit)) found.push_back(items[j]);
        }
      }
    }
    std::sort(found.begin(), found.end(), [](size_t x, size_t y) {
      return std::make_pair(pending[x].index, pending[x].slot) < std::make_pair(pending[y].index, pending[y].slot);
    });
    for (size_t i : found) {
      const Pending& p = pending[i];
      at::Tensor t = alive(recs[p.rec]);
      judge(p.index, p.slot, t, nullptr, p.select, p.strict, hits);
    }
    pending.clear();
  }
  report(hits);
  Py_RETURN_NONE;
}

// range_of(tensor) -> (min, max) from the native pass, or None where torch is used instead
PyObject* py_range_of(PyObject*, PyObject* a) {
  if (!THPVariable_Check(a)) {
    PyErr_SetString(PyExc_TypeError, "a tensor is expected");
    return nullptr;
  }
  double lo, hi;
  if (!native_range(THPVariable_Unpack(a), lo, hi)) Py_RETURN_NONE;
  return Py_BuildValue("dd", lo, hi);
}

// ranges_of(tensors) -> [(min, max) or None]: range_of over a list in one call
PyObject* py_ranges_of(PyObject*, PyObject* a) {
  PyObject* fast = PySequence_Fast(a, "a sequence of tensors is expected");
  if (!fast) return nullptr;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  PyObject* out = PyList_New(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* o = PySequence_Fast_GET_ITEM(fast, i);
    double lo, hi;
    PyObject* item;
    if (THPVariable_Check(o) && native_range(THPVariable_Unpack(o), lo, hi)) {
      item = Py_BuildValue("dd", lo, hi);
    } else {
      Py_INCREF(Py_None);
      item = Py_None;
    }
    PyList_SET_ITEM(out, i, item);
  }
  Py_DECREF(fast);
  return out;
}

PyObject* py_count(PyObject*, PyObject*) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  return PyLong_FromSize_t(entries.size());
}

PyObject* py_pending(PyObject*, PyObject*) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  return PyLong_FromSize_t(pending.size());
}

PyObject* name_or_none(int i) {
  if (i < 0) Py_RETURN_NONE;
  return PyUnicode_FromString(names[i].c_str());
}

PyObject* range_value(const Rec& r, bool hi) {
  if (!r.ranged) Py_RETURN_NONE;
  return PyFloat_FromDouble(hi ? r.hi : r.lo);
}

// entries(start) -> [[name, module, phase, fwd, node, in_ids, [[id, tensor|None, ver, lo, hi, dtype]], view]]
PyObject* py_entries(PyObject*, PyObject* a) {
  Py_ssize_t start = PyLong_AsSsize_t(a);
  if (PyErr_Occurred()) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);
  PyObject* out = PyList_New(0);
  for (size_t i = static_cast<size_t>(start); i < entries.size(); ++i) {
    const Entry& e = entries[i];
    PyObject* ids = PyTuple_New(static_cast<Py_ssize_t>(e.in_end - e.in_begin));
    for (size_t j = e.in_begin; j < e.in_end; ++j)
      PyTuple_SET_ITEM(ids, j - e.in_begin, PyLong_FromSsize_t(in_ids[j]));
    PyObject* rl = PyList_New(0);
    for (size_t j = e.out_begin; j < e.out_end; ++j) {
      const Rec& r = recs[j];
      at::Tensor live = alive(r);
      PyObject* t = wrap(live);
      PyObject* dtype = r.dtype >= 0 ? PyUnicode_FromString(c10::toString(static_cast<at::ScalarType>(r.dtype)))
                                     : (Py_INCREF(Py_None), Py_None);
      PyObject* item = Py_BuildValue("[nNLNNN]", static_cast<Py_ssize_t>(r.id), t, static_cast<long long>(r.ver),
                                     range_value(r, false), range_value(r, true), dtype);
      PyList_Append(rl, item);
      Py_DECREF(item);
    }
    PyObject* row = Py_BuildValue("[NiiNNNNO]", name_or_none(e.name), e.module, static_cast<int>(e.phase),
                                  name_or_none(e.fwd), name_or_none(e.node), ids, rl, e.view ? Py_True : Py_False);
    PyList_Append(out, row);
    Py_DECREF(row);
  }
  return out;
}

PyMethodDef methods[] = {
    {"install", py_install, METH_VARARGS, "install(on_hit, classify): observe this thread's ops"},
    {"uninstall", py_uninstall, METH_NOARGS, "remove the observer and forget everything"},
    {"configure", py_configure, METH_VARARGS, "configure(on, phase, defer, limit)"},
    {"register", py_register, METH_O, "register(on): the callback is registered only while checking"},
    {"set_module", py_set_module, METH_O, "set_module(index): the module being executed (-1: none)"},
    {"reset", py_reset, METH_NOARGS, "forget the step's entries and marks"},
    {"observe", py_observe, METH_VARARGS, "observe(name, module, phase, in_ids, outs, check, select, strict)"},
    {"resolve", py_resolve, METH_NOARGS, "read pending device ranges and judge them"},
    {"range_of", py_range_of, METH_O, "range_of(tensor): (min, max) by the native pass, None if not native"},
    {"ranges_of", py_ranges_of, METH_O, "ranges_of(tensors): range_of of each, in one call"},
    {"count", py_count, METH_NOARGS, "number of entries this step"},
    {"pending", py_pending, METH_NOARGS, "number of ranges not read yet"},
    {"entries", py_entries, METH_O, "entries(start): the step's entries from start, as Python lists"},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_opscope_watch", "opscope.watch native observer", -1, methods};

}  // namespace

PyMODINIT_FUNC PyInit__opscope_watch(void) { return PyModule_Create(&module_def); }
