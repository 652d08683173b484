// Included by dumpobs_device.h inside namespace device_stats: tensors of a device copied into a
// staging buffer of their device and dtype, each at a whole 32-bit word (1- and 2-byte dtypes
// padded with zeros to the next word, as the hash pads a tensor's last word), and a full buffer
// reduced at once. A tensor's float statistics are a segment of segment_reduce (its padding a
// segment of its own, left out), its hash the segment sums of the terms of its words (each
// word's index counted from its tensor's first). Where the device lacks an op of this, the
// buffer's tensors are reduced one by one, and the device's later tensors alone. The ops run on the stream the copies
// were made on; the results stay on the device until the step's rows are taken.

struct Stage {  // one device's and dtype's buffer
  at::Tensor buf;                      // g_staging bytes, in elements of its dtype (made on first use)
  std::optional<c10::Stream> stream;   // where its copies are issued
  int64_t used = 0;                    // elements taken, padding included
  std::vector<size_t> rows;
  std::vector<int64_t> numel, padded;  // each tensor's elements, and with its padding
};
std::map<Key, Stage> stages;
std::vector<c10::Stream> streams;  // those this step's reductions ran on

c10::Stream stream_of(const c10::Device& d) { return c10::impl::VirtualGuardImpl(d.type()).getStream(d); }

void seen(const c10::Stream& s) {
  if (std::find(streams.begin(), streams.end(), s) == streams.end()) streams.push_back(s);
}

at::Tensor ints_on(const std::vector<int64_t>& v, const c10::Device& d) {  // no synchronisation
  at::Tensor host = at::tensor(v, at::kLong);
  if (d.is_cpu()) return host;
  try {
    host = host.pin_memory();  // copied without waiting for the stream
  } catch (const std::exception&) {
  }
  return host.to(d, /*non_blocking=*/true);
}

at::Tensor segment_sum(const at::Tensor& v, const at::Tensor& lengths) {
  return at::segment_reduce(v, "sum", lengths, std::nullopt, std::nullopt, 0, /*unsafe=*/true);
}

// Sums mod 2^32 of int32 terms, by segment: of their 16-bit halves in float64 (exact below 2^53,
// ~2^37 terms a segment), put together in int64 (index_add's atomics on one sum a tensor would
// queue on a GPU).
at::Tensor word_sums(const at::Tensor& m, const at::Tensor& lengths) {
  at::Tensor lo = segment_sum(m.bitwise_and(0xFFFF).to(at::kDouble), lengths);
  at::Tensor hi = segment_sum(at::bitwise_right_shift(m, 16).bitwise_and_(0xFFFF).to(at::kDouble), lengths);
  return lo.to(at::kLong).add_(hi.to(at::kLong).mul_(65536));
}

// The hash's two sums of each tensor in the buffer's first `used` elements.
void hash_buffer(Stage& s, Result& r) {
  const size_t k = r.rows.size();
  const int64_t es = s.buf.element_size();
  std::vector<int64_t> words(k), first(k);
  for (size_t i = 0, at = 0; i < k; at += static_cast<size_t>(words[i]), ++i)
    words[i] = s.padded[i] * es / 4, first[i] = static_cast<int64_t>(at);
  const c10::Device d = s.buf.device();
  at::Tensor w = s.buf.narrow(0, 0, s.used).view(at::kByte).view(at::kInt), len = ints_on(words, d);
  // each word's index in its tensor: its index in the buffer less its tensor's first word's
  at::Tensor salt = at::arange(w.numel(), at::TensorOptions(at::kLong).device(d))
                        .sub_(at::repeat_interleave(ints_on(first, d), len, 0, w.numel()))
                        .to(at::kInt)
                        .mul_(static_cast<int64_t>(static_cast<int32_t>(GOLD)));
  at::Tensor m = mix(w, salt);
  r.h2 = word_sums(m, len);
  r.h1 = word_sums(m.bitwise_xor_(salt), len);
}

Result reduce_buffer(Stage& s) {
  if (g_route == 2) throw std::runtime_error("a device without segment_reduce (route_device(2))");
  Result r;
  r.rows = s.rows, r.numel = s.numel, r.stride = 2, r.squares = true;
  r.floating = at::isFloatingType(s.buf.scalar_type());
  std::vector<int64_t> lengths;  // each tensor's elements, then its padding's
  for (size_t i = 0; i < s.rows.size(); ++i) lengths.insert(lengths.end(), {s.numel[i], s.padded[i] - s.numel[i]});
  at::Tensor len = ints_on(lengths, s.buf.device()), data = s.buf.narrow(0, 0, s.used);
  at::Tensor f = data.to(wide(data.scalar_type()) ? at::kDouble : at::kFloat);
  r.mn = at::segment_reduce(f, "min", len, std::nullopt, std::nullopt, 0, true);
  r.mx = at::segment_reduce(f, "max", len, std::nullopt, std::nullopt, 0, true);
  at::Tensor dbl = f.to(at::kDouble);
  r.sum = segment_sum(dbl, len);
  r.sq = segment_sum(dbl.mul(dbl), len);
  if (r.floating) {
    r.nan = segment_sum(at::isnan(f).to(at::kDouble), len);
    r.inf = segment_sum(at::isinf(f).to(at::kDouble), len);
  }
  r.zeros = segment_sum(f.eq(0).to(at::kDouble), len);
  hash_buffer(s, r);
  return r;
}

std::vector<int> unbatched;  // device types whose ops a buffer's reduction needs failed on

void flush(Stage& s) {
  if (s.rows.empty()) return;
  c10::StreamGuard on(*s.stream);
  seen(*s.stream);
  try {
    results.push_back(reduce_buffer(s));
  } catch (const std::exception&) {  // (segment_reduce on a backend without it): each tensor alone
    unbatched.push_back(static_cast<int>(s.buf.device().type()));
    for (size_t i = 0, at = 0; i < s.rows.size(); at += s.padded[i], ++i)
      results.push_back(alone(s.rows[i], s.buf.narrow(0, static_cast<int64_t>(at), s.numel[i])));
  }
  s.used = 0, s.rows.clear(), s.numel.clear(), s.padded.clear();
}

// Copy `x` into its buffer (a full one reduced first); false: it is reduced alone.
bool stage(size_t row, const at::Tensor& x) {
  const int64_t n = x.numel(), es = x.element_size(), per_word = es >= 4 ? 1 : 4 / es;
  const int64_t padded = (n + per_word - 1) / per_word * per_word, cap = g_staging / 4 * 4 / es;
  if (n == 0 || padded > cap ||
      std::find(unbatched.begin(), unbatched.end(), static_cast<int>(x.device().type())) != unbatched.end())
    return false;
  const c10::Stream now = stream_of(x.device());
  Stage& s = stages[key_of(x)];
  if (s.stream && *s.stream != now) {  // another stream: the buffer's tensors reduced on theirs, a new buffer
    flush(s);
    s.buf = at::Tensor();
  }
  if (s.used + padded > cap) flush(s);
  if (!s.buf.defined()) s.buf = at::empty({cap}, at::TensorOptions(x.scalar_type()).device(x.device()));
  s.stream = now;
  s.buf.narrow(0, s.used, n).view(x.sizes()).copy_(x);
  if (padded > n) s.buf.narrow(0, s.used + n, padded - n).zero_();
  s.rows.push_back(row), s.numel.push_back(n), s.padded.push_back(padded);
  s.used += padded;
  return true;
}

void flush_all() {
  for (auto& [key, s] : stages) flush(s);
  for (const c10::Stream& s : streams)  // (the transfer to the host runs on the current stream)
    if (s != stream_of(s.device())) c10::impl::VirtualGuardImpl(s.device_type()).synchronizeStream(s);
  streams.clear();
}

void drop() {  // (a step cleared: its rows are gone)
  results.clear(), streams.clear();
  for (auto& [key, s] : stages) s.used = 0, s.rows.clear(), s.numel.clear(), s.padded.clear();
}

void release() {  // between captured steps: the buffers' memory back to the device's allocator
  drop();
  stages.clear(), unbatched.clear();
}
