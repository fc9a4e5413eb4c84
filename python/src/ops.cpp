// Ops: elementwise, reductions, transforms, constants. Names and arguments follow the C++ API
// (include/kiln/ops/); each returns tensors of the graph of its inputs.
#include <algorithm>
#include <cstring>

#include "common.h"
#include "ops/elementwise_records.h"

namespace kiln::py {

namespace {
constexpr auto ka = nb::keep_alive<0, 1>();
// The first item of a sequence (none when empty), for results to keep alive.
nb::object first_of(nb::handle xs) { return nb::len(xs) > 0 ? nb::object(xs[0]) : nb::none(); }
}  // namespace

const char* op_doc(const char* name) {
  struct Doc {
    const char* name;
    const char* doc;
  };
  static constexpr Doc kDocs[] = {
#define KILN_OP_DOC(name, doc) {name, doc},
#include "op_docs.inc"
#undef KILN_OP_DOC
  };
  for (const Doc& d : kDocs)
    if (std::strcmp(d.name, name) == 0) return d.doc;
  return "";
}

#define KILN_UNARY(fn) \
  m.def(               \
      #fn, [](const Tensor& x) { return kiln::fn(x); }, nb::arg("x"), ka, op_doc(#fn))
#define KILN_BINARY(fn)                                                                   \
  m.def(                                                                                  \
      #fn, [](const Tensor& a, const Tensor& b) { return kiln::fn(a, b); }, nb::arg("a"), \
      nb::arg("b"), ka, op_doc(#fn))
#define KILN_REDUCE(fn)                                                              \
  m.def(                                                                             \
      #fn,                                                                           \
      [](const Tensor& x, std::optional<std::vector<int64_t>> axes, bool keepdims) { \
        return kiln::fn(x, axes.value_or(Axes{}), keepdims);                         \
      },                                                                             \
      nb::arg("x"), nb::arg("axes") = nb::none(), nb::arg("keepdims") = false, ka, op_doc(#fn))

void bind_ops(nb::module_& m) {
  // elementwise
  // the records of op_list.inc without attributes, by their C++ names
#define KILN_OP(P, s, id, family)
#define KILN_EW(P, s, id, arity, result, types, k0, k1) \
  KILN_EW_IF_NO_ATTRS(k0, KILN_EW_BIND_##arity(s);)
#define KILN_EW_BIND_1(s) KILN_UNARY(s)
#define KILN_EW_BIND_2(s) KILN_BINARY(s)
#include "ops/op_list.inc"
#undef KILN_OP
#undef KILN_EW
#undef KILN_EW_BIND_1
#undef KILN_EW_BIND_2
  m.def("bit_shift", &kiln::bit_shift, nb::arg("x"), nb::arg("y"), nb::arg("left"), ka,
        op_doc("bit_shift"));
  m.def("leaky_relu", &kiln::leaky_relu, nb::arg("x"), nb::arg("alpha") = 0.01, ka,
        op_doc("leaky_relu"));
  m.def("elu", &kiln::elu, nb::arg("x"), nb::arg("alpha") = 1.0, ka, op_doc("elu"));
  nb::enum_<GeluApprox>(m, "GeluApprox")
      .value("none", GeluApprox::none)
      .value("tanh", GeluApprox::tanh);
  m.def("gelu", &kiln::gelu, nb::arg("x"), nb::arg("approximate") = GeluApprox::none, ka,
        op_doc("gelu"));
  m.def("softplus", &kiln::softplus, nb::arg("x"), nb::arg("beta") = 1.0,
        nb::arg("threshold") = 20.0, ka, op_doc("softplus"));
  m.def("softshrink", &kiln::softshrink, nb::arg("x"), nb::arg("lambd") = 0.5, ka,
        op_doc("softshrink"));
  m.def("hardshrink", &kiln::hardshrink, nb::arg("x"), nb::arg("lambd") = 0.5, ka,
        op_doc("hardshrink"));
  m.def("hardsigmoid", &kiln::hardsigmoid, nb::arg("x"), nb::arg("alpha") = 1.0 / 6.0,
        nb::arg("beta") = 0.5, ka, op_doc("hardsigmoid"));
  m.def("clip", &kiln::clip, nb::arg("x"), nb::arg("lo") = -INFINITY, nb::arg("hi") = INFINITY, ka,
        op_doc("clip"));
  m.def("where", &kiln::where, nb::arg("cond"), nb::arg("x"), nb::arg("y"), ka, op_doc("where"));
  m.def(
      "cast",
      [](const Tensor& x, DType dtype, bool saturate, const std::string& round) {
        narrow::Rules r{saturate, narrow::Round::up};
        if (round == "down") r.round = narrow::Round::down;
        else if (round == "nearest") r.round = narrow::Round::nearest;
        else if (round != "up")
          throw ValueError("[cast] round must be \"up\", \"down\" or \"nearest\", got \"" + round +
                           "\"");
        return kiln::cast(x, dtype, r);
      },
      nb::arg("x"), nb::arg("dtype"), nb::arg("saturate") = true, nb::arg("round") = "up", ka,
      op_doc("cast"));
  m.def("bitcast", &kiln::bitcast, nb::arg("x"), nb::arg("dtype"), ka, op_doc("bitcast"));

  // reductions
  KILN_REDUCE(sum);
  KILN_REDUCE(mean);
  KILN_REDUCE(max);
  KILN_REDUCE(min);
  KILN_REDUCE(prod);
  KILN_REDUCE(logsumexp);
  KILN_REDUCE(norm_l1);
  KILN_REDUCE(norm_l2);
  m.def(
      "variance",
      [](const Tensor& x, std::optional<std::vector<int64_t>> axes, bool keepdims,
         int64_t correction) {
        return kiln::variance(x, axes.value_or(Axes{}), keepdims, correction);
      },
      nb::arg("x"), nb::arg("axes") = nb::none(), nb::arg("keepdims") = false,
      nb::arg("correction") = 0, ka, op_doc("variance"));
  m.def("argmax", &kiln::argmax, nb::arg("x"), nb::arg("axis"), nb::arg("keepdims") = false, ka,
        op_doc("argmax"));
  m.def("argmin", &kiln::argmin, nb::arg("x"), nb::arg("axis"), nb::arg("keepdims") = false, ka,
        op_doc("argmin"));
  m.def("cumsum", &kiln::cumsum, nb::arg("x"), nb::arg("axis"), nb::arg("exclusive") = false,
        nb::arg("reverse") = false, ka, op_doc("cumsum"));

  // constants
  m.def(
      "constant", [](Graph& g, nb::handle v) { return kiln::constant(g, to_array(v)); },
      nb::arg("graph"), nb::arg("value"), ka, op_doc("constant"));
  m.def(
      "full",
      [](Graph& g, nb::handle shape, double v, DType t) {
        if (nb::isinstance<Tensor>(shape)) return kiln::full(nb::cast<Tensor>(shape), v, t);
        return kiln::full(g, to_shape(shape), v, t);
      },
      nb::arg("graph"), nb::arg("shape"), nb::arg("value"), nb::arg("dtype") = f32, ka,
      op_doc("full"));
  m.def(
      "zeros",
      [](Graph& g, nb::handle shape, DType t) { return kiln::zeros(g, to_shape(shape), t); },
      nb::arg("graph"), nb::arg("shape"), nb::arg("dtype") = f32, ka, op_doc("zeros"));
  m.def(
      "ones", [](Graph& g, nb::handle shape, DType t) { return kiln::ones(g, to_shape(shape), t); },
      nb::arg("graph"), nb::arg("shape"), nb::arg("dtype") = f32, ka, op_doc("ones"));
  m.def(
      "arange",
      [](Graph& g, nb::handle start, nb::handle stop, nb::handle step, DType t) {
        const nb::handle v[] = {start, stop, step};
        if (std::none_of(std::begin(v), std::end(v),
                         [](nb::handle h) { return nb::isinstance<Tensor>(h); }))
          return kiln::arange(g, nb::cast<double>(start), nb::cast<double>(stop),
                              nb::cast<double>(step), t);
        // values computed from shapes (shape_of); numbers among them become constants
        auto value = [&](nb::handle h) {
          return nb::isinstance<Tensor>(h) ? nb::cast<Tensor>(h)
                                           : g.constant(Array::scalar(nb::cast<double>(h)));
        };
        return kiln::arange(value(start), value(stop), value(step), t);
      },
      nb::arg("graph"), nb::arg("start"), nb::arg("stop"), nb::arg("step") = 1.0,
      nb::arg("dtype") = f32, ka, op_doc("arange"));
  m.def("shape_of", &kiln::shape_of, nb::arg("x"), ka, op_doc("shape_of"));
  m.def("assign", &kiln::assign, nb::arg("variable"), nb::arg("value"), ka, op_doc("assign"));
  m.def(
      "assign_slice",
      [](const Tensor& variable, const Tensor& update, nb::handle starts) {
        if (nb::isinstance<Tensor>(starts))
          return kiln::assign_slice(variable, update, nb::cast<Tensor>(starts));
        std::vector<int64_t> s;
        if (nb::isinstance<nb::str>(starts) || !nb::try_cast(starts, s))
          throw nb::type_error(
              ("[assign_slice] starts must be a Tensor or a sequence of ints, got " +
               nb::cast<std::string>(nb::str(starts.type().attr("__name__"))))
                  .c_str());
        return kiln::assign_slice(variable, update, s);
      },
      nb::arg("variable"), nb::arg("update"), nb::arg("starts"), ka, op_doc("assign_slice"));
  m.def("scalar_like", &kiln::scalar_like, nb::arg("x"), nb::arg("value"), ka,
        op_doc("scalar_like"));

  // transforms
  m.def(
      "reshape",
      [](const Tensor& x, nb::handle s, bool zero_copies) {
        if (nb::isinstance<Tensor>(s)) return kiln::reshape_to(x, nb::cast<Tensor>(s), zero_copies);
        return kiln::reshape(x, to_shape(s));
      },
      nb::arg("x"), nb::arg("shape"), nb::arg("zero_copies") = false, ka, op_doc("reshape"));
  m.def("transpose", &kiln::transpose, nb::arg("x"), nb::arg("perm") = std::vector<int64_t>{}, ka,
        op_doc("transpose"));
  m.def("permute", &kiln::permute, nb::arg("x"), nb::arg("perm"), ka, op_doc("permute"));
  m.def("expand_dims", &kiln::expand_dims, nb::arg("x"), nb::arg("axes"), ka,
        op_doc("expand_dims"));
  m.def("squeeze", &kiln::squeeze, nb::arg("x"), nb::arg("axes") = std::vector<int64_t>{}, ka,
        op_doc("squeeze"));
  m.def(
      "split",
      [](const Tensor& x, nb::handle parts, int64_t axis) {
        nb::object xo = nb::cast(x);
        if (nb::isinstance<nb::int_>(parts))
          return tensor_list(kiln::split(x, nb::cast<int64_t>(parts), axis), xo);
        return tensor_list(kiln::split(x, nb::cast<std::vector<int64_t>>(parts), axis), xo);
      },
      nb::arg("x"), nb::arg("parts"), nb::arg("axis") = 0, op_doc("split"));
  m.def(
      "stack",
      [](nb::handle xs, int64_t axis) {
        auto ts = as_tensors(xs, "xs");
        return tensor_object(kiln::stack(ts, axis), first_of(xs));
      },
      nb::arg("xs"), nb::arg("axis") = 0, op_doc("stack"));
  m.def(
      "concat",
      [](nb::handle xs, int64_t axis) {
        auto ts = as_tensors(xs, "xs");
        return tensor_object(kiln::concat(ts, axis), first_of(xs));
      },
      nb::arg("xs"), nb::arg("axis") = 0, op_doc("concat"));
  m.def(
      "slice",
      [](const Tensor& x, nb::handle starts, nb::handle stops, const std::vector<int64_t>& steps,
         const std::vector<int64_t>& axes) {
        if (nb::isinstance<Tensor>(starts) || nb::isinstance<Tensor>(stops)) {
          if (!nb::isinstance<Tensor>(starts) || !nb::isinstance<Tensor>(stops))
            throw nb::type_error("slice: starts and stops are both Tensors or both lists");
          return kiln::slice(x, nb::cast<Tensor>(starts), nb::cast<Tensor>(stops), steps, axes);
        }
        return kiln::slice(x, nb::cast<std::vector<int64_t>>(starts),
                           nb::cast<std::vector<int64_t>>(stops), steps, axes);
      },
      nb::arg("x"), nb::arg("starts"), nb::arg("stops"), nb::arg("steps") = std::vector<int64_t>{},
      nb::arg("axes") = std::vector<int64_t>{}, ka, op_doc("slice"));
  nb::enum_<PadKind>(m, "PadKind")
      .value("constant", PadKind::constant)
      .value("reflect", PadKind::reflect)
      .value("edge", PadKind::edge);
  m.def(
      "pad",
      [](const Tensor& x, nb::handle pads, PadKind kind, double value) {
        if (nb::isinstance<Tensor>(pads)) return kiln::pad(x, nb::cast<Tensor>(pads), kind, value);
        return kiln::pad(x, nb::cast<std::vector<int64_t>>(pads), kind, value);
      },
      nb::arg("x"), nb::arg("pads"), nb::arg("kind") = PadKind::constant, nb::arg("value") = 0.0,
      ka, op_doc("pad"));
  m.def(
      "tile",
      [](const Tensor& x, nb::handle reps) {
        if (nb::isinstance<Tensor>(reps)) return kiln::tile(x, nb::cast<Tensor>(reps));
        return kiln::tile(x, nb::cast<std::vector<int64_t>>(reps));
      },
      nb::arg("x"), nb::arg("reps"), ka, op_doc("tile"));
  m.def(
      "broadcast_to",
      [](const Tensor& x, nb::handle s) { return kiln::broadcast_to(x, to_shape(s)); },
      nb::arg("x"), nb::arg("shape"), ka, op_doc("broadcast_to"));
  m.def("expand", &kiln::expand, nb::arg("x"), nb::arg("shape"), ka, op_doc("expand"));
  m.def("flip", &kiln::flip, nb::arg("x"), nb::arg("axes"), ka, op_doc("flip"));
  m.def("gather", &kiln::gather, nb::arg("x"), nb::arg("indices"), nb::arg("axis") = 0, ka,
        op_doc("gather"));
  m.def("gather_elements", &kiln::gather_elements, nb::arg("x"), nb::arg("indices"),
        nb::arg("axis"), ka, op_doc("gather_elements"));
  nb::enum_<ScatterReduction>(m, "ScatterReduction")
      .value("none", ScatterReduction::none)
      .value("add", ScatterReduction::add)
      .value("mul", ScatterReduction::mul)
      .value("max", ScatterReduction::max)
      .value("min", ScatterReduction::min);
  m.def("scatter_elements", &kiln::scatter_elements, nb::arg("x"), nb::arg("indices"),
        nb::arg("updates"), nb::arg("axis"), nb::arg("reduction") = ScatterReduction::none, ka,
        op_doc("scatter_elements"));
  m.def("gather_nd", &kiln::gather_nd, nb::arg("x"), nb::arg("indices"), nb::arg("batch_dims") = 0,
        ka, op_doc("gather_nd"));
  m.def("scatter_nd", &kiln::scatter_nd, nb::arg("x"), nb::arg("indices"), nb::arg("updates"),
        nb::arg("reduction") = ScatterReduction::none, ka, op_doc("scatter_nd"));
  m.def("assign_scatter_nd", &kiln::assign_scatter_nd, nb::arg("variable"), nb::arg("indices"),
        nb::arg("updates"), nb::arg("reduction") = ScatterReduction::none, ka,
        op_doc("assign_scatter_nd"));
  m.def(
      "one_hot",
      [](const Tensor& idx, nb::handle depth, int64_t axis, DType t, double on, double off) {
        if (nb::isinstance<Tensor>(depth))
          return kiln::one_hot(idx, nb::cast<Tensor>(depth), axis, t, on, off);
        return kiln::one_hot(idx, nb::cast<int64_t>(depth), axis, t, on, off);
      },
      nb::arg("indices"), nb::arg("depth"), nb::arg("axis") = -1, nb::arg("dtype") = f32,
      nb::arg("on_value") = 1.0, nb::arg("off_value") = 0.0, ka, op_doc("one_hot"));
  m.def(
      "topk",
      [](const Tensor& x, nb::handle k, int64_t axis, bool largest) {
        auto [v, i] = nb::isinstance<Tensor>(k)
                          ? kiln::topk(x, nb::cast<Tensor>(k), axis, largest)
                          : kiln::topk(x, nb::cast<int64_t>(k), axis, largest);
        nb::object xo = nb::cast(x);
        return nb::make_tuple(tensor_object(v, xo), tensor_object(i, xo));
      },
      nb::arg("x"), nb::arg("k"), nb::arg("axis") = -1, nb::arg("largest") = true, op_doc("topk"));
  m.def("sort", &kiln::sort, nb::arg("x"), nb::arg("axis") = -1, nb::arg("descending") = false, ka,
        op_doc("sort"));
  m.def("argsort", &kiln::argsort, nb::arg("x"), nb::arg("axis") = -1,
        nb::arg("descending") = false, ka, op_doc("argsort"));
  m.def("coordinate_along_axis", &kiln::coordinate_along_axis, nb::arg("x"), nb::arg("axis"),
        nb::arg("dtype") = i32, ka, op_doc("coordinate_along_axis"));
  m.def("hamming_distance", &kiln::hamming_distance, nb::arg("a"), nb::arg("b"),
        nb::arg("dtype") = i32, ka, op_doc("hamming_distance"));
  nb::enum_<ResizeMode>(m, "ResizeMode")
      .value("nearest", ResizeMode::nearest)
      .value("linear", ResizeMode::linear)
      .value("cubic", ResizeMode::cubic);
  nb::enum_<ResizeCoordinates>(m, "ResizeCoordinates")
      .value("half_pixel", ResizeCoordinates::half_pixel)
      .value("half_pixel_symmetric", ResizeCoordinates::half_pixel_symmetric)
      .value("pytorch_half_pixel", ResizeCoordinates::pytorch_half_pixel)
      .value("align_corners", ResizeCoordinates::align_corners)
      .value("asymmetric", ResizeCoordinates::asymmetric)
      .value("tf_crop_and_resize", ResizeCoordinates::tf_crop_and_resize);
  nb::enum_<NearestMode>(m, "NearestMode")
      .value("round_prefer_floor", NearestMode::round_prefer_floor)
      .value("round_prefer_ceil", NearestMode::round_prefer_ceil)
      .value("floor", NearestMode::floor)
      .value("ceil", NearestMode::ceil);
  m.def(
      "resize",
      [](const Tensor& x, nb::handle sizes, ResizeMode mode, ResizeCoordinates coords,
         NearestMode nearest, bool antialias, double cubic_coeff_a, bool exclude_outside,
         double extrapolation_value, std::vector<double> scales, std::vector<double> roi) {
        ResizeOptions o;
        o.mode = mode;
        o.coordinate_transformation_mode = coords;
        o.nearest_mode = nearest;
        o.antialias = antialias;
        o.cubic_coeff_a = cubic_coeff_a;
        o.exclude_outside = exclude_outside;
        o.extrapolation_value = extrapolation_value;
        o.scales = std::move(scales);
        o.roi = std::move(roi);
        return kiln::resize(x, to_shape(sizes), o);
      },
      nb::arg("x"), nb::arg("sizes"), nb::arg("mode") = ResizeMode::nearest,
      nb::arg("coordinate_transformation_mode") = ResizeCoordinates::half_pixel,
      nb::arg("nearest_mode") = NearestMode::round_prefer_floor, nb::arg("antialias") = false,
      nb::arg("cubic_coeff_a") = -0.75, nb::arg("exclude_outside") = false,
      nb::arg("extrapolation_value") = 0.0, nb::arg("scales") = std::vector<double>{},
      nb::arg("roi") = std::vector<double>{}, ka, op_doc("resize"));

  nb::enum_<GridSampleMode>(m, "GridSampleMode")
      .value("linear", GridSampleMode::linear)
      .value("nearest", GridSampleMode::nearest)
      .value("cubic", GridSampleMode::cubic);
  nb::enum_<GridSamplePadding>(m, "GridSamplePadding")
      .value("zeros", GridSamplePadding::zeros)
      .value("border", GridSamplePadding::border)
      .value("reflection", GridSamplePadding::reflection);
  m.def(
      "grid_sample",
      [](const Tensor& x, const Tensor& grid, GridSampleMode mode, GridSamplePadding padding,
         bool align_corners) {
        return kiln::grid_sample(x, grid, {mode, padding, align_corners});
      },
      nb::arg("x"), nb::arg("grid"), nb::arg("mode") = GridSampleMode::linear,
      nb::arg("padding_mode") = GridSamplePadding::zeros, nb::arg("align_corners") = false, ka,
      op_doc("grid_sample"));

  // layout, lookup and selection (rearrange.h)
  m.def(
      "depth_to_space",
      [](const Tensor& x, int64_t b, bool crd, bool channels_last) {
        return kiln::depth_to_space(
            x, b, {crd ? SpaceDepthMode::crd : SpaceDepthMode::dcr, channels_last});
      },
      nb::arg("x"), nb::arg("block_size"), nb::arg("crd") = false, nb::arg("channels_last") = false,
      ka, op_doc("depth_to_space"));
  m.def(
      "space_to_depth",
      [](const Tensor& x, int64_t b, bool crd, bool channels_last) {
        return kiln::space_to_depth(
            x, b, {crd ? SpaceDepthMode::crd : SpaceDepthMode::dcr, channels_last});
      },
      nb::arg("x"), nb::arg("block_size"), nb::arg("crd") = false, nb::arg("channels_last") = false,
      ka, op_doc("space_to_depth"));
  m.def("pixel_shuffle", &kiln::pixel_shuffle, nb::arg("x"), nb::arg("upscale_factor"), ka,
        op_doc("pixel_shuffle"));
  m.def("pixel_unshuffle", &kiln::pixel_unshuffle, nb::arg("x"), nb::arg("downscale_factor"), ka,
        op_doc("pixel_unshuffle"));
  m.def("embedding", &kiln::embedding, nb::arg("weight"), nb::arg("indices"),
        nb::arg("padding_idx") = nb::none(), ka, op_doc("embedding"));
  m.def("embedding_grad", &kiln::embedding_grad, nb::arg("indices"), nb::arg("grad"),
        nb::arg("num_embeddings"), nb::arg("padding_idx") = -1, ka, op_doc("embedding_grad"));
  m.def("masked_fill", &kiln::masked_fill, nb::arg("x"), nb::arg("mask"), nb::arg("value"), ka,
        op_doc("masked_fill"));
  m.def("roll", &kiln::roll, nb::arg("x"), nb::arg("shifts"),
        nb::arg("axes") = std::vector<int64_t>{}, ka, op_doc("roll"));
  m.def(
      "non_max_suppression",
      [](const Tensor& boxes, const Tensor& scores, int64_t max_per_class, double iou,
         std::optional<double> score_threshold, bool center_point_box) {
        auto [sel, count] = kiln::non_max_suppression(boxes, scores, max_per_class,
                                                      {iou, score_threshold, center_point_box});
        nb::object xo = nb::cast(boxes);
        return nb::make_tuple(tensor_object(sel, xo), tensor_object(count, xo));
      },
      nb::arg("boxes"), nb::arg("scores"), nb::arg("max_output_boxes_per_class"),
      nb::arg("iou_threshold") = 0.0, nb::arg("score_threshold") = nb::none(),
      nb::arg("center_point_box") = false, op_doc("non_max_suppression"));

  // linear algebra extras
  m.def("cholesky", &kiln::cholesky, nb::arg("a"), nb::arg("upper") = false, ka,
        op_doc("cholesky"));
  m.def(
      "triangular_solve",
      [](const Tensor& a, const Tensor& b, bool upper, bool left, bool transpose, bool unit) {
        return kiln::triangular_solve(a, b, {upper, left, transpose, unit});
      },
      nb::arg("a"), nb::arg("b"), nb::arg("upper") = false, nb::arg("left") = true,
      nb::arg("transpose") = false, nb::arg("unit_diagonal") = false, ka,
      op_doc("triangular_solve"));
  m.def(
      "einsum",
      [](const std::string& eq, nb::handle xs) {
        auto ts = as_tensors(xs, "xs");
        return tensor_object(kiln::einsum(eq, ts), first_of(xs));
      },
      nb::arg("equation"), nb::arg("operands"), op_doc("einsum"));
}

}  // namespace kiln::py
