// Native aten-level observer of opscope.watch: the per-op work of the Checker in
// opscope/watch/check.py, run from a thread-local at::RecordFunction callback instead of a
// Python TorchDispatchMode.
//
// Built on first use against the installed torch (see opscope/capture/torch/native/build.py); the Python side
// (opscope/watch/observer.py, capture/torch/op_kinds.py) keeps the rules' sources of truth:
// which op is a view, a cast, a select op, an additive mask op, writes in place (asked once
// per overload through `classify`), and everything that happens on a hit (`on_hit`: the
// event, the chain back, raise/warn/record).
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

void before_op(Thread&, const at::RecordFunction&, const OpKind&) {}
void foreign_op(Thread&, const at::RecordFunction&, const OpKind&) {}

void on_error(const char* what) {
  PyGILState_STATE gil = PyGILState_Ensure();
  PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "opscope watch: native check failed: %s", what);
  PyGILState_Release(gil);
}

void on_op(Thread& T, const at::RecordFunction& fn, const OpKind& k) {
  std::vector<at::Tensor>& args = t_in;
  std::vector<at::Tensor>& outs = t_out;
  args.clear(), outs.clear();
  flatten(T.args, args);
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
      if (i < static_cast<int>(T.args.size())) w.push_back(T.args[i]);
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
    if (!T.nodes.empty()) {
      phase = BACKWARD;
      node = T.nodes.back().second;
      module = -1;
      const Owner* owner = owner_of(T.nodes.back().first);
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

}  // namespace

#include "watchobs_module.h"
