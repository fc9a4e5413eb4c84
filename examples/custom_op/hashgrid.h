// Multiresolution hash-grid encoding of 2-D points (Instant-NGP, Müller et al. 2022), shared by
// the op library (hashgrid_ops.cpp, .cu), the example (hashgrid_fit.cpp) and the benchmark
// (bench/custom_op/bench_hashgrid.cpp).
//
// Inputs x (N, 2) in [0, 1] and table (L, T, F). Level l has resolution
// R_l = floor(base_resolution * per_level_scale^l); a point's four grid corners (cx, cy) at that
// resolution are hashed to rows ((cx xor cy * 2654435761) mod T) of table[l], and the rows are
// blended bilinearly. Output (N, L * F), level-major. The gradient flows to the table only.
#pragma once

#include <cmath>
#include <cstdint>

#include "kiln/custom_op.h"
#include "kiln/kiln.h"

namespace hashgrid {

inline constexpr uint64_t kPrime = 2654435761ull;

struct Config {
  int64_t levels = 8;
  int64_t table_size = 1 << 12;
  int64_t features = 2;
  int64_t base_resolution = 4;
  double per_level_scale = 1.5;
  kiln::Attrs attrs() const {
    return {{"base_resolution", base_resolution}, {"per_level_scale", per_level_scale}};
  }
};

inline int64_t resolution(int64_t base, double scale, int64_t level) {
  return static_cast<int64_t>(std::floor(static_cast<double>(base) * std::pow(scale, level)));
}

// The row of corner (cx, cy) in a table of `t` rows.
inline uint64_t hash(uint64_t cx, uint64_t cy, uint64_t t) { return (cx ^ (cy * kPrime)) % t; }

/// The same encoding composed from built-in ops (gather, bitwise_xor, mod, ...).
inline kiln::Tensor encode_composed(const kiln::Tensor& x, const kiln::Tensor& table,
                                    const Config& c) {
  using namespace kiln;
  const int64_t n = x.dim(0), t = c.table_size, f = c.features;
  std::vector<Tensor> levels;
  for (int64_t l = 0; l < c.levels; ++l) {
    const double r = static_cast<double>(resolution(c.base_resolution, c.per_level_scale, l));
    const Tensor pos = x * r;
    const Tensor i0 = floor(pos);
    const Tensor w = pos - i0;  // (N, 2)
    const Tensor ci = cast(i0, i64);
    const Tensor cx = reshape(slice(ci, {0, 0}, {n, 1}), {n});
    const Tensor cy = reshape(slice(ci, {0, 1}, {n, 2}), {n});
    const Tensor wx = slice(w, {0, 0}, {n, 1}), wy = slice(w, {0, 1}, {n, 2});  // (N, 1)
    const Tensor one = scalar_like(wx, 1);
    const Tensor tl = reshape(slice(table, {l, 0, 0}, {l + 1, t, f}), {t, f});
    std::optional<Tensor> acc;
    for (int dy = 0; dy < 2; ++dy)
      for (int dx = 0; dx < 2; ++dx) {
        const Tensor hx = dx ? cx + scalar_like(cx, 1) : cx;
        const Tensor hy = (dy ? cy + scalar_like(cy, 1) : cy) * scalar_like(cy, double(kPrime));
        const Tensor idx = mod(bitwise_xor(hx, hy), scalar_like(cx, double(t)));
        const Tensor wc = (dx ? wx : one - wx) * (dy ? wy : one - wy);
        const Tensor term = gather(tl, idx, 0) * wc;
        acc = acc ? *acc + term : term;
      }
    levels.push_back(*acc);
  }
  return concat(levels, 1);
}

/// The custom op (the library must be loaded).
inline kiln::Tensor encode_custom(const kiln::Tensor& x, const kiln::Tensor& table,
                                  const Config& c) {
  return kiln::custom_op1("hashgrid_encode", {x, table}, c.attrs());
}

}  // namespace hashgrid
