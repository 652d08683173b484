// Native aten-level observer of opscope.watch: the per-op work of watch_check.Checker, run
// from a thread-local at::RecordFunction callback instead of a Python TorchDispatchMode.
//
// Built on first use against the installed torch (see opscope/native.py); the Python side
// (watch_native.py) keeps the rules' sources of truth: which op is a view, a cast, a select
// op, an additive mask op, writes in place (asked once per overload through `classify`), and
// everything that happens on a hit (`on_hit`: the event, the chain back, raise/warn/record).
//
// What is recorded is what a Python dispatch mode would see at the top of the stack: the
// outermost op of each call (depth 1 of FUNCTION records on this thread), forward,
// backward (inside a BACKWARD_FUNCTION record: the autograd node) and the optimizer.
// Ops nested inside another op (a composite's decomposition, a kernel's helpers) are not
// recorded: their effect shows in the outer op's outputs.
#include "observer.h"

#include <ATen/ops/aminmax.h>
#include <ATen/ops/stack.h>

#include <map>
#include <optional>
#include <unordered_set>

namespace {

enum Kind : int { K_NONE = 0, K_NAN = 1, K_INF = 2, K_NEGINF = 3, K_LIMIT = 4 };
const char* KIND_TEXT[] = {"", "nan", "inf", "-inf", "limit"};


struct Rec {
  intptr_t id = 0;
  std::optional<c10::weak_intrusive_ptr<c10::TensorImpl, c10::UndefinedTensorImpl>> ref;
  int64_t ver = -1;
  double lo = 0, hi = 0;
  int8_t dtype = -1;  // c10::ScalarType, -1 = not measured
  bool ranged = false;
};

struct Entry {
  int name, module, fwd = -1, node = -1;
  int8_t phase;
  bool view = false;
  bool additive = false;  // an op through which an additive mask is applied
  size_t in_begin, in_end, out_begin, out_end;
};

struct Pending {
  size_t rec, index, slot;
  at::Tensor mn, mx;
  bool select, strict;
};

struct Hit {
  size_t index, slot;
  int kind;
  at::Tensor t;
  std::vector<at::Tensor> args;
  bool has_args;
};

// ---- shared state (one watch at a time) -------------------------------------------------
bool g_defer = false;
double g_limit = INFINITY;
PyObject* g_on_hit = nullptr;

std::vector<Entry> entries;
std::vector<intptr_t> in_ids;
std::vector<Rec> recs;
std::vector<Pending> pending;
std::unordered_set<intptr_t> masked, bad, made;
thread_local std::vector<at::Tensor> t_in, t_out;  // reused per op
thread_local std::vector<intptr_t> t_ids;

int classify_range(double lo, double hi) {
  if (lo != lo || hi != hi) return K_NAN;
  if (hi == INFINITY) return K_INF;
  if (lo == -INFINITY) return K_NEGINF;
  if (hi > g_limit || lo < -g_limit) return K_LIMIT;
  return K_NONE;
}

void report(std::vector<Hit>& hits) {
  if (hits.empty() || !g_on_hit) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  for (auto& h : hits) {
    PyObject* args = Py_None;
    Py_INCREF(Py_None);
    if (h.has_args) {
      Py_DECREF(Py_None);
      args = PyList_New(static_cast<Py_ssize_t>(h.args.size()));
      for (size_t i = 0; i < h.args.size(); ++i) PyList_SET_ITEM(args, i, wrap(h.args[i]));
    }
    PyObject* t = wrap(h.t);
    PyObject* r = PyObject_CallFunction(g_on_hit, "nnsOO", static_cast<Py_ssize_t>(h.index),
                                        static_cast<Py_ssize_t>(h.slot), KIND_TEXT[h.kind], t, args);
    if (!r) PyErr_WriteUnraisable(g_on_hit);  // the Python side keeps its own errors
    Py_XDECREF(r);
    Py_DECREF(t);
    Py_DECREF(args);
  }
  hits.clear();
  PyGILState_Release(gil);
}

// ---- judging (the rules of Checker.judge) ------------------------------------------------
bool any_in(const std::unordered_set<intptr_t>& set, const Entry& e) {
  for (size_t i = e.in_begin; i < e.in_end; ++i)
    if (set.count(in_ids[i])) return true;
  return false;
}

bool constant_mask(const Entry& e, const std::vector<at::Tensor>* args) {
  if (!args) {  // read at the step's end: the inputs are gone; judge by the op
    if (!e.additive) return false;
    for (size_t i = e.in_begin; i < e.in_end; ++i)
      if (!made.count(in_ids[i])) return true;
    return false;
  }
  for (const auto& t : *args) {
    intptr_t id = reinterpret_cast<intptr_t>(t.unsafeGetTensorImpl());
    if (made.count(id) || !measurable(t)) continue;
    double lo, hi;
    if (!native_range(t, lo, hi)) {
      Internal guard;
      lo = std::get<0>(at::aminmax(t)).to(at::kDouble).item<double>();
    }
    if (lo == -INFINITY) {
      masked.insert(id);
      return true;
    }
  }
  return false;
}

void judge(size_t index, size_t slot, const at::Tensor& t, const std::vector<at::Tensor>* args, bool select,
           bool strict, std::vector<Hit>& hits) {
  const Entry& e = entries[index];
  Rec& rec = recs[e.out_begin + slot];
  int kind = classify_range(rec.lo, rec.hi);
  if (kind == K_NONE) return;
  if (kind == K_NEGINF && !strict && e.phase == FORWARD &&
      (select || any_in(masked, e) || constant_mask(e, args))) {
    masked.insert(rec.id);  // a mask: its -Inf is there on purpose
    if (!(rec.hi > g_limit)) return;
    kind = K_LIMIT;
  }
  if (kind != K_LIMIT) {
    bool propagated = any_in(bad, e);
    bad.insert(rec.id);
    if (propagated) return;  // an input was already NaN/Inf: reported where it started
  }
  Hit h{index, slot, kind, t, {}, args != nullptr};
  if (args) h.args = *args;
  hits.push_back(std::move(h));
}

// ---- recording (the rules of Checker.op / observe) ----------------------------------------
void carry(const Entry& e) {
  for (auto* set : {&masked, &bad}) {
    bool hit = e.in_end > e.in_begin && set->count(in_ids[e.in_begin]);
    for (size_t r = e.out_begin; r < e.out_end; ++r) {
      intptr_t id = recs[r].id;
      if (hit) {
        set->insert(id);
      } else {
        bool is_input = false;
        for (size_t i = e.in_begin; i < e.in_end; ++i) is_input |= in_ids[i] == id;
        if (!is_input) set->erase(id);
      }
    }
  }
}

size_t observe(int name, int module, int8_t phase, int fwd, int node, const std::vector<intptr_t>& ins,
               const std::vector<at::Tensor>& outs, const std::vector<at::Tensor>* args, bool check, bool select,
               bool strict, const OpKind* k, std::vector<Hit>& hits) {
  size_t index = entries.size();
  Entry e{name, module, fwd, node, phase, false, k && k->additive, in_ids.size(), 0, recs.size(), 0};
  in_ids.insert(in_ids.end(), ins.begin(), ins.end());
  e.in_end = in_ids.size();
  for (const auto& t : outs) {
    Rec r;
    r.id = reinterpret_cast<intptr_t>(t.unsafeGetTensorImpl());
    recs.push_back(std::move(r));
  }
  e.out_end = recs.size();
  entries.push_back(e);
  bool marks = !masked.empty() || !bad.empty();
  for (size_t s = 0; s < outs.size(); ++s) {
    const at::Tensor& t = outs[s];
    intptr_t id = recs[e.out_begin + s].id;
    if (marks) {
      bool is_input = std::find(ins.begin(), ins.end(), id) != ins.end();
      if (!is_input) {
        masked.erase(id);  // a new tensor may reuse the address of a freed one
        bad.erase(id);
      }
    }
    if (!check || !measurable(t)) continue;
    if (phase == FORWARD) made.insert(id);
    Rec& rec = recs[e.out_begin + s];
    rec.ref.emplace(t.getIntrusivePtr());
    rec.ver = t.is_inference() ? -1 : static_cast<int64_t>(t._version());
    rec.dtype = static_cast<int8_t>(t.scalar_type());
    double lo, hi;
    if (!g_defer && native_range(t, lo, hi)) {
      rec.lo = lo, rec.hi = hi, rec.ranged = true;
      if (!(lo > -g_limit && hi < g_limit)) judge(index, s, t, args, select, strict, hits);
      continue;
    }
    Internal guard;
    auto mm = at::aminmax(t);
    if (t.is_cpu() && !g_defer) {
      rec.lo = std::get<0>(mm).to(at::kDouble).item<double>(), rec.hi = std::get<1>(mm).to(at::kDouble).item<double>();
      rec.ranged = true;
      if (!(rec.lo > -g_limit && rec.hi < g_limit)) judge(index, s, t, args, select, strict, hits);
    } else {
      pending.push_back(Pending{e.out_begin + s, index, s, std::get<0>(mm), std::get<1>(mm), select, strict});
    }
  }
  return index;
}

void flatten(const std::vector<c10::IValue>& args, std::vector<at::Tensor>& out) {
  for (const auto& a : args) {
    if (a.isTensor()) {
      if (a.toTensor().defined()) out.push_back(a.toTensor());
    } else if (a.isTensorList()) {
      for (const at::Tensor& t : a.toTensorList()) out.push_back(t);
    } else if (a.isList()) {
      for (const auto& x : a.toListRef())
        if (x.isTensor() && x.toTensor().defined()) out.push_back(x.toTensor());
    }
  }
}

bool widens(at::ScalarType from, at::ScalarType to) {
  bool low = from == at::kHalf || from == at::kBFloat16;
  return (low && (to == at::kFloat || to == at::kDouble)) || (from == at::kFloat && to == at::kDouble);
}

at::Tensor alive(const Rec& r) {
  if (!r.ref) return at::Tensor();
  auto strong = r.ref->lock();
  return strong ? at::Tensor(std::move(strong)) : at::Tensor();
}

void before_op(const at::RecordFunction&, const OpKind&) {}

void on_error(const char* what) {
  PyGILState_STATE gil = PyGILState_Ensure();
  PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "opscope watch: native check failed: %s", what);
  PyGILState_Release(gil);
}

void on_op(const at::RecordFunction& fn, const OpKind& k) {
  std::vector<at::Tensor>& args = t_in;
  std::vector<at::Tensor>& outs = t_out;
  args.clear(), outs.clear();
  flatten(t_args, args);
  for (const auto& v : fn.outputs()) {
    if (v.isTensor()) {
      if (v.toTensor().defined()) outs.push_back(v.toTensor());
    } else if (v.isTensorList()) {
      for (const at::Tensor& t : v.toTensorList()) outs.push_back(t);
    }
  }
  if (outs.empty() && !k.written.empty()) {  // _foreach_add_ and friends return nothing
    std::vector<c10::IValue> w;
    for (int i : k.written)
      if (i < static_cast<int>(t_args.size())) w.push_back(t_args[i]);
    flatten(w, outs);
  }
  std::vector<intptr_t>& ins = t_ids;
  ins.clear();
  for (const auto& a : args) ins.push_back(reinterpret_cast<intptr_t>(a.unsafeGetTensorImpl()));
  std::vector<Hit> hits;
  {
    std::lock_guard<std::recursive_mutex> lock(mu);
    int module = g_module, fwd = -1, node = -1;
    int8_t phase = g_phase;
    if (!t_nodes.empty()) {
      phase = BACKWARD;
      node = t_nodes.back().second;
      module = -1;
      const Owner* owner = owner_of(t_nodes.back().first);
      if (owner) module = owner->module, fwd = owner->op;
    } else if (phase == FORWARD && fn.seqNr() >= 0) {
      own(fn.seqNr(), module, k.name);
    }
    bool transparent = k.transparent;
    if (k.cast && !args.empty() && outs.size() == 1)
      transparent = args[0].scalar_type() == outs[0].scalar_type() ||
                    widens(args[0].scalar_type(), outs[0].scalar_type());
    if (transparent) {
      Entry e{k.name, module, fwd, node, phase, true, false, in_ids.size(), 0, recs.size(), 0};
      in_ids.insert(in_ids.end(), ins.begin(), ins.end());
      e.in_end = in_ids.size();
      for (const auto& t : outs) {
        Rec r;
        r.id = reinterpret_cast<intptr_t>(t.unsafeGetTensorImpl());
        if (phase == FORWARD && measurable(t)) made.insert(r.id);
        recs.push_back(std::move(r));
      }
      e.out_end = recs.size();
      entries.push_back(e);
      if (!masked.empty() || !bad.empty()) carry(e);
    } else {
      observe(k.name, module, phase, fwd, node, ins, outs, &args, !k.skip, k.select, false, &k, hits);
    }
  }
  args.clear(), outs.clear();  // hold no tensor past the op: autograd counts references
  report(hits);
}

// ---- module functions ----------------------------------------------------------------------
PyObject* py_install(PyObject*, PyObject* a) {
  PyObject *on_hit, *classify;
  if (!PyArg_ParseTuple(a, "OO", &on_hit, &classify)) return nullptr;
  if (g_installed) {
    PyErr_SetString(PyExc_RuntimeError, "the native watch observer is already installed");
    return nullptr;
  }
  Py_INCREF(on_hit), Py_INCREF(classify);
  g_on_hit = on_hit, g_classify = classify;
  g_installed = true;
  t_opaque = 0;
  t_open.clear();
  Py_RETURN_NONE;
}

void clear_step() {
  entries.clear(), in_ids.clear(), recs.clear(), pending.clear();
  masked.clear(), bad.clear(), made.clear(), seq_owner.clear();
}

PyObject* py_uninstall(PyObject*, PyObject*) {
  set_registered(false);
  g_installed = false;
  g_on = false;
  {
    std::lock_guard<std::recursive_mutex> lock(mu);
    clear_step();
    kinds.clear();
    ++g_generation;
  }
  Py_CLEAR(g_on_hit);
  Py_CLEAR(g_classify);
  t_args.clear(), t_nodes.clear();
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

// register(on): add or remove the thread-local callback. Only between steps and around the
// optimizer step: inside backward the engine restores this thread's callbacks when it
// returns, so a callback registered there would be lost and one removed there come back.
PyObject* py_register(PyObject*, PyObject* a) {
  int on = PyObject_IsTrue(a);
  if (on < 0) return nullptr;
  set_registered(on);
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
