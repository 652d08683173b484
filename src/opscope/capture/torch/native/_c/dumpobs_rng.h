// Random ops: the generator state before the op draws, so that replay draws the same numbers
// (included by dumpobs.cpp).
namespace {
// "rng" JSON of the CPU generator's state as the `rng` hook writes it (json.dumps of the device
// and the state's bytes in base64), made here into `s` (its memory reused from op to op): no GIL
// taken in the middle of the op, no Python.
void cpu_rng_json(std::string& s) {
  at::Generator gen = at::detail::getDefaultCPUGenerator();
  at::Tensor state;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());  // as torch.get_rng_state() reads it
    state = gen.get_state();
  }
  static constexpr char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  const auto* p = static_cast<const unsigned char*>(state.const_data_ptr());
  size_t n = static_cast<size_t>(state.numel());
  static constexpr char head[] = "{\"device\": \"cpu\", \"state\": \"";
  s.assign(sizeof head - 1 + (n + 2) / 3 * 4 + 2, '"');
  char* out = s.data() + sizeof head - 1;
  std::memcpy(s.data(), head, sizeof head - 1);
  size_t i = 0;
  for (; i + 3 <= n; i += 3, out += 4) {
    uint32_t v = uint32_t(p[i]) << 16 | uint32_t(p[i + 1]) << 8 | p[i + 2];
    out[0] = digits[v >> 18], out[1] = digits[v >> 12 & 63], out[2] = digits[v >> 6 & 63], out[3] = digits[v & 63];
  }
  if (i < n) {  // one or two bytes left: padded
    uint32_t v = uint32_t(p[i]) << 16 | (i + 1 < n ? uint32_t(p[i + 1]) << 8 : 0);
    out[0] = digits[v >> 18], out[1] = digits[v >> 12 & 63];
    out[2] = i + 1 < n ? digits[v >> 6 & 63] : '=';
    out[3] = '=';
  }
  s.back() = '}';
}

void rng_before(const Thread& T, const OpKind& k) {
  g_rng.clear();
  if (!k.random || !g_hooks) return;
  c10::Device device(at::kCPU);  // that of the first tensor argument
  for (const auto& a : T.args)
    if (a.isTensor() && a.toTensor().defined()) {
      device = a.toTensor().device();
      break;
    }
  if (device.is_cpu()) return cpu_rng_json(g_rng);
  PyGILState_STATE gil = PyGILState_Ensure();
  PyObject* r = PyObject_CallMethod(g_hooks, "rng", "s", device.str().c_str());
  if (r && PyUnicode_Check(r)) g_rng = PyUnicode_AsUTF8(r);
  if (!r) hook_failed("generator state");
  Py_XDECREF(r);
  PyGILState_Release(gil);
}
}  // namespace

