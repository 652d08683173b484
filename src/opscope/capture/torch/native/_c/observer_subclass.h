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

// A tensor subclass dispatched to Python (FakeTensor, FunctionalTensor, a wrapper subclass)
// may say "cpu" while it holds no data: its elements must never be read.
bool python_tensor(const at::Tensor& t) {
  return t.key_set().has(c10::DispatchKey::Python);
}

bool measurable(const at::Tensor& t) {
  return t.defined() && at::isFloatingType(t.scalar_type()) && !t.is_meta() && !python_tensor(t) && t.numel() > 0 &&
         t.layout() == at::kStrided;
}

// Does an op get a tensor subclass that Python dispatches (DTensor, AsyncCollectiveTensor)?
// Such an op is looked through, as a composite one is: its __torch_dispatch__ runs the same op
// (or a redistribution's collectives first) on the plain tensors it holds, and those ops are
// the ones recorded, with data and statistics (tensor parallelism's shards, FSDP2's optimizer
// on its parameters' local shards). Recorded itself, it would be a row with no data whose
// inner ops nothing records.
bool python_args(const std::vector<c10::IValue>& args) {
  for (const c10::IValue& a : args) {
    if (a.isTensor()) {
      if (python_tensor(a.toTensor())) return true;
    } else if (a.isTensorList()) {
      for (const at::Tensor& t : a.toTensorList())
        if (python_tensor(t)) return true;
    } else if (a.isList()) {  // Tensor?[] (index's indices)
      for (const c10::IValue& e : a.toListRef())
        if (e.isTensor() && python_tensor(e.toTensor())) return true;
    }
  }
  return false;
}
