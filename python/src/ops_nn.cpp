// Ops: matrix products, convolution, pooling, normalization, losses, attention, random, RNNs.
#include "common.h"

namespace kiln::py {

namespace {
constexpr auto ka = nb::keep_alive<0, 1>();
using Ints = std::vector<int64_t>;
using OptT = std::optional<Tensor>;

ConvOptions conv_options(Ints stride, Ints padding, Ints dilation, int64_t groups, PadMode mode) {
  ConvOptions o;
  o.stride = std::move(stride);
  o.padding = std::move(padding);
  o.dilation = std::move(dilation);
  o.groups = groups;
  o.pad_mode = mode;
  return o;
}

PoolOptions pool_options(Ints kernel, Ints stride, Ints padding, Ints dilation, bool ceil_mode,
                         bool count_include_pad) {
  PoolOptions o;
  o.kernel = std::move(kernel);
  o.stride = std::move(stride);
  o.padding = std::move(padding);
  o.dilation = std::move(dilation);
  o.ceil_mode = ceil_mode;
  o.count_include_pad = count_include_pad;
  return o;
}

template <Tensor (*F)(const Tensor&, const Tensor&, const OptT&, const ConvOptions&)>
void conv(nb::module_& m, const char* name) {
  m.def(
      name,
      [](const Tensor& x, const Tensor& w, const OptT& b, Ints stride, Ints padding, Ints dilation,
         int64_t groups, PadMode mode) {
        return F(x, w, b, conv_options(stride, padding, dilation, groups, mode));
      },
      nb::arg("x"), nb::arg("w"), nb::arg("bias") = nb::none(), nb::arg("stride") = Ints{},
      nb::arg("padding") = Ints{}, nb::arg("dilation") = Ints{}, nb::arg("groups") = 1,
      nb::arg("pad_mode") = PadMode::explicit_, ka, op_doc(name));
}

template <Tensor (*F)(const Tensor&, const Tensor&, const OptT&, const ConvTransposeOptions&)>
void conv_transpose(nb::module_& m, const char* name) {
  m.def(
      name,
      [](const Tensor& x, const Tensor& w, const OptT& b, Ints stride, Ints padding,
         Ints output_padding, Ints dilation, int64_t groups) {
        ConvTransposeOptions o{stride, padding, output_padding, dilation, groups};
        return F(x, w, b, o);
      },
      nb::arg("x"), nb::arg("w"), nb::arg("bias") = nb::none(), nb::arg("stride") = Ints{},
      nb::arg("padding") = Ints{}, nb::arg("output_padding") = Ints{}, nb::arg("dilation") = Ints{},
      nb::arg("groups") = 1, ka, op_doc(name));
}

nb::tuple random_tuple(const RandomResult& r, nb::handle patient) {
  return nb::make_tuple(tensor_object(r.values, patient), tensor_object(r.state, patient));
}

}  // namespace

void bind_ops_nn(nb::module_& m) {
  m.def("matmul", &kiln::matmul, nb::arg("a"), nb::arg("b"), ka, op_doc("matmul"));
  m.def("linear", &kiln::linear, nb::arg("x"), nb::arg("w"), nb::arg("bias") = nb::none(), ka,
        op_doc("linear"));
  nb::enum_<PadMode>(m, "PadMode")
      .value("explicit", PadMode::explicit_)
      .value("same_upper", PadMode::same_upper)
      .value("same_lower", PadMode::same_lower)
      .value("valid", PadMode::valid);
  conv<&kiln::conv1d>(m, "conv1d");
  conv<&kiln::conv2d>(m, "conv2d");
  conv<&kiln::conv3d>(m, "conv3d");
  conv_transpose<&kiln::conv_transpose1d>(m, "conv_transpose1d");
  conv_transpose<&kiln::conv_transpose2d>(m, "conv_transpose2d");
  conv_transpose<&kiln::conv_transpose3d>(m, "conv_transpose3d");
  m.def(
      "max_pool",
      [](const Tensor& x, Ints kernel, Ints stride, Ints padding, Ints dilation, bool ceil_mode) {
        return kiln::max_pool(x, pool_options(kernel, stride, padding, dilation, ceil_mode, false));
      },
      nb::arg("x"), nb::arg("kernel"), nb::arg("stride") = Ints{}, nb::arg("padding") = Ints{},
      nb::arg("dilation") = Ints{}, nb::arg("ceil_mode") = false, ka, op_doc("max_pool"));
  m.def(
      "max_pool_with_indices",
      [](const Tensor& x, Ints kernel, Ints stride, Ints padding, Ints dilation, bool ceil_mode) {
        auto [y, i] = kiln::max_pool_with_indices(
            x, pool_options(kernel, stride, padding, dilation, ceil_mode, false));
        nb::object xo = nb::cast(x);
        return nb::make_tuple(tensor_object(y, xo), tensor_object(i, xo));
      },
      nb::arg("x"), nb::arg("kernel"), nb::arg("stride") = Ints{}, nb::arg("padding") = Ints{},
      nb::arg("dilation") = Ints{}, nb::arg("ceil_mode") = false, op_doc("max_pool_with_indices"));
  m.def(
      "avg_pool",
      [](const Tensor& x, Ints kernel, Ints stride, Ints padding, bool ceil_mode,
         bool count_include_pad) {
        return kiln::avg_pool(
            x, pool_options(kernel, stride, padding, {}, ceil_mode, count_include_pad));
      },
      nb::arg("x"), nb::arg("kernel"), nb::arg("stride") = Ints{}, nb::arg("padding") = Ints{},
      nb::arg("ceil_mode") = false, nb::arg("count_include_pad") = false, ka, op_doc("avg_pool"));
  m.def("global_avg_pool", &kiln::global_avg_pool, nb::arg("x"), ka, op_doc("global_avg_pool"));
  m.def("adaptive_avg_pool", &kiln::adaptive_avg_pool, nb::arg("x"), nb::arg("output_size"), ka,
        op_doc("adaptive_avg_pool"));

  m.def(
      "conv_grad_weight",
      [](const Tensor& x, const Tensor& dy, nb::handle weight_shape, Ints stride, Ints padding,
         Ints dilation, int64_t groups) {
        return kiln::conv_grad_weight(
            x, dy, to_shape(weight_shape),
            conv_options(stride, padding, dilation, groups, PadMode::explicit_));
      },
      nb::arg("x"), nb::arg("dy"), nb::arg("weight_shape"), nb::arg("stride") = Ints{},
      nb::arg("padding") = Ints{}, nb::arg("dilation") = Ints{}, nb::arg("groups") = 1, ka,
      op_doc("conv_grad_weight"));
  m.def(
      "max_pool_grad",
      [](const Tensor& g, const Tensor& idx, nb::handle shape) {
        if (nb::isinstance<Tensor>(shape))
          return kiln::max_pool_grad(g, idx, nb::cast<Tensor>(shape));
        return kiln::max_pool_grad(g, idx, to_shape(shape));
      },
      nb::arg("grad"), nb::arg("indices"), nb::arg("input_shape"), ka, op_doc("max_pool_grad"));
  m.def(
      "avg_pool_grad",
      [](const Tensor& g, nb::handle shape, Ints kernel, Ints stride, Ints padding, bool ceil_mode,
         bool count_include_pad) {
        const PoolOptions o =
            pool_options(kernel, stride, padding, {}, ceil_mode, count_include_pad);
        if (nb::isinstance<Tensor>(shape))
          return kiln::avg_pool_grad(g, nb::cast<Tensor>(shape), o);
        return kiln::avg_pool_grad(g, to_shape(shape), o);
      },
      nb::arg("grad"), nb::arg("input_shape"), nb::arg("kernel"), nb::arg("stride") = Ints{},
      nb::arg("padding") = Ints{}, nb::arg("ceil_mode") = false,
      nb::arg("count_include_pad") = false, ka, op_doc("avg_pool_grad"));
  m.def(
      "adaptive_avg_pool_grad",
      [](const Tensor& g, nb::handle shape) {
        if (nb::isinstance<Tensor>(shape))
          return kiln::adaptive_avg_pool_grad(g, nb::cast<Tensor>(shape));
        return kiln::adaptive_avg_pool_grad(g, to_shape(shape));
      },
      nb::arg("grad"), nb::arg("input_shape"), ka, op_doc("adaptive_avg_pool_grad"));

  // normalization
  m.def("softmax", &kiln::softmax, nb::arg("x"), nb::arg("axis") = -1, ka, op_doc("softmax"));
  m.def("log_softmax", &kiln::log_softmax, nb::arg("x"), nb::arg("axis") = -1, ka,
        op_doc("log_softmax"));
  m.def("layer_norm", &kiln::layer_norm, nb::arg("x"), nb::arg("weight") = nb::none(),
        nb::arg("bias") = nb::none(), nb::arg("begin_axis") = -1, nb::arg("eps") = 1e-5, ka,
        op_doc("layer_norm"));
  m.def("rms_norm", &kiln::rms_norm, nb::arg("x"), nb::arg("weight") = nb::none(),
        nb::arg("begin_axis") = -1, nb::arg("eps") = 1e-6, ka, op_doc("rms_norm"));
  m.def("batch_norm", &kiln::batch_norm, nb::arg("x"), nb::arg("mean"), nb::arg("var"),
        nb::arg("weight") = nb::none(), nb::arg("bias") = nb::none(), nb::arg("eps") = 1e-5, ka,
        op_doc("batch_norm"));
  m.def(
      "batch_norm_training",
      [](const Tensor& x, const Tensor& rm, const Tensor& rv, const OptT& w, const OptT& b,
         double momentum, double eps) {
        auto r = kiln::batch_norm_training(x, rm, rv, w, b, momentum, eps);
        nb::object xo = nb::cast(x);
        return nb::make_tuple(tensor_object(r.y, xo), tensor_list(r.updates, xo));
      },
      nb::arg("x"), nb::arg("running_mean"), nb::arg("running_var"), nb::arg("weight") = nb::none(),
      nb::arg("bias") = nb::none(), nb::arg("momentum") = 0.1, nb::arg("eps") = 1e-5,
      op_doc("batch_norm_training"));
  m.def(
      "batch_norm_train",
      [](const Tensor& x, const OptT& w, const OptT& b, double eps) {
        auto r = kiln::batch_norm_train(x, w, b, eps);
        nb::object xo = nb::cast(x);
        return nb::make_tuple(tensor_object(r.y, xo), tensor_object(r.mean, xo),
                              tensor_object(r.var, xo));
      },
      nb::arg("x"), nb::arg("weight") = nb::none(), nb::arg("bias") = nb::none(),
      nb::arg("eps") = 1e-5, op_doc("batch_norm_train"));
  m.def(
      "batch_norm_train_grad",
      [](const Tensor& dy, const Tensor& x, const Tensor& mean, const Tensor& var, const OptT& w,
         double eps) {
        auto r = kiln::batch_norm_train_grad(dy, x, mean, var, w, eps);
        nb::object xo = nb::cast(x);
        return nb::make_tuple(tensor_object(r.dx, xo), tensor_object(r.dweight, xo),
                              tensor_object(r.dbias, xo));
      },
      nb::arg("dy"), nb::arg("x"), nb::arg("mean"), nb::arg("var"), nb::arg("weight") = nb::none(),
      nb::arg("eps") = 1e-5, op_doc("batch_norm_train_grad"));
  m.def("instance_norm", &kiln::instance_norm, nb::arg("x"), nb::arg("weight") = nb::none(),
        nb::arg("bias") = nb::none(), nb::arg("eps") = 1e-5, ka, op_doc("instance_norm"));
  m.def("group_norm", &kiln::group_norm, nb::arg("x"), nb::arg("groups"),
        nb::arg("weight") = nb::none(), nb::arg("bias") = nb::none(), nb::arg("eps") = 1e-5, ka,
        op_doc("group_norm"));
  m.def("dropout", &kiln::dropout, nb::arg("x"), nb::arg("p"), nb::arg("training") = false,
        nb::arg("seed") = 0, ka, op_doc("dropout"));

  // losses
  nb::enum_<Reduction>(m, "Reduction")
      .value("none", Reduction::none)
      .value("mean", Reduction::mean)
      .value("sum", Reduction::sum);
  m.def("softmax_cross_entropy", &kiln::softmax_cross_entropy, nb::arg("logits"), nb::arg("labels"),
        nb::arg("reduction") = Reduction::mean, nb::arg("axis") = -1, ka,
        op_doc("softmax_cross_entropy"));
  m.def("nll", &kiln::nll, nb::arg("log_probs"), nb::arg("target"),
        nb::arg("reduction") = Reduction::mean, nb::arg("ignore_index") = -100, ka, op_doc("nll"));
  m.def("mse", &kiln::mse, nb::arg("a"), nb::arg("b"), nb::arg("reduction") = Reduction::mean, ka,
        op_doc("mse"));

  // attention
  m.def(
      "scaled_dot_product_attention",
      [](const Tensor& q, const Tensor& k, const Tensor& v, const OptT& mask, bool causal,
         std::optional<double> scale) {
        return kiln::scaled_dot_product_attention(q, k, v, mask, {causal, scale});
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("mask") = nb::none(),
      nb::arg("causal") = false, nb::arg("scale") = nb::none(), ka,
      op_doc("scaled_dot_product_attention"));

  // random
  m.def("random_philox_state", &kiln::random_philox_state, nb::arg("graph"), nb::arg("seed0"),
        nb::arg("seed1") = 0, ka, op_doc("random_philox_state"));
  m.def(
      "random_uniform",
      [](const Tensor& s, nb::handle shape, double lo, double hi, DType t) {
        return random_tuple(kiln::random_uniform(s, to_shape(shape), lo, hi, t), nb::cast(s));
      },
      nb::arg("state"), nb::arg("shape"), nb::arg("min") = 0.0, nb::arg("max") = 1.0,
      nb::arg("dtype") = f32, op_doc("random_uniform"));
  m.def(
      "random_normal",
      [](const Tensor& s, nb::handle shape, double mean, double std, DType t) {
        return random_tuple(kiln::random_normal(s, to_shape(shape), mean, std, t), nb::cast(s));
      },
      nb::arg("state"), nb::arg("shape"), nb::arg("mean") = 0.0, nb::arg("std") = 1.0,
      nb::arg("dtype") = f32, op_doc("random_normal"));
  m.def(
      "random_integer",
      [](const Tensor& s, nb::handle shape, int64_t lo, int64_t hi, DType t) {
        return random_tuple(kiln::random_integer(s, to_shape(shape), lo, hi, t), nb::cast(s));
      },
      nb::arg("state"), nb::arg("shape"), nb::arg("low"), nb::arg("high"), nb::arg("dtype") = i32,
      op_doc("random_integer"));
  m.def(
      "random_bernoulli",
      [](const Tensor& s, nb::handle shape, double p, DType t) {
        return random_tuple(kiln::random_bernoulli(s, to_shape(shape), p, t), nb::cast(s));
      },
      nb::arg("state"), nb::arg("shape"), nb::arg("p"), nb::arg("dtype") = f32,
      op_doc("random_bernoulli"));
  m.def(
      "stateless_uniform",
      [](Graph& g, nb::handle shape, std::array<int64_t, 2> seed, double lo, double hi, DType t) {
        return kiln::stateless_uniform(g, to_shape(shape), seed, lo, hi, t);
      },
      nb::arg("graph"), nb::arg("shape"), nb::arg("seed"), nb::arg("min") = 0.0,
      nb::arg("max") = 1.0, nb::arg("dtype") = f32, ka, op_doc("stateless_uniform"));
  m.def(
      "stateless_normal",
      [](Graph& g, nb::handle shape, std::array<int64_t, 2> seed, double mean, double std,
         DType t) { return kiln::stateless_normal(g, to_shape(shape), seed, mean, std, t); },
      nb::arg("graph"), nb::arg("shape"), nb::arg("seed"), nb::arg("mean") = 0.0,
      nb::arg("std") = 1.0, nb::arg("dtype") = f32, ka, op_doc("stateless_normal"));
  m.def(
      "stateless_truncated_normal",
      [](Graph& g, nb::handle shape, std::array<int64_t, 2> seed, double mean, double std,
         DType t) {
        return kiln::stateless_truncated_normal(g, to_shape(shape), seed, mean, std, t);
      },
      nb::arg("graph"), nb::arg("shape"), nb::arg("seed"), nb::arg("mean") = 0.0,
      nb::arg("std") = 1.0, nb::arg("dtype") = f32, ka, op_doc("stateless_truncated_normal"));
  m.def("random_philox_state_from", &kiln::random_philox_state_from, nb::arg("graph"),
        nb::arg("counter_low"), nb::arg("counter_high"), nb::arg("key"), ka,
        op_doc("random_philox_state_from"));
  m.def(
      "random_truncated_normal",
      [](const Tensor& s, nb::handle shape, double mean, double std, double lo, double hi,
         DType t) {
        return random_tuple(kiln::random_truncated_normal(s, to_shape(shape), mean, std, lo, hi, t),
                            nb::cast(s));
      },
      nb::arg("state"), nb::arg("shape"), nb::arg("mean") = 0.0, nb::arg("std") = 1.0,
      nb::arg("min") = -2.0, nb::arg("max") = 2.0, nb::arg("dtype") = f32,
      op_doc("random_truncated_normal"));
  m.def(
      "random_dropout_mask",
      [](const Tensor& s, nb::handle shape, double keep, DType t) {
        return random_tuple(kiln::random_dropout_mask(s, to_shape(shape), keep, t), nb::cast(s));
      },
      nb::arg("state"), nb::arg("shape"), nb::arg("keep"), nb::arg("dtype") = f32,
      op_doc("random_dropout_mask"));

  // recurrent layers
  nb::enum_<RnnCell>(m, "RnnCell")
      .value("lstm", RnnCell::lstm)
      .value("gru", RnnCell::gru)
      .value("rnn", RnnCell::rnn);
  nb::enum_<RnnDirection>(m, "RnnDirection")
      .value("forward", RnnDirection::forward)
      .value("reverse", RnnDirection::reverse)
      .value("bidirectional", RnnDirection::bidirectional);
  nb::class_<RnnLayerWeights>(m, "RnnLayerWeights",
                              "One layer's weights, ONNX layout and gate order.")
      .def(nb::init<>())
      .def(
          "__init__",
          [](RnnLayerWeights* l, const Tensor& w, const Tensor& r, const OptT& b, const OptT& p) {
            new (l) RnnLayerWeights{w, r, b, p};
          },
          nb::arg("w"), nb::arg("r"), nb::arg("b") = nb::none(), nb::arg("p") = nb::none())
      .def_rw("w", &RnnLayerWeights::w)
      .def_rw("r", &RnnLayerWeights::r)
      .def_rw("b", &RnnLayerWeights::b)
      .def_rw("p", &RnnLayerWeights::p);
  nb::class_<RnnResult>(m, "RnnResult")
      .def_ro("y", &RnnResult::y)
      .def_ro("h", &RnnResult::h)
      .def_ro("c", &RnnResult::c)
      .def_ro("reserve", &RnnResult::reserve);
  nb::enum_<RnnActivationKind>(m, "RnnActivationKind")
      .value("sigmoid", RnnActivationKind::sigmoid)
      .value("tanh", RnnActivationKind::tanh)
      .value("relu", RnnActivationKind::relu)
      .value("affine", RnnActivationKind::affine)
      .value("leaky_relu", RnnActivationKind::leaky_relu)
      .value("thresholded_relu", RnnActivationKind::thresholded_relu)
      .value("scaled_tanh", RnnActivationKind::scaled_tanh)
      .value("hard_sigmoid", RnnActivationKind::hard_sigmoid)
      .value("elu", RnnActivationKind::elu)
      .value("softsign", RnnActivationKind::softsign)
      .value("softplus", RnnActivationKind::softplus);
  nb::class_<RnnActivation>(m, "RnnActivation", "A recurrent activation with ONNX's alpha/beta.")
      .def(nb::init<>())
      .def(
          "__init__",
          [](RnnActivation* a, RnnActivationKind kind, std::optional<double> alpha,
             std::optional<double> beta) {
            RnnActivation d = RnnActivation::of(kind);
            new (a) RnnActivation{kind, alpha.value_or(d.alpha), beta.value_or(d.beta)};
          },
          nb::arg("kind"), nb::arg("alpha") = nb::none(), nb::arg("beta") = nb::none(),
          "Without alpha/beta: ONNX's defaults for the kind.")
      .def_rw("kind", &RnnActivation::kind)
      .def_rw("alpha", &RnnActivation::alpha)
      .def_rw("beta", &RnnActivation::beta);
  struct RnnArgs {
    RnnDirection direction;
    bool batch_first;
    double clip;
    std::vector<RnnActivation> activations;
    bool training;
  };
  auto rnn_opts = [](const RnnArgs& a) {
    RnnOptions o;
    o.direction = a.direction;
    o.batch_first = a.batch_first;
    o.clip = a.clip;
    o.activations = a.activations;
    o.training = a.training;
    return o;
  };
  m.def(
      "lstm",
      [rnn_opts](const Tensor& x, const std::vector<RnnLayerWeights>& layers, const OptT& h0,
                 const OptT& c0, const OptT& seq_lens, RnnDirection d, bool batch_first,
                 double clip, std::vector<RnnActivation> acts, bool input_forget, bool training) {
        RnnOptions o = rnn_opts({d, batch_first, clip, std::move(acts), training});
        o.input_forget = input_forget;
        return kiln::lstm(x, layers, h0, c0, seq_lens, o);
      },
      nb::arg("x"), nb::arg("layers"), nb::arg("h0") = nb::none(), nb::arg("c0") = nb::none(),
      nb::arg("seq_lens") = nb::none(), nb::arg("direction") = RnnDirection::forward,
      nb::arg("batch_first") = false, nb::arg("clip") = 0.0,
      nb::arg("activations") = std::vector<RnnActivation>{}, nb::arg("input_forget") = false,
      nb::arg("training") = false, ka, op_doc("lstm"));
  m.def(
      "gru",
      [rnn_opts](const Tensor& x, const std::vector<RnnLayerWeights>& layers, const OptT& h0,
                 const OptT& seq_lens, RnnDirection d, bool batch_first, double clip,
                 bool linear_before_reset, std::vector<RnnActivation> acts, bool training) {
        RnnOptions o = rnn_opts({d, batch_first, clip, std::move(acts), training});
        o.linear_before_reset = linear_before_reset;
        return kiln::gru(x, layers, h0, seq_lens, o);
      },
      nb::arg("x"), nb::arg("layers"), nb::arg("h0") = nb::none(), nb::arg("seq_lens") = nb::none(),
      nb::arg("direction") = RnnDirection::forward, nb::arg("batch_first") = false,
      nb::arg("clip") = 0.0, nb::arg("linear_before_reset") = false,
      nb::arg("activations") = std::vector<RnnActivation>{}, nb::arg("training") = false, ka,
      op_doc("gru"));
  m.def(
      "rnn",
      [rnn_opts](const Tensor& x, const std::vector<RnnLayerWeights>& layers, const OptT& h0,
                 const OptT& seq_lens, RnnDirection d, bool batch_first, double clip,
                 std::vector<RnnActivation> acts, bool training) {
        return kiln::rnn(x, layers, h0, seq_lens,
                         rnn_opts({d, batch_first, clip, std::move(acts), training}));
      },
      nb::arg("x"), nb::arg("layers"), nb::arg("h0") = nb::none(), nb::arg("seq_lens") = nb::none(),
      nb::arg("direction") = RnnDirection::forward, nb::arg("batch_first") = false,
      nb::arg("clip") = 0.0, nb::arg("activations") = std::vector<RnnActivation>{},
      nb::arg("training") = false, ka, op_doc("rnn"));
  m.def("torch_rnn_weights", &kiln::torch_rnn_weights, nb::arg("cell"), nb::arg("weight_ih"),
        nb::arg("weight_hh"), nb::arg("bias_ih") = std::vector<Tensor>{},
        nb::arg("bias_hh") = std::vector<Tensor>{}, op_doc("torch_rnn_weights"));
}

}  // namespace kiln::py
