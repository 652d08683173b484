// The part of opscope's native observers that both share (watchobs.cpp, dumpobs.cpp): a
// thread-local at::RecordFunction callback that sees each op a Python dispatch mode would
// see, with its phase, module and (in backward) the forward op that made its autograd node;
// the op kinds learnt from Python once per overload; opscope's own ops kept out of sight;
// the SIMD range pass. Each observer is its own extension module (its own copy of this
// state) and defines, before including this file's hooks, what it does with an op:
//   void on_op(Thread&, const at::RecordFunction&, const OpKind&)      a recorded op ended
//   void before_op(Thread&, const at::RecordFunction&, const OpKind&)  a recorded op starts (inputs in Thread::args)
//   void on_error(const char*)                              an exception inside the observer
//   void foreign_op(Thread&, const at::RecordFunction&, const OpKind&)  an op that writes ended on a
//                                                           thread doing a collective's work (args in Thread::args)
#pragma once
#include <Python.h>

#include <ATen/core/grad_mode.h>
#include <ATen/core/ivalue.h>
#include <ATen/record_function.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/csrc/autograd/python_variable.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace {

// RECOMPUTE: activation checkpointing's second run of a forward, inside the backward (set from
// Python around it: capture/torch/checkpointing.py)
enum Phase : int8_t { FORWARD = 0, BACKWARD = 1, OPTIMIZER = 2, RECOMPUTE = 3 };

// A flag any thread may read and set (relaxed), copied with the struct that holds it.
struct Relaxed {
  std::atomic<bool> on{false};
  Relaxed() = default;
  Relaxed(const Relaxed& o) : on(o.on.load(std::memory_order_relaxed)) {}
  Relaxed& operator=(const Relaxed& o) {
    on.store(o.on.load(std::memory_order_relaxed), std::memory_order_relaxed);
    return *this;
  }
};

// What an op overload is, from the Python side's rules (see native/ops.py classify_op and op_kinds.py).
struct OpKind {
  int name = -1;           // interned "aten.add_.Tensor"
  bool composite = false;  // decomposes at the autograd level (or not an op): its parts are recorded
  bool wrapper = false;    // not a dispatcher op: a profiler range, a custom autograd Function's apply
  bool transparent = false, cast = false, select = false, skip = false, additive = false;  // watch
  bool uninitialized = false, random = false, copies = false, collective = false;            // dump
  bool copies_elements = false;  // (dump) copies its first input's elements in their logical order, any strides
  uint64_t view_outputs = 0, written_outputs = 0;  // bit i: output i aliases an input / is written
  uint64_t unread = 0, unfilled = 0;  // bit i: argument i is filled unread / output i holds no data yet
  std::vector<int> written;                        // argument positions written in place
  std::vector<int> arg_names;                      // interned schema argument names
  std::vector<int8_t> arg_kinds;                   // 0 value, 1 dtype, 2 layout, 3 memory format
  std::vector<bool> kwarg_only;
  mutable Relaxed quiet;  // its kernel was seen calling ops: the callback is off while it runs (on_start)
  // dump: the schema's default values by position, and the written positions it does not mark
  // (capture/torch/dispatch.py UNMARKED_WRITES), looked up once (schema_of)
  mutable std::vector<std::optional<c10::IValue>> defaults;
  mutable std::vector<int> unmarked;
  mutable bool schema_known = false;
};

// ---- shared state --------------------------------------------------------------------------
std::recursive_mutex mu;
bool g_on = false;
int8_t g_phase = FORWARD;
int g_module = -1;
PyObject* g_classify = nullptr;
at::CallbackHandle g_handle = 0;     // FUNCTION scope: the ops
at::CallbackHandle g_handle_bw = 0;  // BACKWARD_FUNCTION scope: autograd's nodes
bool g_installed = false;

std::vector<std::string> names;
struct NameHash {  // looks names up by std::string_view too: no string made to find one
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>()(s); }
};
std::unordered_map<std::string, int, NameHash, std::equal_to<>> name_index;
struct PairHash {
  size_t operator()(const std::pair<const char*, const char*>& p) const {
    return std::hash<const void*>()(p.first) * 31u ^ std::hash<const void*>()(p.second);
  }
};
using OpKey = std::pair<const char*, const char*>;  // (name, overload) as the dispatcher keeps them
std::unordered_map<OpKey, OpKind, PairHash> kinds;
int g_generation = 0;  // bumped when `kinds` is cleared: per-thread caches drop their pointers
std::thread::id g_home;    // the thread that registered the callbacks last
int g_home_generation = 0;
struct Owner {
  int64_t seq;
  int module, op;
};
std::vector<Owner> seq_owner;  // autograd sequence nr -> (module, op), sorted by seq

// ---- per thread ------------------------------------------------------------------------
// Which ops are recorded: those a Python dispatch mode would see, i.e. the ops called at the
// autograd level. A CompositeImplicitAutograd op (linear, var.dim, to.dtype, matmul...) is
// not recorded but its decomposition is; any other op is recorded, and the ops its kernel
// calls are not (they run below autograd, unseen by a dispatch mode too).
constexpr int64_t QUIET_FROM = 2;  // inner ops of a call from which its kind runs QUIET
constexpr uint8_t OPAQUE = 1, RECORD = 2, ENGINE = 4, INNER = 8, QUIET = 16, FOREIGN = 32;
struct Open {     // a record started and not ended
  const OpKind* kind;
  uint8_t flags;               // OPAQUE|RECORD|QUIET, or ENGINE, or INNER
  int64_t inner;               // Thread::inner when it started
  at::CallbackHandle off = 0;  // QUIET: the callback it turned off
};
struct Thread {
  int opaque = 0;                               // open recorded-kind ops
  std::vector<Open> open;
  int64_t inner = 0;                            // INNER records seen so far
  std::vector<c10::IValue> args;                // the recorded op's arguments
  std::vector<std::pair<int64_t, int>> nodes;   // (sequence nr, node name)
  std::unordered_map<OpKey, const OpKind*, PairHash> kinds;
  int generation = -1;
  const at::RecordFunctionTLS* callbacks = nullptr;  // torch's list of this thread's callbacks (kept: its address is fixed)
  int home_generation = -1;
  bool home = false;  // the thread that registered the callbacks (see `foreign`)
  int collective = 0;  // inside a torch.distributed collective's Python call (capture/torch/collectives.py)
};
thread_local Thread t_thread;
size_t g_recompute_nodes = 0;  // RECOMPUTE: the autograd nodes open when it began (its ops run inside them)

// An op of this thread runs as the recomputation's own (not as part of the backward node that
// asked for it, nor of one a reentrant checkpoint's nested backward runs later).
inline bool recomputing(const Thread& T) { return g_phase == RECOMPUTE && T.nodes.size() == g_recompute_nodes; }
// An op of this thread is a backward op: part of an autograd node.
inline bool in_node(const Thread& T) { return !T.nodes.empty() && !recomputing(T); }

// This thread's state. Its address is computed once by the caller and kept: each reach of a
// thread-local of this (dlopen'ed, local-dynamic) module calls __tls_get_addr, and the compiler
// recomputes an address rather than keep it across a call (14 calls an op, ~70k instructions
// a tiny step), unless the address is opaque to it as here.
template <typename T>
T& kept(T& x) {  // x's address, opaque to the compiler: computed here once, then kept in a register
  T* p = &x;
  asm("" : "+r"(p));
  return *p;
}
inline Thread& here() { return kept(t_thread); }

void on_op(Thread& T, const at::RecordFunction& fn, const OpKind& k);
void before_op(Thread& T, const at::RecordFunction& fn, const OpKind& k);
void on_error(const char* what);
void foreign_op(Thread& T, const at::RecordFunction& fn, const OpKind& k);

struct Internal {  // opscope's own ops: not observed, not seen by Python dispatch modes, no autograd
  at::RecordFunctionGuard record{false};
  c10::impl::ExcludeDispatchKeyGuard python{c10::DispatchKey::Python};
  c10::impl::ExcludeDispatchKeyGuard snapshot{c10::DispatchKey::PythonTLSSnapshot};
  at::NoGradGuard no_grad;
};

int intern(std::string_view s) {
  auto it = name_index.find(s);
  if (it != name_index.end()) return it->second;
  names.emplace_back(s);
  return name_index[names.back()] = static_cast<int>(names.size()) - 1;
}

#include "ranges.h"

#include "observer_subclass.h"

// ---- op kinds (asked from Python, with the GIL, once per overload) -----------------------------
std::vector<int64_t> ints_of(PyObject* d, const char* key) {
  std::vector<int64_t> out;
  PyObject* v = PyDict_GetItemString(d, key);  // borrowed
  for (Py_ssize_t i = 0; v && PyTuple_Check(v) && i < PyTuple_GET_SIZE(v); ++i)
    out.push_back(PyLong_AsLongLong(PyTuple_GET_ITEM(v, i)));
  return out;
}

bool flag_of(PyObject* d, const char* key) {
  PyObject* v = PyDict_GetItemString(d, key);
  return v && PyObject_IsTrue(v) == 1;
}

void parse_kind(PyObject* d, OpKind& k) {
  k.composite = flag_of(d, "composite"), k.transparent = flag_of(d, "transparent"), k.cast = flag_of(d, "cast");
  k.select = flag_of(d, "select"), k.skip = flag_of(d, "skip"), k.additive = flag_of(d, "additive");
  k.uninitialized = flag_of(d, "uninitialized"), k.random = flag_of(d, "random"), k.copies = flag_of(d, "copies");
  k.copies_elements = flag_of(d, "copies_elements");
  k.collective = flag_of(d, "collective");
  for (int64_t i : ints_of(d, "unread")) k.unread |= i < 64 ? (1ull << i) : 0;
  for (int64_t i : ints_of(d, "unfilled")) k.unfilled |= i < 64 ? (1ull << i) : 0;
  for (int64_t i : ints_of(d, "written")) k.written.push_back(static_cast<int>(i));
  for (int64_t i : ints_of(d, "view_outputs")) k.view_outputs |= i < 64 ? (1ull << i) : 0;
  for (int64_t i : ints_of(d, "written_outputs")) k.written_outputs |= i < 64 ? (1ull << i) : 0;
  PyObject* args = PyDict_GetItemString(d, "args");  // ((name, kwarg_only, kind), ...)
  for (Py_ssize_t i = 0; args && PyTuple_Check(args) && i < PyTuple_GET_SIZE(args); ++i) {
    PyObject* a = PyTuple_GET_ITEM(args, i);
    k.arg_names.push_back(intern(PyUnicode_AsUTF8(PyTuple_GET_ITEM(a, 0))));
    k.kwarg_only.push_back(PyObject_IsTrue(PyTuple_GET_ITEM(a, 1)) == 1);
    k.arg_kinds.push_back(static_cast<int8_t>(PyLong_AsLong(PyTuple_GET_ITEM(a, 2))));
  }
  PyErr_Clear();
}

const OpKind& kind_of(Thread& T, const at::RecordFunction& fn) {
  OpKey key{fn.name(), fn.overload_name()};
  if (T.generation != g_generation) T.kinds.clear(), T.generation = g_generation;
  auto cached = T.kinds.find(key);
  if (cached != T.kinds.end()) return *cached->second;
  const char* name = key.first;
  const char* overload = key.second;
  {
    std::lock_guard<std::recursive_mutex> lock(mu);
    auto it = kinds.find(key);
    if (it != kinds.end()) return *(T.kinds[key] = &it->second);
  }
  std::string qual(name);
  auto colon = qual.find("::");
  if (colon != std::string::npos) qual.replace(colon, 2, ".");
  qual += ".";
  qual += (overload && *overload) ? overload : "default";
  static const OpKind wrapper = [] {
    OpKind w;
    w.composite = true;
    return w;
  }();
  if (!g_classify) return wrapper;  // uninstalled: nothing is recorded, nothing is cached
  OpKind k;
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* r = g_classify ? PyObject_CallFunction(g_classify, "s", qual.c_str()) : nullptr;
  if (r == Py_None) {
    k.composite = k.wrapper = true;  // not a dispatcher op (a profiler range, a manual record)
  } else if (r && PyDict_Check(r)) {
    std::lock_guard<std::recursive_mutex> lock(mu);  // parse_kind interns names
    parse_kind(r, k);
  } else {
    PyErr_Clear();  // an op the Python side cannot resolve: recorded like any other op
  }
  Py_XDECREF(r);
  PyGILState_Release(gil);
  std::lock_guard<std::recursive_mutex> lock(mu);
  k.name = intern(qual);
  OpKind& stored = kinds[key] = k;
  T.kinds[key] = &stored;
  return stored;
}

PyObject* wrap(const at::Tensor& t) {
  if (!t.defined()) Py_RETURN_NONE;
  return THPVariable_Wrap(t);
}

// The forward op that created autograd node `seq`: the last outermost op that saw the
// sequence counter at `seq` (the counter moves on once the node is made); a node made inside
// a composite op belongs to the nearest earlier number.
void own(int64_t seq, int module, int op) {
  if (seq_owner.empty() || seq_owner.back().seq < seq) {
    seq_owner.push_back({seq, module, op});
    return;
  }
  auto it = std::lower_bound(seq_owner.begin(), seq_owner.end(), seq,
                             [](const Owner& o, int64_t s) { return o.seq < s; });
  if (it != seq_owner.end() && it->seq == seq)
    *it = {seq, module, op};
  else
    seq_owner.insert(it, {seq, module, op});
}

const Owner* owner_of(int64_t seq) {
  auto it = std::upper_bound(seq_owner.begin(), seq_owner.end(), seq,
                             [](int64_t s, const Owner& o) { return s < o.seq; });
  return it == seq_owner.begin() ? nullptr : &*(it - 1);
}

// A custom autograd Function's apply is a record named after its class, numbered with the
// sequence nr its backward node is about to take: that node belongs to the module calling
// apply, not (nearest earlier number) to whatever op ran before it.
void own_function(const Thread& T, const at::RecordFunction& fn) {
  if (fn.scope() != at::RecordScope::FUNCTION || fn.seqNr() < 0 || in_node(T) || (g_phase != FORWARD && g_phase != RECOMPUTE))
    return;
  std::lock_guard<std::recursive_mutex> lock(mu);
  own(fn.seqNr(), g_module, intern(fn.name()));
}

// The autograd engine wraps each node in an "autograd::engine::evaluate_function: X" record
// (FUNCTION scope): not an op, so the ops of the node stay outermost.
bool engine_record(const char* name) {
  static const char prefix[] = "autograd::engine::";
  return name[0] == 'a' && name[1] == 'u' && std::strncmp(name, prefix, sizeof(prefix) - 1) == 0;
}

// This thread's callback list holds callback `h` (a thread given a copy of the list before the
// callbacks were registered anew holds older handles: switching one it lacks would only warn).
bool holds(Thread& T, at::CallbackHandle h) {
  if (!h) return false;
  if (!T.callbacks) T.callbacks = &at::get_record_function_tls_();
  for (const auto& e : T.callbacks->sorted_tls_callbacks_)
    if (e.handle_ == h) return true;
  return false;
}

#include "observer_collective.h"

std::unique_ptr<at::ObserverContext> on_start(const at::RecordFunction& fn) {
  if (!g_installed) return nullptr;
  Thread& T = here();
  bool away = false;  // (foreign: looked at once)
  if (fn.scope() == at::RecordScope::FUNCTION && T.opaque == 0) {
    away = foreign(T);
    if (g_on && (away || T.collective > 0) && collective_work(T, fn)) return nullptr;
  }
  if (fn.scope() == at::RecordScope::FUNCTION && (T.opaque > 0 || away)) {
    // an op inside one no dispatch mode looks into (what its kernel calls): never recorded, so
    // neither its name nor its kind is looked up (most ops of a step are such inner ops)
    T.open.push_back({nullptr, INNER, 0});
    ++T.inner;
    return nullptr;
  }
  const char* name = fn.name();
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION || engine_record(name)) {
    // ops inside a node, and the engine's own ops on its outputs (reducing a gradient to its
    // input's shape), are backward ops of that node
    const char* colon = std::strstr(name, ": ");
    std::string_view node(colon ? colon + 2 : name);
    std::lock_guard<std::recursive_mutex> lock(mu);
    if (!T.nodes.empty() && T.nodes.back().first < 0 && fn.seqNr() >= 0)
      T.nodes.back().first = fn.seqNr();  // the engine's record learns its node's number
    T.nodes.emplace_back(fn.seqNr(), intern(node));
    if (fn.scope() != at::RecordScope::BACKWARD_FUNCTION) T.open.push_back({nullptr, ENGINE, 0});
    return nullptr;
  }
  const OpKind& k = kind_of(T, fn);
  if (k.wrapper && T.opaque == 0 && g_on) own_function(T, fn);
  uint8_t flags = k.composite ? 0 : OPAQUE;
  if (T.opaque == 0 && !k.composite && g_on && !tracing()) {
    auto in = fn.inputs();
    T.args.assign(in.begin(), in.end());
    if (wrapper_args(T.args)) {  // looked through: the ops its __torch_dispatch__ runs are recorded
      T.args.clear();
      T.open.push_back({&k, 0, T.inner, 0});
      return nullptr;
    }
    flags |= RECORD;
    ++T.opaque;  // ops run by before_op (Python hooks: a generator's state...) are not the user's
    try {
      before_op(T, fn, k);
    } catch (const std::exception& e) {
      on_error(e.what());
    }
    --T.opaque;
    // QUIET: the ops its kernel calls would each make a RecordFunction (their arguments and
    // outputs boxed) only to be passed over here as INNER (~1.3k instructions each). Our
    // callback is turned off for the op's span, by its handle, so that other RecordFunction
    // users (torch's profiler) still see them; torch runs this op's end callback from the
    // list it started with, which turns it on again, also when the kernel raises. Turning it
    // off and on rebuilds torch's list of that scope (~1.1k instructions), so only kinds that
    // were seen calling QUIET_FROM ops or more go quiet.
    if (k.quiet.on.load(std::memory_order_relaxed) && holds(T, g_handle)) {
      at::disableCallback(g_handle);
      flags |= QUIET;
    }
  }
  T.opaque += flags & OPAQUE;
  T.open.push_back({&k, flags, T.inner, flags & QUIET ? g_handle : 0});
  return nullptr;
}

void on_end(const at::RecordFunction& fn, at::ObserverContext*) {
  if (!g_installed) return;
  Thread& T = here();
  if (fn.scope() == at::RecordScope::BACKWARD_FUNCTION) {
    if (!T.nodes.empty()) T.nodes.pop_back();
    return;
  }
  if (T.open.empty()) return;  // started before the observer was registered
  auto [k, flags, inner_before, off] = T.open.back();
  T.open.pop_back();
  if (flags & INNER) return;
  if (flags & ENGINE) {  // the engine's record of a node (told at its start, without reading its name again)
    if (!T.nodes.empty()) T.nodes.pop_back();
    return;
  }
  if (flags & FOREIGN) {
    --T.opaque;
    try {
      if (g_on) foreign_op(T, fn, *k);
    } catch (const std::exception& e) {
      on_error(e.what());
    }
    T.args.clear();
    return;
  }
  T.opaque -= flags & OPAQUE;
  if (!(flags & RECORD)) return;
  if (g_on) {
    ++T.opaque;  // ops run while judging (and on a hit, in Python) are not the user's
    try {
      on_op(T, fn, *k);
    } catch (const std::exception& e) {
      on_error(e.what());
    }
    --T.opaque;
  }
  if (flags & QUIET) {
    if (holds(T, off)) at::reenableCallback(off);
  } else if (T.inner - inner_before >= QUIET_FROM) {
    k->quiet.on.store(true, std::memory_order_relaxed);
  }
  T.args.clear();
}

// The callback is registered only while checking is on: ops of steps not selected (and of
// the optimizer step) pay nothing, not even the boxing of their arguments. Two callbacks, one
// a scope: turning the ops' one off and on (QUIET) rebuilds torch's list of that scope alone,
// and autograd's node records still reach the observer meanwhile.
void set_registered(bool on) {
  if (on && !g_handle && g_installed) {
    g_home = std::this_thread::get_id(), ++g_home_generation;
    g_handle = at::addThreadLocalCallback(at::RecordFunctionCallback(on_start, on_end)
                                              .needsInputs(true)
                                              .needsOutputs(true)
                                              .scopes({at::RecordScope::FUNCTION}));
    g_handle_bw = at::addThreadLocalCallback(
        at::RecordFunctionCallback(on_start, on_end).scopes({at::RecordScope::BACKWARD_FUNCTION}));
  } else if (!on && g_handle) {
    at::removeCallback(g_handle);
    at::removeCallback(g_handle_bw);
    g_handle = g_handle_bw = 0;
  }
}


// ---- install / uninstall / register, the parts every observer shares ---------------------------
// The observer starts (with the GIL): false, with a Python error set, when one is installed.
bool start_observer(PyObject* classify, const char* what) {
  if (g_installed) {
    PyErr_Format(PyExc_RuntimeError, "the native %s observer is already installed", what);
    return false;
  }
  Py_INCREF(classify);
  g_classify = classify;
  g_installed = true;
  Thread& T = here();
  T.opaque = 0;
  T.open.clear();
  return true;
}

// The observer stops: its callback removed, the op kinds forgotten (their cache dropped by every
// thread), `clear` run under the lock to forget the observer's own state.
template <typename F>
void stop_observer(F clear) {
  set_registered(false);
  g_installed = false;
  g_on = false;
  {
    std::lock_guard<std::recursive_mutex> lock(mu);
    clear();
    kinds.clear();
    ++g_generation;
  }
  Py_CLEAR(g_classify);
  Thread& T = here();
  T.args.clear(), T.nodes.clear();
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

}  // namespace
