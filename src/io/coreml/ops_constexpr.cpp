// MIL's constexpr ops: compressed weights (quantized, palettized, sparse) expanded while
// importing into constants of the dtype the program computes in (src/io/coreml/mil.h).
#include <cmath>

#include "io/coreml/mil.h"

namespace kiln::coreml::detail {

namespace {

std::vector<double> values_of(const Array& a) {
  const Array d = a.astype(f64);
  const double* p = d.data<double>();
  return std::vector<double>(p, p + d.numel());
}

Array array_from(const std::vector<double>& v, const Shape& shape, DType dtype) {
  return Array::from_vector(v, shape).astype(dtype);
}

// Element i's index along `axis` of `shape`.
int64_t index_along(const Shape& shape, int64_t axis, int64_t i) {
  int64_t inner = 1;
  for (size_t k = static_cast<size_t>(axis) + 1; k < shape.size(); ++k) inner *= shape[k];
  return (i / inner) % shape[static_cast<size_t>(axis)];
}

// A scale or zero point of one value, or one per index along `axis`, at element i.
double per_axis(const std::vector<double>& v, const Shape& shape, int64_t axis, int64_t i) {
  return v.size() == 1 ? v[0] : v[static_cast<size_t>(index_along(shape, axis, i))];
}

// blockwise: scale of shape (s0, s1, ...) over data (d0, d1, ...), each dim a multiple of the
// scale's (a block of d_k / s_k elements shares a scale along dim k)
double blockwise(const std::vector<double>& v, const Shape& vshape, const Shape& shape, int64_t i) {
  int64_t flat = 0, stride = 1, rest = i;
  std::vector<int64_t> idx(shape.size());
  for (int k = static_cast<int>(shape.size()) - 1; k >= 0; --k) {
    idx[static_cast<size_t>(k)] = rest % shape[static_cast<size_t>(k)];
    rest /= shape[static_cast<size_t>(k)];
  }
  for (int k = static_cast<int>(shape.size()) - 1; k >= 0; --k) {
    const auto ku = static_cast<size_t>(k);
    const int64_t block = shape[ku] / vshape[ku];
    flat += idx[ku] / block * stride;
    stride *= vshape[ku];
  }
  return v[static_cast<size_t>(flat)];
}

}  // namespace

void add_constexpr_ops(OpTable& t) {
  // scale * (quantized_data - zero_point), scale and zero point one value or one per index of
  // `axis`; the result has the scale's dtype
  t["constexpr_affine_dequantize"] = [](OpContext& c) {
    const Array q = c.known("quantized_data"), zp = c.known("zero_point"), sc = c.known("scale");
    const Shape shape = q.shape();
    const int64_t axis = axis_of(c, c.int_of("axis", 0), static_cast<int64_t>(shape.size()));
    const std::vector<double> qv = values_of(q), zv = values_of(zp), sv = values_of(sc);
    for (const auto* v : {&zv, &sv})
      if (v->size() != 1 && static_cast<int64_t>(v->size()) != shape[static_cast<size_t>(axis)])
        c.fail("a scale or zero point of {} values for dim {} of size {}", v->size(), axis,
               shape[static_cast<size_t>(axis)]);
    std::vector<double> out(qv.size());
    for (size_t i = 0; i < qv.size(); ++i) {
      const auto ii = static_cast<int64_t>(i);
      out[i] = per_axis(sv, shape, axis, ii) * (qv[i] - per_axis(zv, shape, axis, ii));
    }
    c.set_known(0, array_from(out, shape, sc.dtype()));
  };
  // lut[indices], the indices packed n bits each (n = log2 of the table's size), in `shape`
  // (iOS16); or iOS18's tables per block: indices of the output's shape, lut of shape
  // (blocks along each dim..., NUM_PALETTES, VECTOR_SIZE), scalar entries (VECTOR_SIZE 1)
  t["constexpr_lut_to_dense"] = [](OpContext& c) {
    const Array lut = c.known("lut"), packed = c.known("indices");
    if (!c.has("shape")) {
      const Shape shape = packed.shape();
      const Shape& ls = lut.shape();
      const size_t rank = shape.size();
      if (ls.size() != rank + 2)
        c.fail("a table of rank {} for indices of rank {}", ls.size(), rank);
      if (ls[rank + 1] != 1)
        c.fail("vector palettization (VECTOR_SIZE {}) is not supported", ls[rank + 1]);
      for (size_t k = 0; k < rank; ++k)
        if (ls[k] <= 0 || shape[k] % ls[k])
          c.fail("tables of shape {} do not tile indices of shape {}", str(ls), str(shape));
      const int64_t palettes = ls[rank];
      const Array idx = packed.astype(i64);
      const int64_t* ip = idx.data<int64_t>();
      const std::vector<double> table = values_of(lut);
      Shape blocks(ls.begin(), ls.begin() + static_cast<std::ptrdiff_t>(rank));
      std::vector<double> out(static_cast<size_t>(idx.numel()));
      for (int64_t i = 0; i < idx.numel(); ++i) {
        if (ip[i] < 0 || ip[i] >= palettes) c.fail("index {} of a table of {}", ip[i], palettes);
        // the table of the block element i falls in (blocks in row-major order)
        int64_t b = 0, rest = i, stride = 1;
        for (int k = static_cast<int>(rank) - 1; k >= 0; --k) {
          const auto ku = static_cast<size_t>(k);
          const int64_t at = rest % shape[ku];
          rest /= shape[ku];
          b += at / (shape[ku] / blocks[ku]) * stride;
          stride *= blocks[ku];
        }
        out[static_cast<size_t>(i)] = table[static_cast<size_t>(b * palettes + ip[i])];
      }
      c.set_known(0, array_from(out, shape, lut.dtype()));
      return;
    }
    const std::vector<int64_t> shape = c.ints("shape");
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    if (lut.shape().size() != 1 || packed.shape().size() != 1)
      c.fail("only the iOS16 form (a 1-d table and packed indices) is supported");
    const int64_t palettes = lut.numel();
    int bits = 0;
    while ((int64_t{1} << bits) < palettes) ++bits;
    if ((int64_t{1} << bits) != palettes || bits < 1 || bits > 8)
      c.fail("a table of {} entries (2, 4, 16, 64 or 256)", palettes);
    const Array bytes = packed.astype(u8);
    const auto* p = bytes.data<uint8_t>();
    if (static_cast<uint64_t>(n) * bits > static_cast<uint64_t>(bytes.numel()) * 8)
      c.fail("{} indices of {} bits need more than {} bytes", n, bits, bytes.numel());
    const std::vector<double> table = values_of(lut);
    std::vector<double> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      uint32_t v = 0;
      for (int b = 0; b < bits; ++b) {
        const uint64_t bit = static_cast<uint64_t>(i) * bits + b;
        v |= ((p[bit / 8] >> (bit % 8)) & 1u) << b;
      }
      out[static_cast<size_t>(i)] = table[v];
    }
    c.set_known(0, array_from(out, Shape(shape.begin(), shape.end()), lut.dtype()));
  };
  // nonzero_data at the set bits of mask (LSB first), zeros elsewhere
  // (iOS18: the mask is a uint1 tensor of the output's shape, no `shape`)
  t["constexpr_sparse_to_dense"] = [](OpContext& c) {
    const Array data = c.known("nonzero_data"), mask = c.known("mask");
    const Array m = mask.astype(u8);
    const auto* p = m.data<uint8_t>();
    const bool packed = c.has("shape");  // iOS16: bits of a flat byte mask
    Shape shape = m.shape();
    if (packed) {
      const std::vector<int64_t> dims = c.ints("shape");
      shape.assign(dims.begin(), dims.end());
    }
    const int64_t n = numel(shape);
    if (packed ? n > m.numel() * 8 : n != m.numel())
      c.fail("a mask of {} elements for {} values", m.numel(), n);
    const std::vector<double> nz = values_of(data);
    std::vector<double> out(static_cast<size_t>(n), 0.0);
    size_t next = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (!(packed ? (p[i / 8] >> (i % 8)) & 1u : p[i])) continue;
      if (next >= nz.size()) c.fail("the mask sets more bits than the {} values given", nz.size());
      out[static_cast<size_t>(i)] = nz[next++];
    }
    c.set_known(0, array_from(out, shape, data.dtype()));
  };
  t["constexpr_cast"] = [](OpContext& c) {
    c.set_known(0, c.known("source_val").astype(c.out_dtype()));
  };
  // iOS18: scale * (data - offset), scale and offset blockwise over data's dims
  t["constexpr_blockwise_shift_scale"] = [](OpContext& c) {
    const Array data = c.known("data"), sc = c.known("scale");
    const Shape shape = data.shape();
    if (sc.shape().size() != shape.size())
      c.fail("a scale of rank {} for data of rank {}", sc.shape().size(), shape.size());
    for (size_t k = 0; k < shape.size(); ++k)
      if (sc.shape()[k] <= 0 || shape[k] % sc.shape()[k])
        c.fail("a scale of shape {} does not tile data of shape {}", str(sc.shape()), str(shape));
    const std::vector<double> dv = values_of(data), sv = values_of(sc);
    std::vector<double> ov;
    Shape oshape;
    if (c.has("offset")) {
      const Array off = c.known("offset");
      if (off.shape() != sc.shape()) c.fail("the offset's shape differs from the scale's");
      ov = values_of(off);
      oshape = off.shape();
    }
    std::vector<double> out(dv.size());
    for (size_t i = 0; i < dv.size(); ++i) {
      const auto ii = static_cast<int64_t>(i);
      const double o = ov.empty() ? 0.0 : blockwise(ov, oshape, shape, ii);
      out[i] = blockwise(sv, sc.shape(), shape, ii) * (dv[i] - o);
    }
    c.set_known(0, array_from(out, shape, sc.dtype()));
  };
}

}  // namespace kiln::coreml::detail
