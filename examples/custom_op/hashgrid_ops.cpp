// Op library: hashgrid_encode (x, table) -> (N, L*F) and its table gradient
// hashgrid_encode_grad (x, table, dy) -> like table (see hashgrid.h). CPU kernels here, CUDA
// kernels in hashgrid_ops.cu (built with CUDA).
#include <algorithm>
#include <cmath>
#include <cstring>

#include "hashgrid.h"

namespace {

using kiln::KernelContext;
using kiln::Stream;

struct Dims {
  int64_t n, levels, t, f, base;
  double scale;
};

Dims dims_of(const KernelContext& c) {
  const auto& ts = c.in(1).shape;
  return {c.in(0).shape[0],
          ts[0],
          ts[1],
          ts[2],
          c.attrs().i("base_resolution"),
          c.attrs().f("per_level_scale")};
}

// The four corners of point i at level l: rows and bilinear weights.
void corners(const float* x, int64_t i, int64_t res, int64_t t, uint64_t rows[4], float w[4]) {
  const float px = x[2 * i] * static_cast<float>(res), py = x[2 * i + 1] * static_cast<float>(res);
  const float fx = std::floor(px), fy = std::floor(py);
  const float wx = px - fx, wy = py - fy;
  const auto cx = static_cast<uint64_t>(static_cast<int64_t>(fx));
  const auto cy = static_cast<uint64_t>(static_cast<int64_t>(fy));
  for (int k = 0; k < 4; ++k) {
    const int dx = k & 1, dy = k >> 1;
    rows[k] = hashgrid::hash(cx + dx, cy + dy, t);
    w[k] = (dx ? wx : 1 - wx) * (dy ? wy : 1 - wy);
  }
}

void encode_cpu(KernelContext& c, Stream&) {
  const Dims d = dims_of(c);
  const float* x = c.in(0).ptr<float>();
  const float* table = c.in(1).ptr<float>();
  float* y = c.out(0).ptr<float>();
  c.parallel_for(d.n, 256, [&](int64_t b, int64_t e) {
    for (int64_t l = 0; l < d.levels; ++l) {
      const int64_t res = hashgrid::resolution(d.base, d.scale, l);
      const float* tl = table + l * d.t * d.f;
      for (int64_t i = b; i < e; ++i) {
        uint64_t rows[4];
        float w[4];
        corners(x, i, res, d.t, rows, w);
        float* out = y + i * d.levels * d.f + l * d.f;
        for (int64_t k = 0; k < d.f; ++k) {
          float acc = 0;
          for (int q = 0; q < 4; ++q) acc += tl[rows[q] * d.f + k] * w[q];
          out[k] = acc;
        }
      }
    }
  });
}

// Levels write disjoint parts of the table gradient: one task per level, points in order
// (deterministic).
void encode_grad_cpu(KernelContext& c, Stream&) {
  const Dims d = dims_of(c);
  const float* x = c.in(0).ptr<float>();
  const float* dy = c.in(2).ptr<float>();
  float* dt = c.out(0).ptr<float>();
  std::memset(dt, 0, sizeof(float) * d.levels * d.t * d.f);
  c.parallel_for(d.levels, 1, [&](int64_t lb, int64_t le) {
    for (int64_t l = lb; l < le; ++l) {
      const int64_t res = hashgrid::resolution(d.base, d.scale, l);
      float* tl = dt + l * d.t * d.f;
      for (int64_t i = 0; i < d.n; ++i) {
        uint64_t rows[4];
        float w[4];
        corners(x, i, res, d.t, rows, w);
        const float* g = dy + i * d.levels * d.f + l * d.f;
        for (int q = 0; q < 4; ++q)
          for (int64_t k = 0; k < d.f; ++k) tl[rows[q] * d.f + k] += w[q] * g[k];
      }
    }
  });
}

std::vector<kiln::Shape> encode_shape(const kiln::CustomShapeContext& c) {
  const kiln::Shape &x = c.inputs[0], &t = c.inputs[1];
  if (x.size() != 2 || x[1] != 2 || t.size() != 3)
    throw kiln::ShapeError("[" + c.op + "] x must be (N, 2) and table (L, T, F), got x " +
                           kiln::to_string(x) + " and table " + kiln::to_string(t));
  if (t[0] > 32)
    throw kiln::ValueError("[" + c.op + "] at most 32 levels, got " + std::to_string(t[0]));
  if (c.attrs.i("base_resolution") < 1 || c.attrs.f("per_level_scale") < 1)
    throw kiln::ValueError("[" + c.op + "] base_resolution and per_level_scale must be >= 1");
  const int64_t lf = t[0] < 0 || t[2] < 0 ? -1 : t[0] * t[2];
  return {{x[0], lf}};
}

std::vector<kiln::Shape> grad_shape(const kiln::CustomShapeContext& c) {
  const auto enc = encode_shape(c);
  if (c.inputs[2] != enc[0])
    throw kiln::ShapeError("[" + c.op + "] dy " + kiln::to_string(c.inputs[2]) + " must be " +
                           kiln::to_string(enc[0]));
  return {c.inputs[1]};
}

std::vector<std::optional<kiln::Tensor>> encode_gradient(const kiln::CustomGradContext& c) {
  // positions get no gradient (the encoding's input is data here)
  return {std::nullopt,
          kiln::custom_op1("hashgrid_encode_grad",
                           {c.inputs[0], c.inputs[1], c.cotangent_or_zeros(0)}, c.attrs)};
}

}  // namespace

#ifdef HASHGRID_CUDA
void hashgrid_encode_cuda(KernelContext& c, Stream& s);       // hashgrid_ops.cu
void hashgrid_encode_grad_cuda(KernelContext& c, Stream& s);  // hashgrid_ops.cu
#endif

KILN_OP_LIBRARY(r) {
  const std::vector<std::pair<std::string, kiln::AttrValue>> attrs = {
      {"base_resolution", int64_t{16}}, {"per_level_scale", 1.5}};
  kiln::CustomOpDef enc;
  enc.name = "hashgrid_encode";
  enc.inputs = {{"x"}, {"table"}};
  enc.outputs = {{"features"}};
  enc.attrs = attrs;
  enc.shape = encode_shape;
  enc.gradient = encode_gradient;
  r.register_op(enc);
  r.register_kernel("hashgrid_encode", kiln::Backend::cpu, encode_cpu);

  kiln::CustomOpDef grad;
  grad.name = "hashgrid_encode_grad";
  grad.inputs = {{"x"}, {"table"}, {"dy"}};
  grad.outputs = {{"dtable"}};
  grad.attrs = attrs;
  grad.shape = grad_shape;
  r.register_op(grad);
  r.register_kernel("hashgrid_encode_grad", kiln::Backend::cpu, encode_grad_cpu);
#ifdef HASHGRID_CUDA
  r.register_kernel("hashgrid_encode", kiln::Backend::cuda, hashgrid_encode_cuda);
  r.register_kernel("hashgrid_encode_grad", kiln::Backend::cuda, hashgrid_encode_grad_cuda);
#endif
}
