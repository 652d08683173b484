// The elements of a non-contiguous CPU tensor in row-major order (included by dumpobs_measure.h
// inside dumpobs.cpp's anonymous namespace). A plane whose last dimension is not adjacent in
// memory but whose one before is (a transposed matrix: a Linear weight's gradient as its autograd
// node hands it over) is copied in tiles: walking it a row at a time reads one element a cache
// line, and with a power-of-two row length every line falls into the same few cache sets (a
// 1024x1024 float32 gradient: 6.6 ms walked, 0.5 ms in tiles; 512x512: 0.22 ms, 0.07 ms).
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

// The next index of dimensions 0..k of a tensor walked in row-major order (an odometer): `offset`
// (elements from the first) and `idx` move on by one step of dimension k, carrying into the outer.
inline void next_outer(int64_t& offset, c10::SmallVector<int64_t, 6>& idx, at::IntArrayRef sizes,
                       at::IntArrayRef strides, int64_t k) {
  for (; k >= 0; --k) {
    offset += strides[k];
    if (++idx[k] < sizes[k]) return;
    offset -= strides[k] * sizes[k];
    idx[k] = 0;
  }
}

// out[a * C + b] = src[a + b * step] for a < R, b < C: in blocks of 64x64, 4x4 tiles inside.
template <typename T>
void gather_plane_t(T* out, const T* src, int64_t R, int64_t C, int64_t step) {
  if (step == 0) {  // a broadcast last dimension (a mean's backward expands its gradient so): fills
    for (int64_t a = 0; a < R; ++a) std::fill_n(out + a * C, C, src[a]);
    return;
  }
  constexpr int64_t B = 64;
  for (int64_t a0 = 0; a0 < R; a0 += B)
    for (int64_t b0 = 0; b0 < C; b0 += B) {
      const int64_t a1 = std::min(R, a0 + B), b1 = std::min(C, b0 + B);
      int64_t a = a0;
#if defined(__SSE2__)
      if constexpr (sizeof(T) == 4) {  // four columns of four elements, transposed in registers
        for (; a + 4 <= a1; a += 4) {
          int64_t b = b0;
          for (; b + 4 <= b1; b += 4) {
            const float* s = reinterpret_cast<const float*>(src + a + b * step);
            __m128 r0 = _mm_loadu_ps(s), r1 = _mm_loadu_ps(s + step), r2 = _mm_loadu_ps(s + 2 * step),
                   r3 = _mm_loadu_ps(s + 3 * step);
            _MM_TRANSPOSE4_PS(r0, r1, r2, r3);
            float* o = reinterpret_cast<float*>(out + a * C + b);
            _mm_storeu_ps(o, r0), _mm_storeu_ps(o + C, r1), _mm_storeu_ps(o + 2 * C, r2), _mm_storeu_ps(o + 3 * C, r3);
          }
          for (int64_t i = a; i < a + 4; ++i)
            for (int64_t j = b; j < b1; ++j) out[i * C + j] = src[i + j * step];
        }
      }
#endif
      for (; a < a1; ++a)
        for (int64_t b = b0; b < b1; ++b) out[a * C + b] = src[a + b * step];
    }
}

// The planes of x's last two dimensions, each transposed in memory (stride 1 before the last),
// into out: true where x is laid out so, else false and nothing copied.
template <typename T>
bool gather_transposed(T* out, const at::Tensor& x) {
  const int64_t d = x.dim();
  if (d < 2) return false;
  at::IntArrayRef sizes = x.sizes(), strides = x.strides();
  const int64_t R = sizes[d - 2], C = sizes[d - 1], step = strides[d - 1];
  if (strides[d - 2] != 1 || R < 4 || C < 4) return false;  // (any step: 0 is a broadcast)
  const T* base = static_cast<const T*>(x.const_data_ptr());
  const int64_t planes = x.numel() / (R * C);
  c10::SmallVector<int64_t, 6> idx(static_cast<size_t>(d), 0);
  int64_t offset = 0;  // elements from the first, of the plane's first element
  for (int64_t p = 0; p < planes; ++p, out += R * C) {
    gather_plane_t(out, base + offset, R, C, step);
    next_outer(offset, idx, sizes, strides, d - 3);  // the next plane
  }
  return true;
}

// x's elements as `planes` planes of R x C, each stored transposed (element (r, c) of plane q at
// q·R·C + c·R + r from the first) and the planes one after another: a Linear weight's gradient
// as autograd hands it over, x.mT of a contiguous x. run_transposed reads them in memory order.
bool transposed_planes(const at::Tensor& x, int64_t* planes, int64_t* R, int64_t* C) {
  const int64_t d = x.dim();
  if (d < 2) return false;
  at::IntArrayRef sizes = x.sizes(), strides = x.strides();
  *R = sizes[d - 2], *C = sizes[d - 1];
  if (*R < 2 || *C < 2 || strides[d - 2] != 1 || strides[d - 1] != *R) return false;
  int64_t expect = *R * *C;  // the planes row-major, one after another
  for (int64_t k = d - 3; k >= 0; --k) {
    if (sizes[k] != 1 && strides[k] != expect) return false;
    expect *= sizes[k];
  }
  *planes = x.numel() / (*R * *C);
  return *planes > 0;
}
