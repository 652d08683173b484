// API-level calls recorded by the native dump (included by dumpobs_module.h): the Python
// TorchFunctionMode of native/api.py hands each torch-function call's tensors to api_begin
// (before the call runs: an in-place call changes its inputs) and api_end (after it), which
// make the rows as Recorder.record_inputs / record_outputs do for the Python api level, measure
// at once and keep the data flow in C++. Backward: a C++ post hook on the autograd node of each
// output makes the row of the node's gradients (as levels._backward_recorder does) without
// entering Python. Rows, call indices, links and notes are those of the Python path.
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/function.h>

namespace {

std::vector<Head> api_calls;  // calls begun and not ended (a stack: the token is the depth)
// per begun call: it writes part of memory that holds no data yet (empty); the first input that
// has a row (its row and tensor, and where it lies: for the rows of outputs that view it)
// What holds_elements_of needs of a call's first input (nothing held: a call that raised leaves
// its entry until a call below it ends)
struct Elements {
  const c10::StorageImpl* storage = nullptr;
  int64_t numel = -1;
  int8_t dtype = -1;
  bool conj = false, neg = false;
};
struct ApiOpen {
  bool empty = false, views = false;
  int64_t first = -1;
  Elements elements;
  Base base;
};
std::vector<ApiOpen> api_open;
int64_t g_api_step = -2;        // the step api_calls belong to
// autograd nodes already hooked (levels.py marks node.metadata): a weak reference tells a node
// still alive from a new one at a reused address
std::unordered_map<const torch::autograd::Node*, c10::weak_intrusive_ptr<torch::autograd::Node>> api_nodes;
std::atomic<bool> g_api_told{false};  // Python was told that backward ran since the last forward call

// A new step: calls begun before it are not ended into it; nodes freed since are forgotten.
void api_new_step() {
  g_api_step = g_step;
  api_calls.clear();
  api_open.clear();
  for (auto it = api_nodes.begin(); it != api_nodes.end();) it = it->second.expired() ? api_nodes.erase(it) : ++it;
}

// The session's phase turns to backward (DumpSession.backward_ran). It takes the GIL: never
// called under mu, which a thread holding the GIL takes (api_call, api_begin).
void api_backward_ran() {
  if (g_api_told.exchange(true)) return;
  PyGILState_STATE gil = PyGILState_Ensure();
  if (g_hooks) {  // (uninstall clears it with the GIL held)
    PyObject* r = PyObject_CallMethod(g_hooks, "backward_ran", nullptr);
    if (!r) hook_failed("backward_ran");
    Py_XDECREF(r);
  }
  PyGILState_Release(gil);
}

Elements elements_of(const at::Tensor& t) {
  if (!t.defined() || !t.has_storage()) return Elements{};
  return Elements{t.storage().unsafeGetStorageImpl(), t.numel(), static_cast<int8_t>(t.scalar_type()), t.is_conj(),
                  t.is_neg()};
}

// Is `view` a view of the storage of the tensor `base` describes, with as many elements of its
// dtype, its signs and conjugation: all of them, where the call keeps its argument's elements?
// (dataflow.py holds_elements_of, on the Python path.)
bool holds_elements_of(const at::Tensor& view, const Elements& base) {
  return base.storage && view.is_view() && view.has_storage() &&
         view.storage().unsafeGetStorageImpl() == base.storage &&
         static_cast<int8_t>(view.scalar_type()) == base.dtype && view.numel() == base.numel &&
         view.is_conj() == base.conj && view.is_neg() == base.neg;
}

// The rows of one hooked node's gradients: grad_outputs as inputs, grad_inputs as outputs.
void grad_rows(const Head& h, const torch::autograd::variable_list& grad_inputs,
               const torch::autograd::variable_list& grad_outputs, bool views) {
  static const int a_out = intern("grad_output"), a_in = intern("grad_input");
  int64_t first = -1;  // (as api_begin_items finds it)
  size_t first_at = 0;
  if (g_inputs || views)
    for (size_t i = 0; i < grad_outputs.size(); ++i)
      if (grad_outputs[i].defined())
        if (int64_t r = input_row(h, static_cast<int>(i), a_out, grad_outputs[i]); r >= 0 && first < 0 && views)
          first = r, first_at = i;
  Base base = first >= 0 ? base_of(grad_outputs[first_at]) : Base{};
  Elements elements = first >= 0 ? elements_of(grad_outputs[first_at]) : Elements{};
  if (!g_outputs) return;
  for (size_t i = 0; i < grad_inputs.size(); ++i)
    if (grad_inputs[i].defined()) {
      bool view = first >= 0 && holds_elements_of(grad_inputs[i], elements);
      output_row(h, static_cast<int>(i), grad_inputs[i], view ? first : -1, false, view ? &base : nullptr);
      rows.back().arg = a_in;
    }
}

// The hook of one node's gradients (grad_rows). views: the forward call keeps its argument's
// elements (views_first): a gradient that is a view holding all of the first incoming gradient's
// elements (a view's or a transpose's) is linked to that gradient's row.
struct ApiGradHook : torch::autograd::FunctionPostHook {
  int64_t install;
  int op, mod, node;
  bool views;
  ApiGradHook(int64_t i, int o, int m, int n, bool v) : install(i), op(o), mod(m), node(n), views(v) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grad_inputs,
                                            const torch::autograd::variable_list& grad_outputs) override {
    {
      std::lock_guard<std::recursive_mutex> lock(mu);
      if (install != g_installs || !g_hooks) return grad_inputs;
    }
    try {
      api_backward_ran();
    } catch (const std::exception& e) {
      std::lock_guard<std::recursive_mutex> lock(mu);
      g_on = false;
      on_error(e.what());
      return grad_inputs;
    }
    std::lock_guard<std::recursive_mutex> lock(mu);
    if (install != g_installs || !g_hooks) return grad_inputs;
    try {
      if (!g_on || !selected(mod, op, BACKWARD)) return grad_inputs;
      Head h{g_seq++, calls[std::make_tuple(mod, static_cast<int>(BACKWARD), op)]++, BACKWARD, mod, op, op, node, -1};
      set_data(h);
      grad_rows(h, grad_inputs, grad_outputs, views);
    } catch (const std::exception& e) {
      g_on = false;
      on_error(e.what());
    }
    return grad_inputs;
  }
};

// A view that no_grad made of a tensor that requires grad, once written in place (`w[1] += d`),
// raises on any read of its grad_fn: such an output has no node to hook.
void api_hook_node(const Head& h, const at::Tensor& t, bool views) {
  if (!t.requires_grad()) return;
  std::decay_t<decltype(t.grad_fn())> node;
  try {
    node = t.grad_fn();
  } catch (const c10::Error&) {
    return;
  }
  if (!node) return;
  auto it = api_nodes.find(node.get());
  if (it != api_nodes.end() && !it->second.expired()) return;
  api_nodes.insert_or_assign(node.get(), c10::weak_intrusive_ptr<torch::autograd::Node>(node));
  node->add_post_hook(std::make_unique<ApiGradHook>(g_installs, h.op, h.module, intern(node->name()), views));
}

// Does `t` hold no data yet (an empty's memory, or one written since only in part)?
bool holds_no_data(const at::Tensor& t) {
  const Flow* f = find_flow(t);
  return f ? (rows[f->row].marks & NODATA) != 0 : made_empty(t) && !holds_collective(t);
}

// api_begin(op, module, phase, inputs, args, unread, writes, views) -> token: the call's head and
// its input rows. inputs: (slot, arg name or None, tensor) items; args: the arguments' JSON text or
// None; unread: the call fills its first argument without reading it (model/calls.py
// overwrites_first); writes: it writes its first argument in place, maybe only in part
// (`q[:, :8] = h`, Tensor.__setitem__), or only rearranges its elements (model/calls.py
// rearranges: `q[..., :n]`): where that holds no data yet, the call reads none and leaves none
// (its outputs are an empty's, api_end); views: an output that is a view holding all its first
// input's elements holds them (model/calls.py views_first), linked to that input's row (api_end).
// A call's tensor, borrowed: (slot, interned keyword or -1, tensor).
struct CallItem {
  int slot, arg;
  PyObject* t;
};

// Python's (slot, keyword or None, tensor) items as CallItems (borrowed from `items`, which the
// caller holds); false with a Python error set where they are not such items.
bool call_items(PyObject* items, std::vector<CallItem>& out) {
  return each_call_item_obj(items, [&](int slot, int arg, PyObject* t) { out.push_back(CallItem{slot, arg, t}); });
}

// The begin of api_begin and api_call: the token (the call's depth in api_calls).
Py_ssize_t api_begin_items(int op_name, int mod, int phase, const std::vector<CallItem>& ins, const char* text,
                           Py_ssize_t text_n, bool unread, bool writes, bool views) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  if (g_api_step != g_step) api_new_step();
  if (phase == FORWARD) g_api_told = false;
  int64_t call = calls[std::make_tuple(mod, phase, op_name)]++;
  Head h{g_seq++, call, static_cast<int8_t>(phase), mod, op_name, -1, -1, -1};
  set_data(h);
  if (text) h.args = args_doc(text, static_cast<size_t>(text_n));
  ApiOpen open;
  open.views = views;
  if (g_inputs || writes || views)
    for (const CallItem& it : ins) {
      const at::Tensor& t = THPVariable_Unpack(it.t);
      if (it.slot == 0 && !unread && writes && holds_no_data(t)) {
        open.empty = true;
        if (g_inputs) rows[new_row(h, IO_INPUT, 0, it.arg, t)].note = N_UNINITIALIZED;
      } else if (!g_inputs && !views) {
      } else if (it.slot == 0 && unread) {
        if (g_inputs) unread_row(h, 0, it.arg, t);
      } else if (int64_t r = input_row(h, it.slot, it.arg, t); r >= 0 && open.first < 0 && views) {
        open.first = r, open.elements = elements_of(t), open.base = base_of(t);  // (as Recorder.record_inputs)
      }
    }
  api_calls.push_back(h);
  api_open.push_back(open);
  return static_cast<Py_ssize_t>(api_calls.size()) - 1;
}

PyObject* py_api_begin(PyObject*, PyObject* a) {
  const char *op, *module;
  int phase, unread, writes = 0, views = 0;
  PyObject *ins, *args;
  if (!PyArg_ParseTuple(a, "ssiOOp|pp", &op, &module, &phase, &ins, &args, &unread, &writes, &views)) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);  // (intern)
  std::vector<CallItem> items;
  if (!call_items(ins, items)) return nullptr;
  const char* text = nullptr;
  Py_ssize_t n = 0;
  if (PyUnicode_Check(args) && !(text = PyUnicode_AsUTF8AndSize(args, &n))) return nullptr;
  return PyLong_FromSsize_t(api_begin_items(intern(op), *module ? intern(module) : -1, phase, items, text, n, unread,
                                            writes, views));
}

// api_end(token, outputs, mutated, grads, empty, first): the call's output rows (mutated: written
// in place; empty: memory that holds no data yet, torch.empty_like's); grads: hook the autograd
// node of each output that requires grad, for its backward row; first: the argument a call that
// returns nothing wrote (Tensor.__setitem__), recorded as its output where it holds no data yet.
void api_end_items(Py_ssize_t token, const std::vector<CallItem>& outs, bool mutated, bool grads, bool empty,
                   PyObject* first) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  if (g_api_step != g_step || token < 0 || static_cast<size_t>(token) >= api_calls.size())
    return;  // begun in an earlier step
  const Head h = api_calls[token];
  const ApiOpen open = api_open[token];
  empty = empty || open.empty;
  api_calls.resize(token);  // and any call above it that raised before its end
  api_open.resize(token);
  for (const CallItem& it : outs) {
    const at::Tensor& t = THPVariable_Unpack(it.t);
    if (mutated) ++g_writes[storage_of(t)];  // before its row: the row holds what the write left
    if (g_outputs && empty) {
      empty_row(h, it.slot, t);
    } else if (g_outputs) {
      // an in-place output is registered at the version it has now (at the API level torch
      // moved it before the call returned): the next use of the tensor links to this row
      int64_t src = open.first >= 0 && holds_elements_of(t, open.elements) ? open.first : -1;
      output_row(h, it.slot, t, src, mutated, src >= 0 ? &open.base : nullptr);
    }
    if (grads) api_hook_node(h, t, open.views);
  }
  if (outs.empty() && g_outputs && first && THPVariable_Check(first)) {
    const at::Tensor& t = THPVariable_Unpack(first);
    if (empty) {
      empty_row(h, 0, t);
    } else if (mutated) {  // written in place, not returned (Tensor.__setitem__): measured at its next read
      size_t i = new_row(h, IO_OUTPUT, 0, -1, t, -1);
      rows[i].note = N_WRITTEN;
      written_here(t, i, false);
    }
  }
}

PyObject* py_api_end(PyObject*, PyObject* a) {
  Py_ssize_t token;
  PyObject *outs, *first = Py_None;
  int mutated, grads, empty = 0;
  if (!PyArg_ParseTuple(a, "nOpp|pO", &token, &outs, &mutated, &grads, &empty, &first)) return nullptr;
  std::lock_guard<std::recursive_mutex> lock(mu);  // (intern)
  std::vector<CallItem> items;
  if (!call_items(outs, items)) return nullptr;
  api_end_items(token, items, mutated, grads, empty, first);
  Py_RETURN_NONE;
}

// api_write(tensors): an API call is about to write them in place without moving their version
// counters (F.batch_norm's running statistics, the AMP unscale: api_writes.py): counted as an
// in-place call's write (g_writes), their views forgotten.
PyObject* py_api_write(PyObject*, PyObject* a) {
  std::lock_guard<std::recursive_mutex> lock(mu);
  bool ok = each_call_item(a, [&](int, int, const at::Tensor& t) {
    forget_views(t);
    ++g_writes[storage_of(t)];
  });
  if (!ok) return nullptr;
  Py_RETURN_NONE;
}

}  // namespace
