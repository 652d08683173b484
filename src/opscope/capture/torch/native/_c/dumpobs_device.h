// Included by dumpobs.cpp inside its anonymous namespace, after finish_row: the statistics of
// tensors the C kernel cannot read where they lie (a CUDA or NPU tensor), as torch reductions
// issued on the tensor's device from C++ (no Python, no GIL) and read back once per step.
//
// They are the reductions of stats.device_stats (the Python path's engine for such tensors),
// the same ops on the same values, so a row's statistics are the same bits whichever path made
// them: min and max by aminmax, the sum and the sum of squares in float64 (of float32 values the
// L2 norm, squared on the host), the NaN, Inf and zero counts, and the `wsum64-v2` hash. The hash
// runs on 32-bit words as int32 (a product mod 2^32 is the same bits signed or not; a logical
// right shift is an arithmetic one masked; x ^ (x >> 16) flips each word's low half by its high
// half, one strided op on its 16-bit halves), each sum taken in int64 (its low 32 bits are the
// unsigned sum's). ~22 ops a float32 tensor, against ~57 through Python: on a GPU each op is a
// kernel launch of a few microseconds of the training thread, the cost of the dump there.
//
// Nothing is synchronised per op: the results stay on the device, in order on the op's stream,
// until the step's rows are taken (device_finish, one transfer per device and dtype).

namespace device_stats {

struct Job {  // a row whose statistics are reductions still on their device
  size_t row;
  int64_t numel;
  bool floating;                 // NaN and Inf counted (the float dtypes)
  bool squares = false;          // `sq` holds the sum of squares, not the norm
  at::Tensor mn, mx;             // of the float32 or float64 values reduced
  at::Tensor sum, sq;            // float64: the sum, and the L2 norm (float inputs) or the sum of squares
  at::Tensor nan, inf, zeros;    // int64 (undefined: none counted)
  at::Tensor h1, h2;             // int64: the hash's sums of 32-bit words
};
std::vector<Job> jobs;  // this step's (under mu)
bool g_route = false;   // every tensor measured this way, the CPU's too (tests: route_device)

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

// The tensor's bytes (row-major, little-endian) as 32-bit words, the last padded with zeros.
at::Tensor words_of(const at::Tensor& t) {
  at::Tensor raw = t.contiguous().view(-1).view(at::kByte);
  if (int64_t pad = (4 - raw.numel() % 4) % 4) raw = at::cat({raw, at::zeros({pad}, raw.options())});
  if (raw.storage_offset() % 4) raw = raw.clone();  // a view at an offset that is no whole word
  return raw.view(at::kInt);
}

void xor_high_half(at::Tensor& x) {  // x ^= x >> 16 (logical), in place
  at::Tensor halves = x.view(at::kShort).view({-1, 2});
  halves.select(1, 0).bitwise_xor_(halves.select(1, 1));  // little-endian: the low half first
}

// (h1, h2) of wsum64-v2 (docs/format.md): x_i = lowbias32(w_i ^ s_i), s_i = i * GOLD
std::pair<at::Tensor, at::Tensor> hash_sums(const at::Tensor& t) {
  at::Tensor w = words_of(t);
  at::Tensor salt = at::arange(w.numel(), w.options()).mul_(static_cast<int64_t>(static_cast<int32_t>(GOLD)));
  at::Tensor x = at::bitwise_xor(w, salt);
  xor_high_half(x);
  x.mul_(static_cast<int64_t>(static_cast<int32_t>(MIX1)));
  x.bitwise_xor_(at::bitwise_right_shift(x, 15).bitwise_and_(0x1FFFF));
  x.mul_(static_cast<int64_t>(static_cast<int32_t>(MIX2)));
  xor_high_half(x);
  at::Tensor h2 = x.sum(at::kLong);
  return {x.bitwise_xor_(salt).sum(at::kLong), h2};
}

Job issue(size_t row, const at::Tensor& t) {
  at::Tensor x = t.is_complex() ? at::view_as_real(t) : t;
  Job j{row, x.numel(), at::isFloatingType(x.scalar_type())};
  if (j.numel == 0) return j;
  at::ScalarType wide = x.scalar_type();
  bool dbl = wide == at::kDouble || wide == at::kLong || wide == at::kInt;
  at::Tensor f = x.to(dbl ? at::kDouble : at::kFloat);  // (no copy where it is that dtype already)
  std::tie(j.mn, j.mx) = at::aminmax(f.reshape(-1));  // (the sums over f as it lies: their order is torch's)
  j.sum = f.sum(at::kDouble);
  // float64 values (float64, int64 and int32 tensors): their squares summed, as device_stats does
  j.sq = dbl ? f.mul(f).sum() : at::linalg_vector_norm(f, 2, std::nullopt, false, at::kDouble);
  j.squares = dbl;
  if (j.floating) {
    j.nan = at::isnan(f).sum();
    j.inf = at::isinf(f).sum();
  }
  j.zeros = f.eq(0).sum();
  std::tie(j.h1, j.h2) = hash_sums(x);
  return j;
}

// Issue the reductions of row `row`'s tensor; false: not this way (Python's slow path then).
bool measure(size_t row, const at::Tensor& t) {
  if (!handles(t)) return false;
  try {
    Internal guard;
    jobs.push_back(issue(row, t));
  } catch (const std::exception&) {  // an op this device lacks: the Python path says why, or measures
    return false;
  }
  return true;
}

// The step's results to the host: one transfer per device and dtype, then into their rows.
struct Batch {  // the 0-d results of one device and dtype
  std::vector<at::Tensor> parts;
  std::vector<double> f;
  std::vector<int64_t> i;
  size_t add(const at::Tensor& t) {
    parts.push_back(t.reshape({1}));
    return parts.size() - 1;
  }
};

using Key = std::tuple<int, int, int>;  // device type, device index, dtype
Key key_of(const at::Tensor& t) {
  return {static_cast<int>(t.device().type()), t.device().index(), static_cast<int>(t.scalar_type())};
}

void finish() {
  if (jobs.empty()) return;
  try {
    Internal guard;
    std::map<Key, Batch> batches;
    std::vector<std::array<size_t, 9>> at(jobs.size());
    for (size_t k = 0; k < jobs.size(); ++k) {
      Job& j = jobs[k];
      if (!j.numel) continue;
      const at::Tensor* ts[9] = {&j.mn, &j.mx, &j.sum, &j.sq, &j.nan, &j.inf, &j.zeros, &j.h1, &j.h2};
      for (int m = 0; m < 9; ++m)
        if (ts[m]->defined()) at[k][m] = batches[key_of(*ts[m])].add(*ts[m]);
    }
    for (auto& [key, b] : batches) {
      at::Tensor host = at::cat(b.parts).to(at::kCPU);
      if (at::isFloatingType(host.scalar_type())) {
        host = host.to(at::kDouble);  // (float32 min and max widen exactly)
        b.f.assign(host.const_data_ptr<double>(), host.const_data_ptr<double>() + host.numel());
      } else {
        host = host.to(at::kLong);
        b.i.assign(host.const_data_ptr<int64_t>(), host.const_data_ptr<int64_t>() + host.numel());
      }
    }
    auto num = [&](const at::Tensor& t, size_t a) { return batches.at(key_of(t)).f[a]; };
    auto count = [&](const at::Tensor& t, size_t a) -> uint64_t {
      return t.defined() ? static_cast<uint64_t>(batches.at(key_of(t)).i[a]) : 0;
    };
    for (size_t k = 0; k < jobs.size(); ++k) {
      const Job& j = jobs[k];
      if (j.row >= rows.size()) continue;
      acc_t a;
      std::memset(&a, 0, sizeof a);
      if (j.numel) {
        const auto& p = at[k];
        double sq = num(j.sq, p[3]);
        a.mn = num(j.mn, p[0]), a.mx = num(j.mx, p[1]), a.sum = num(j.sum, p[2]), a.sumsq = j.squares ? sq : sq * sq;
        a.nan = count(j.nan, p[4]), a.inf = count(j.inf, p[5]), a.zeros = count(j.zeros, p[6]);
        a.hash = ((count(j.h1, p[7]) & 0xFFFFFFFFull) << 32) | (count(j.h2, p[8]) & 0xFFFFFFFFull);
      }
      finish_row(rows[j.row], a, j.numel);
    }
  } catch (const std::exception& e) {
    jobs.clear();
    on_error(c10::str("device statistics: ", e.what()).c_str());
    return;
  }
  jobs.clear();
}

void drop() { jobs.clear(); }  // (a step cleared: its rows are gone)

}  // namespace device_stats
