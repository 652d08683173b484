// Tensor subclasses and tracing modes: what the observer must never read, and the ops it looks
// through (included by observer.h).

// Fake, proxy or functional tensor mode on: the op is being traced (torch.compile, export,
// make_fx), not run; its tensors have no data. Such ops are not the user's and are never
// recorded. One TLS read when no mode is set (the usual case).
bool tracing() {
  using c10::impl::TorchDispatchModeKey, c10::impl::TorchDispatchModeTLS;
  if (!TorchDispatchModeTLS::any_modes_set(false)) return false;
  return TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FAKE).has_value() ||
         TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::PROXY).has_value() ||
         TorchDispatchModeTLS::get_mode(TorchDispatchModeKey::FUNCTIONAL).has_value();
}

// A tensor that wraps others, whose elements must never be read (it may say "cpu" while it
// holds no storage): a subclass dispatched to Python (FakeTensor, FunctionalTensor, DTensor),
// functorch's wrappers (torch.vmap's BatchedTensor, torch.func.grad's TensorWrapper: before
// session 27 the first op on one stopped the dump), a functional tensor.
constexpr c10::DispatchKeySet FUNCTORCH({c10::DispatchKey::FuncTorchBatched, c10::DispatchKey::FuncTorchGradWrapper,
                                         c10::DispatchKey::Functionalize, c10::DispatchKey::BatchedNestedTensor});
constexpr c10::DispatchKeySet WRAPPERS = FUNCTORCH | c10::DispatchKeySet(c10::DispatchKey::Python);

bool wrapper_tensor(const at::Tensor& t) {
  return t.key_set().has_any(WRAPPERS);
}

bool measurable(const at::Tensor& t) {
  return t.defined() && at::isFloatingType(t.scalar_type()) && !t.is_meta() && !wrapper_tensor(t) && t.numel() > 0 &&
         t.layout() == at::kStrided;
}

// Does an op get a tensor that wraps others (wrapper_tensor: DTensor, AsyncCollectiveTensor,
// torch.vmap's batched tensors)? Such an op is looked through, as a composite one is: its
// __torch_dispatch__ (a batching rule) runs the same op (or a redistribution's collectives
// first) on the plain tensors it holds, and those ops are the ones recorded, with data and
// statistics (tensor parallelism's shards, FSDP2's optimizer on its parameters' local shards,
// a vmapped function's ops on the whole batch). Recorded itself, it would be a row with no data
// whose inner ops nothing records.
bool wrapper_args(const std::vector<c10::IValue>& args) {
  for (const c10::IValue& a : args) {
    if (a.isTensor()) {
      if (wrapper_tensor(a.toTensor())) return true;
    } else if (a.isTensorList()) {
      for (const at::Tensor& t : a.toTensorList())
        if (wrapper_tensor(t)) return true;
    } else if (a.isList()) {  // Tensor?[] (index's indices)
      for (const c10::IValue& e : a.toListRef())
        if (e.isTensor() && wrapper_tensor(e.toTensor())) return true;
    }
  }
  return false;
}
