// Measuring a tensor at the op (included by dumpobs.cpp inside its anonymous namespace): its
// statistics in one pass of the fastats kernel and, in a tensor dump, its bytes copied into the
// step's open shard (dumpobs_shards.h) right after, within tensor_limit_mb; and the geometry that
// keeps a view as its input's data (Recorder._view_geometry).
// ---- statistics ---------------------------------------------------------------------------------
int code_of(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return F32;
    case at::kDouble: return F64;
    case at::kHalf: return F16;
    case at::kBFloat16: return BF16;
    case at::kChar: return I8;
    case at::kByte: return U8;
    case at::kShort: return I16;
    case at::kInt: return I32;
    case at::kLong: return I64;
    case at::kBool: return BOOL;
    default: return -1;
  }
}

void finish_row(Row& r, const acc_t& a, int64_t n) {
  r.stats = HAVE;
  r.cnt[3] = a.hash;
  if (n == 0) {
    for (double& v : r.st) v = NAN;
    r.st[4] = 0.0;  // (None, None, None, None, 0.0, None, 0, 0, 0, hash): see take_rows
    r.cnt[0] = r.cnt[1] = r.cnt[2] = 0;
    return;
  }
  double mn = a.mn, mx = a.mx, mean = a.sum / n, std = acc_std(&a, n), norm = std::sqrt(a.sumsq);
  if (a.nan) mn = mx = mean = norm = NAN;
  double absmax = a.nan ? NAN : std::max(std::fabs(mn), std::fabs(mx));
  r.st[0] = mn, r.st[1] = mx, r.st[2] = mean, r.st[3] = std, r.st[4] = norm, r.st[5] = absmax;
  r.cnt[0] = a.nan, r.cnt[1] = a.inf, r.cnt[2] = a.zeros;
}

#include "dumpobs_device.h"

// ---- full tensors ---------------------------------------------------------------------------------
// Count a tensor against tensor_limit_mb (TensorPlan.admit): past it, tensor capture stops for
// the rest of the run, and where is kept for Python's message.
bool admit(const Row& r, size_t n) {
  if (g_stop.nbytes >= 0) return false;
  if (g_budget >= 0 && g_stored + static_cast<int64_t>(n) > g_budget) {
    g_stop = Stop{static_cast<int64_t>(n), r.phase, r.io, r.module, r.op, r.slot};
    g_want = false;
    return false;
  }
  g_stored += static_cast<int64_t>(n), ++g_stored_n;
  return true;
}

// The bytes of x (contiguous, on the CPU, at p) as row `index`'s tensor: key r<id>.
void store_bytes(size_t index, const at::Tensor& x, const void* p) {
  const char* dtype = st_dtype(x.scalar_type());
  size_t n = static_cast<size_t>(x.numel()) * x.element_size();
  if (!dtype || !admit(rows[index], n)) return;
  size_t start = begin_tensor(n);
  rows[index].shard = open_shard_index(), rows[index].key = rows[index].id;
  append(static_cast<const char*>(p), n);
  end_tensor(rows[index].id, dtype, x.sizes(), start);
}

// A tensor the kernel does not read (another device, another dtype, a conjugate or negative
// view): torch's own copy brings its values, resolved and contiguous, to the CPU first.
void store_copy(size_t index, const at::Tensor& x) {
  if (!st_dtype(x.scalar_type()) || g_stop.nbytes >= 0) return;
  at::Tensor host;
  {
    Internal guard;
    host = at::empty(x.sizes(), at::TensorOptions().dtype(x.scalar_type()));
    host.copy_(x);
  }
  store_bytes(index, host, host.const_data_ptr());
}

void slow(size_t row, const at::Tensor& t);

#include "gather.h"

template <typename T>
void gather_row(unsigned char* out, const unsigned char* src, int64_t n, int64_t stride) {
  T* o = reinterpret_cast<T*>(out);
  const T* s = reinterpret_cast<const T*>(src);
  for (int64_t i = 0; i < n; ++i) std::memcpy(o + i, s + i * stride, sizeof(T));
}

// The elements of a non-contiguous CPU tensor in row-major order (the bytes contiguous() would
// give), copied into a buffer of this thread (kept: no allocation per tensor) without calling
// torch: contiguous() under the Internal guard cost ~13k instructions a tensor (turning
// RecordFunction off and on rebuilds its callbacks), most of it for a step's small tensors.
// Valid until the next call: read at once, not by the worker thread.
const void* gather(const at::Tensor& x) {
  static thread_local std::vector<unsigned char> buf;
  const size_t es = x.element_size();
  const int64_t n = x.numel(), d = x.dim();
  // grown only: resize() to a larger size zero-fills the new part, and gathers of a small and a
  // large tensor alternate (a step's token batch and its attention outputs)
  if (buf.size() < static_cast<size_t>(n) * es) buf.resize(static_cast<size_t>(n) * es);
  at::IntArrayRef sizes = x.sizes(), strides = x.strides();
  const int64_t inner = d ? sizes[d - 1] : 1, step = d ? strides[d - 1] : 0;
  const auto* base = static_cast<const unsigned char*>(x.const_data_ptr());
  c10::SmallVector<int64_t, 6> idx(static_cast<size_t>(std::max<int64_t>(d, 1)), 0);
  unsigned char* out = buf.data();
  bool tiled = false;
  switch (es) {
    case 1: tiled = gather_transposed(reinterpret_cast<uint8_t*>(out), x); break;
    case 2: tiled = gather_transposed(reinterpret_cast<uint16_t*>(out), x); break;
    case 4: tiled = gather_transposed(reinterpret_cast<uint32_t*>(out), x); break;
    default: tiled = gather_transposed(reinterpret_cast<uint64_t*>(out), x); break;
  }
  if (tiled) return out;
  int64_t offset = 0;  // elements from the first
  for (int64_t done = 0; done < n; done += inner, out += inner * es) {
    const unsigned char* src = base + offset * static_cast<int64_t>(es);
    if (step == 1) {  // a row of adjacent elements (a transposed batch's): one copy
      std::memcpy(out, src, static_cast<size_t>(inner) * es);
    } else {
      switch (es) {
        case 1: gather_row<uint8_t>(out, src, inner, step); break;
        case 2: gather_row<uint16_t>(out, src, inner, step); break;
        case 4: gather_row<uint32_t>(out, src, inner, step); break;
        default: gather_row<uint64_t>(out, src, inner, step); break;  // the kernel reads no wider type
      }
    }
    next_outer(offset, idx, sizes, strides, d - 2);  // the next row
  }
  return buf.data();
}

int64_t g_read_bytes = 0;  // bytes the statistics kernel was given to read, since the module loaded
// The kernel's own time on this thread (kernel_clock(True): benchmarks/bench_dump.py's floor; off,
// no clock is read), in nanoseconds since the clock was turned on
bool g_kernel_clock = false;
int64_t g_kernel_ns = 0;

struct KernelClock {  // times one pass of the kernel where the clock was on when it began
  bool on = g_kernel_clock;
  std::chrono::steady_clock::time_point start;
  KernelClock() {
    if (on) start = std::chrono::steady_clock::now();
  }
  ~KernelClock() {
    if (on)
      g_kernel_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  }
};

// A tensor stored as transposed planes (transposed_planes) measured at once in memory order
// (fastats_transposed.h: its hash the row-major one), without a gather: false where it is
// laid out otherwise or has 1-byte elements (or 2-byte ones in an odd number of columns).
bool measure_transposed(size_t index, const at::Tensor& x, int code, bool data) {
  int64_t planes = 0, R = 0, C = 0;
  if (!transposed_planes(x, &planes, &R, &C)) return false;
  acc_t a;
  acc_init(&a);
  bool done;
  {
    KernelClock clock;
    done = run_transposed(x.const_data_ptr(), planes, R, C, code, &a);
  }
  if (!done) return false;
  g_read_bytes += x.numel() * static_cast<int64_t>(x.element_size());
  finish_row(rows[index], a, x.numel());
  rows[index].memory_order = true;
  if (data) {  // a tensor dump stores the row-major bytes
    at::Tensor c;
    {
      Internal guard;
      c = x.contiguous();
    }
    store_bytes(index, c, c.const_data_ptr());
  }
  return true;
}

// A tensor stored as rows (fastats_rows.h: rows of 16 or more adjacent elements that a block
// of the kernel holds whole, such as attention's heads-permuted tensors) measured at once, in
// place, row by row: the row-major copy's statistics and hash, without the copy. False where it
// is laid out otherwise, has another dtype, or the CPU lacks the loops (then: gather).
bool measure_rows(size_t index, const at::Tensor& x, int code) {
  const int64_t d = x.dim(), n = x.numel();
  if (d < 2 || n == 0 || x.stride(d - 1) != 1 || !rows_fit(code, x.size(d - 1))) return false;
  static thread_local std::vector<const void*> starts;  // the rows' addresses, in row-major order
  static thread_local std::vector<unsigned char> block(BLOCK * sizeof(float));
  const int64_t inner = x.size(d - 1), es = static_cast<int64_t>(x.element_size());
  at::IntArrayRef sizes = x.sizes(), strides = x.strides();
  const auto* base = static_cast<const unsigned char*>(x.const_data_ptr());
  c10::SmallVector<int64_t, 6> idx(static_cast<size_t>(d), 0);
  starts.resize(static_cast<size_t>(n / inner));
  int64_t offset = 0;  // elements from the first
  for (auto& start : starts) {
    start = base + offset * es;
    next_outer(offset, idx, sizes, strides, d - 2);  // the next row
  }
  acc_t a;
  acc_init(&a);
  {
    KernelClock clock;
    run_rows(starts.data(), inner, n, code, &a, block.data());
  }
  if (a.cnt != static_cast<double>(n)) return false;  // (the blocked dtypes count every element)
  g_read_bytes += n * es;
  finish_row(rows[index], a, n);
  return true;
}

void measure(size_t index, const at::Tensor& t, bool data) {
  if (g_probe) return;  // a size probe: shapes and dtypes are all it needs
  Row& r = rows[index];
  if (t.is_meta()) {
    r.note = intern("meta tensor: no data, not measured");
    ++g_meta;
    return;
  }
  if (wrapper_tensor(t)) {  // FakeTensor, another subclass, vmap's batched: its data is not where it says
    r.note = intern(t.key_set().has_any(FUNCTORCH) ? "wrapped by torch.func (vmap, grad): not measured"
                                                   : "tensor subclass dispatched to Python: not measured");
    return;
  }
  if (t.layout() != at::kStrided || t.is_quantized()) {
    r.note = intern(c10::str(t.layout(), " tensor: not measured"));
    return;
  }
  at::Tensor x = t;
  if (x.is_complex() && (x.is_cpu() || data)) {
    Internal guard;
    x = at::view_as_real(x.is_conj() ? x.resolve_conj() : x);
  }
  if ((!x.is_cpu() || device_stats::g_route) && !g_route_slow && device_stats::measure(index, x)) {
    if (data) store_copy(index, x);  // (its row gets its statistics at the step's end)
    return;
  }
  int code = code_of(x.scalar_type());
  if (!x.is_cpu() || code < 0 || x.is_conj() || x.is_neg() || g_route_slow) {
    r.stats = SLOW;
    slow(index, t);
    if (data) store_copy(index, x);
    return;
  }
  const void* p = nullptr;
  if (!x.is_contiguous()) {
    if (measure_transposed(index, x, code, data)) return;
    if (!data && !g_async_on && measure_rows(index, x, code)) return;
    if (!data && !g_async_on && x.element_size() <= 8) {
      p = gather(x);  // statistics measured below, at once
    } else {
      Internal guard;
      x = x.contiguous();
    }
  }
  if (!p) p = x.const_data_ptr();
  g_read_bytes += x.numel() * static_cast<int64_t>(x.element_size());
  // statistics only, with the per-op observer watching for in-place writes: off this thread
  if (!data && g_handle && !g_measure_here && x.numel() > 0 && submit(index, x, p, code)) {
    r.stats = HAVE;
    return;
  }
  acc_t a;
  acc_init(&a);
  if (x.numel() > 0) {
    KernelClock clock;
    run(p, x.numel(), code, &a);
  }
  finish_row(r, a, x.numel());
  if (data) store_bytes(index, x, p);  // while the pass above left it in cache
}

// ---- views kept as their input's data ------------------------------------------------------------
struct Base {  // what the geometry of a view needs of the op's first input
  bool contiguous = false;  // and stored as it is in memory
  intptr_t ptr = 0;
  int8_t dtype = -1;
  c10::Device device{at::kCPU};
};

intptr_t address_of(const at::Tensor& t) {  // Tensor.data_ptr() (a meta tensor's counts from 0)
  return reinterpret_cast<intptr_t>(t.storage().data()) + t.storage_offset() * static_cast<intptr_t>(t.element_size());
}

// Complex data is stored as its real view and conjugate or negative views as their values:
// elements that a view's geometry cannot place (the Python path places them, wrongly).
bool as_in_memory(const at::Tensor& t) { return !t.is_complex() && !t.is_conj() && !t.is_neg(); }

Base base_of(const at::Tensor& t) {
  if (!t.has_storage()) return Base{};
  return Base{t.is_contiguous() && as_in_memory(t), address_of(t), static_cast<int8_t>(t.scalar_type()), t.device()};
}

void json_ints(std::string& s, at::IntArrayRef v) {
  s += '[';
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  s += ']';
}

// JSON {"shape", "stride", "offset"} placing view `t` in the contiguous data of its input (in
// elements, as json.dumps writes it); -1 when it cannot be read back that way.
int view_geometry(const at::Tensor& t, const Base& b) {
  if (!b.contiguous || !t.has_storage() || !as_in_memory(t) || b.dtype != static_cast<int8_t>(t.scalar_type()) ||
      b.device != t.device())
    return -1;
  intptr_t offset = address_of(t) - b.ptr, size = static_cast<intptr_t>(t.element_size());
  if (offset < 0 || offset % size) return -1;
  std::string s = "{\"shape\": ";
  json_ints(s, t.sizes());
  s += ", \"stride\": ";
  json_ints(s, t.strides());
  s += ", \"offset\": " + std::to_string(offset / size) + "}";
  views_json.push_back(std::move(s));
  return static_cast<int>(views_json.size()) - 1;
}
