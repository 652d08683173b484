// Included by dumpobs.cpp inside its anonymous namespace, after finish_row: the statistics of
// tensors the C kernel cannot read where they lie (a CUDA or NPU tensor), as torch reductions
// issued on the tensor's device from C++ (no Python, no GIL) and read back once per step.
//
// On a GPU each op is a kernel launch of a few microseconds of the training thread, the cost
// of the dump there, so a tensor is first copied into a staging buffer of its device and dtype
// (one launch), and a full buffer is reduced at once, every tensor in it a segment
// (dumpobs_device_batch.h: ~45 launches a buffer, whatever the number of tensors). A tensor
// larger than the buffer, or on another stream than the buffer's, is reduced alone: the ops of
// stats.device_stats (the Python path's engine), ~22 launches, the same bits it gives.
//
// Both compute min and max, the sum and the sum of squares in float64 (alone: of float32 values
// the L2 norm, squared on the host, as device_stats does), the NaN, Inf and zero counts, and the
// `wsum64-v2` hash on 32-bit words as int32 (a product mod 2^32 is the same bits signed or not;
// a logical right shift is an arithmetic one masked; x ^ (x >> 16) flips each word's low half by
// its high half, one strided op on its 16-bit halves).
//
// Nothing is synchronised per op: copies and reductions run in order on the op's stream, the
// results stay on the device until the step's rows are taken (finish: one transfer per device
// and dtype).

namespace device_stats {

// Statistics of rows, still on their device: field m's entry for row k at k * stride[m]
// (a buffer's float statistics interleave each tensor's segment with its padding's).
struct Result {
  std::vector<size_t> rows;
  std::vector<int64_t> numel;
  bool floating = false;  // NaN and Inf counted (the float dtypes)
  bool squares = true;    // `sq` holds the sum of squares, not the L2 norm
  int64_t stride = 1;     // of the float statistics (mn .. zeros)
  at::Tensor mn, mx;      // of the float32 or float64 values reduced
  at::Tensor sum, sq;     // float64
  at::Tensor nan, inf, zeros;  // counts (int64, or float64 from a buffer's sums; undefined: none)
  at::Tensor h1, h2;      // int64: sums of the hash's 32-bit terms (their low 32 bits count)
};
std::vector<Result> results;  // this step's (under mu)
int g_route = 0;  // 1: every tensor measured this way, the CPU's too; 2: and no buffer reduced (tests)
int64_t g_staging = 8 << 20;  // bytes of a staging buffer (0: every tensor reduced alone)

constexpr int64_t MAX_WORDS = int64_t{1} << 31;  // word indices as int32 (larger: Python's int64 path)

bool handles(const at::Tensor& x) {
  switch (x.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16: case at::kComplexFloat:
    case at::kComplexDouble: case at::kChar: case at::kByte: case at::kShort: case at::kInt: case at::kLong:
    case at::kBool:
      break;
    default:
      return false;
  }
  return !x.is_conj() && !x.is_neg() && x.numel() * static_cast<int64_t>(x.element_size()) / 4 < MAX_WORDS;
}

bool wide(at::ScalarType t) { return t == at::kDouble || t == at::kLong || t == at::kInt; }  // reduced as float64

void xor_high_half(at::Tensor& x) {  // x ^= x >> 16 (logical), in place
  at::Tensor halves = x.view(at::kShort).view({-1, 2});
  halves.select(1, 0).bitwise_xor_(halves.select(1, 1));  // little-endian: the low half first
}

// lowbias32(w ^ salt) of int32 words w, and the salt: x_i of wsum64-v2 (docs/format.md)
at::Tensor mix(const at::Tensor& w, const at::Tensor& salt) {
  at::Tensor x = at::bitwise_xor(w, salt);
  xor_high_half(x);
  x.mul_(static_cast<int64_t>(static_cast<int32_t>(MIX1)));
  x.bitwise_xor_(at::bitwise_right_shift(x, 15).bitwise_and_(0x1FFFF));
  x.mul_(static_cast<int64_t>(static_cast<int32_t>(MIX2)));
  xor_high_half(x);
  return x;
}

// ---- a tensor alone ------------------------------------------------------------------------------
// The tensor's bytes (row-major, little-endian) as 32-bit words, the last padded with zeros.
at::Tensor words_of(const at::Tensor& t) {
  at::Tensor raw = t.contiguous().view(-1).view(at::kByte);
  if (int64_t pad = (4 - raw.numel() % 4) % 4) raw = at::cat({raw, at::zeros({pad}, raw.options())});
  if (raw.storage_offset() % 4) raw = raw.clone();  // a view at an offset that is no whole word
  return raw.view(at::kInt);
}

Result alone(size_t row, const at::Tensor& x) {
  Result r;
  r.rows = {row}, r.numel = {x.numel()}, r.floating = at::isFloatingType(x.scalar_type());
  if (x.numel() == 0) return r;
  bool dbl = wide(x.scalar_type());
  at::Tensor f = x.to(dbl ? at::kDouble : at::kFloat);  // (no copy where it is that dtype already)
  std::tie(r.mn, r.mx) = at::aminmax(f.reshape(-1));  // (the sums over f as it lies: their order is torch's)
  r.sum = f.sum(at::kDouble);
  r.squares = dbl;  // float64 values: their squares summed; others: the norm
  r.sq = dbl ? f.mul(f).sum() : at::linalg_vector_norm(f, 2, std::nullopt, false, at::kDouble);
  if (r.floating) {
    r.nan = at::isnan(f).sum();
    r.inf = at::isinf(f).sum();
  }
  r.zeros = f.eq(0).sum();
  at::Tensor w = words_of(x);
  at::Tensor salt = at::arange(w.numel(), w.options()).mul_(static_cast<int64_t>(static_cast<int32_t>(GOLD)));
  at::Tensor m = mix(w, salt);
  r.h2 = m.sum(at::kLong);
  r.h1 = m.bitwise_xor_(salt).sum(at::kLong);
  return r;
}

using Key = std::tuple<int, int, int>;  // device type, device index, dtype
Key key_of(const at::Tensor& t) {
  return {static_cast<int>(t.device().type()), t.device().index(), static_cast<int>(t.scalar_type())};
}

#include "dumpobs_device_batch.h"

// Issue the reductions of row `row`'s tensor (or its copy into a buffer); false: not this way
// (Python's slow path then).
bool measure(size_t row, const at::Tensor& t) {
  if (!handles(t)) return false;
  try {
    Internal guard;
    at::Tensor x = t.is_complex() ? at::view_as_real(t) : t;
    if (!stage(row, x)) {
      results.push_back(alone(row, x));
      seen(stream_of(x.device()));
    }
  } catch (const std::exception&) {  // an op this device lacks: the Python path says why, or measures
    return false;
  }
  return true;
}

// ---- the step's results to the host: one transfer per device and dtype, then into their rows --
struct Gather {  // the results of one device and dtype
  std::vector<at::Tensor> parts;
  int64_t size = 0;
  std::vector<double> f;
  std::vector<int64_t> i;
  int64_t add(const at::Tensor& t) {
    parts.push_back(t.reshape(-1));
    size += parts.back().numel();
    return size - parts.back().numel();
  }
};

void to_host(std::map<Key, Gather>& all) {
  for (auto& [key, g] : all) {
    at::Tensor host = at::cat(g.parts).to(at::kCPU);
    if (at::isFloatingType(host.scalar_type())) {
      host = host.to(at::kDouble);  // (float32 min and max widen exactly)
      g.f.assign(host.const_data_ptr<double>(), host.const_data_ptr<double>() + host.numel());
    } else {
      host = host.to(at::kLong);
      g.i.assign(host.const_data_ptr<int64_t>(), host.const_data_ptr<int64_t>() + host.numel());
    }
  }
}

struct Read {  // a field's values on the host
  const Gather* g = nullptr;
  int64_t at = 0, stride = 1;
  double num(size_t k) const { return g->f[at + k * stride]; }
  uint64_t whole(size_t k) const {  // a count or a hash sum (a float64 one holds an integer exactly)
    if (!g) return 0;
    return g->f.empty() ? static_cast<uint64_t>(g->i[at + k * stride]) : static_cast<uint64_t>(g->f[at + k * stride]);
  }
};

void fill(const Result& r, const std::array<Read, 9>& f) {
  for (size_t k = 0; k < r.rows.size(); ++k) {
    // (a row taken back since: what it read was memory no op had written, unmeasure_overwritten)
    if (r.rows[k] >= rows.size() || rows[r.rows[k]].note == N_UNINITIALIZED) continue;
    acc_t a;
    std::memset(&a, 0, sizeof a);
    if (r.numel[k]) {
      double sq = f[3].num(k);
      a.mn = f[0].num(k), a.mx = f[1].num(k), a.sum = f[2].num(k), a.sumsq = r.squares ? sq : sq * sq;
      a.nan = f[4].whole(k), a.inf = f[5].whole(k), a.zeros = f[6].whole(k);
      a.hash = ((f[7].whole(k) & 0xFFFFFFFFull) << 32) | (f[8].whole(k) & 0xFFFFFFFFull);
      double n = static_cast<double>(r.numel[k]);  // float64 sums: tensor_stats.finish's spread, same bits
      a.cnt = n, a.d2 = a.sumsq - a.sum * a.sum / n;
    }
    finish_row(rows[r.rows[k]], a, r.numel[k]);
  }
}

void finish_results() {
  std::map<Key, Gather> all;
  std::vector<std::array<std::pair<Gather*, int64_t>, 9>> where(results.size());
  for (size_t n = 0; n < results.size(); ++n) {
    const Result& r = results[n];
    const at::Tensor* ts[9] = {&r.mn, &r.mx, &r.sum, &r.sq, &r.nan, &r.inf, &r.zeros, &r.h1, &r.h2};
    for (int m = 0; m < 9; ++m) {
      where[n][m] = {nullptr, 0};
      if (ts[m]->defined()) {
        Gather& g = all[key_of(*ts[m])];
        where[n][m] = {&g, g.add(*ts[m])};
      }
    }
  }
  to_host(all);
  for (size_t n = 0; n < results.size(); ++n) {
    std::array<Read, 9> f;
    for (int m = 0; m < 9; ++m) f[m] = Read{where[n][m].first, where[n][m].second, m < 7 ? results[n].stride : 1};
    fill(results[n], f);
  }
}

void finish() {
  try {
    Internal guard;
    flush_all();
    if (!results.empty()) finish_results();
  } catch (const std::exception& e) {
    drop();
    on_error(c10::str("device statistics: ", e.what()).c_str());
    return;
  }
  results.clear();
}

}  // namespace device_stats
