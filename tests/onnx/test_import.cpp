// The ONNX importer on models built here with ONNX's protobuf classes: values against float64
// references, shape folding, dynamic dims, one error for every unsupported op, input_values.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>
#include <cstring>
#include <random>

#include "kiln/error.h"
#include "kiln/executable.h"
#include "kiln/onnx.h"

namespace {

using kiln::Array;

// Builds a ModelProto node by node.
struct ModelBuilder {
  ::onnx::ModelProto m;
  ::onnx::GraphProto* g;
  explicit ModelBuilder(int64_t opset = 17) {
    m.set_ir_version(8);
    m.set_producer_name("kiln-test");
    m.add_opset_import()->set_version(opset);
    g = m.mutable_graph();
    g->set_name("test");
  }
  void input(const std::string& name, int32_t type, const std::vector<int64_t>& dims,
             const std::vector<std::string>& params = {}) {
    auto* v = g->add_input();
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(type);
    auto* s = t->mutable_shape();
    for (size_t i = 0; i < dims.size(); ++i) {
      auto* d = s->add_dim();
      if (i < params.size() && !params[i].empty()) d->set_dim_param(params[i]);
      else d->set_dim_value(dims[i]);
    }
  }
  void output(const std::string& name) { g->add_output()->set_name(name); }
  void init_f32(const std::string& name, const std::vector<int64_t>& dims, const std::vector<float>& v) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(::onnx::TensorProto::FLOAT);
    for (int64_t d : dims) t->add_dims(d);
    for (float x : v) t->add_float_data(x);
  }
  void init_i64(const std::string& name, const std::vector<int64_t>& v) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(::onnx::TensorProto::INT64);
    t->add_dims(static_cast<int64_t>(v.size()));
    for (int64_t x : v) t->add_int64_data(x);
  }
  ::onnx::NodeProto* node(const std::string& op, const std::vector<std::string>& in,
                          const std::vector<std::string>& out, const std::string& name = "") {
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_name(name.empty() ? out.at(0) + "_node" : name);
    for (const auto& i : in) n->add_input(i);
    for (const auto& o : out) n->add_output(o);
    return n;
  }
  static void attr_int(::onnx::NodeProto* n, const std::string& name, int64_t v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto::INT);
    a->set_i(v);
  }
  kiln::onnx::Model import(const kiln::onnx::ImportOptions& o = {}) const {
    const std::string bytes = m.SerializeAsString();
    return kiln::onnx::import_bytes(bytes.data(), bytes.size(), o);
  }
};

std::vector<float> random_vector(size_t n, std::mt19937& rng) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<Array> run_cpu(const kiln::onnx::Model& model, const std::map<std::string, Array>& feeds) {
  auto exe = model.graph.compile(kiln::Device::cpu(), model.feed_shapes(), model.output_tensors());
  return exe.run(model.feeds(feeds));
}

TEST(OnnxImport, MlpMatchesFloat64Reference) {
  std::mt19937 rng(std::random_device{}());
  const int64_t n = 5, in = 7, hidden = 6, out = 4;
  const auto w1 = random_vector(hidden * in, rng), b1 = random_vector(hidden, rng);
  const auto w2 = random_vector(hidden * out, rng), x = random_vector(n * in, rng);
  ModelBuilder b;
  b.input("x", ::onnx::TensorProto::FLOAT, {n, in});
  b.init_f32("w1", {hidden, in}, w1);
  b.init_f32("b1", {hidden}, b1);
  b.init_f32("w2", {hidden, out}, w2);
  auto* gemm = b.node("Gemm", {"x", "w1", "b1"}, {"h"});
  ModelBuilder::attr_int(gemm, "transB", 1);
  b.node("Relu", {"h"}, {"r"});
  b.node("MatMul", {"r", "w2"}, {"logits"});
  auto* sm = b.node("Softmax", {"logits"}, {"y"});
  ModelBuilder::attr_int(sm, "axis", -1);
  b.output("y");
  auto model = b.import();
  EXPECT_EQ(model.parameter_count, hidden * in + hidden + hidden * out);
  EXPECT_EQ(model.op_histogram.at("Gemm"), 1);
  const auto y = run_cpu(model, {{"x", Array::from_vector(x, {n, in})}})[0].to_vector<float>();
  for (int64_t r = 0; r < n; ++r) {
    std::vector<double> logits(out, 0.0);
    for (int64_t j = 0; j < hidden; ++j) {
      double h = b1[j];
      for (int64_t k = 0; k < in; ++k) h += double(x[r * in + k]) * w1[j * in + k];
      h = std::max(h, 0.0);
      for (int64_t o = 0; o < out; ++o) logits[o] += h * w2[j * out + o];
    }
    double mx = *std::max_element(logits.begin(), logits.end()), z = 0;
    for (double l : logits) z += std::exp(l - mx);
    for (int64_t o = 0; o < out; ++o)
      EXPECT_NEAR(y[r * out + o], std::exp(logits[o] - mx) / z, 1e-5) << r << "," << o;
  }
}

// Shape -> Gather -> Unsqueeze -> Concat -> Reshape: folded while importing.
void add_flatten_by_shape(ModelBuilder& b) {
  b.init_i64("zero", {0});
  b.init_i64("minus_one", {-1});
  b.node("Shape", {"x"}, {"s"});
  auto* g = b.node("Gather", {"s", "zero"}, {"n"});
  ModelBuilder::attr_int(g, "axis", 0);
  auto* c = b.node("Concat", {"n", "minus_one"}, {"target"});
  ModelBuilder::attr_int(c, "axis", 0);
  b.node("Reshape", {"x", "target"}, {"y"});
  b.output("y");
}

TEST(OnnxImport, ShapeSubgraphFoldsWithStaticShapes) {
  ModelBuilder b;
  b.input("x", ::onnx::TensorProto::FLOAT, {2, 3, 4});
  add_flatten_by_shape(b);
  auto model = b.import();
  ASSERT_EQ(model.outputs.size(), 1u);
  EXPECT_EQ(model.outputs[0].shape, (kiln::Shape{2, 12}));
  std::mt19937 rng(1);
  const auto x = random_vector(24, rng);
  EXPECT_EQ(run_cpu(model, {{"x", Array::from_vector(x, {2, 3, 4})}})[0].to_vector<float>(), x);
}

TEST(OnnxImport, DimParamsTakeGivenShapesOrStayDynamic) {
  ModelBuilder b;
  b.input("x", ::onnx::TensorProto::FLOAT, {0, 3, 4}, {"batch"});
  add_flatten_by_shape(b);
  // the Shape subgraph of a dynamic dim is computed for each run's shapes
  auto dynamic = b.import();
  EXPECT_EQ(dynamic.outputs[0].shape, (kiln::Shape{-1, -1}));
  auto exe = dynamic.graph.compile(kiln::Device::cpu(), {}, dynamic.output_tensors());
  ASSERT_TRUE(exe.is_dynamic());
  std::mt19937 rng(2);
  for (int64_t n : {5, 1}) {
    const auto x = random_vector(n * 12, rng);
    auto out = exe.run(dynamic.feeds({{"x", Array::from_vector(x, {n, 3, 4})}}));
    ASSERT_EQ(out[0].shape(), (kiln::Shape{n, 12}));
    EXPECT_EQ(out[0].to_vector<float>(), x);
  }
  auto model = b.import({.input_shapes = {{"x", {5, 3, 4}}}});
  EXPECT_EQ(model.outputs[0].shape, (kiln::Shape{5, 12}));
  EXPECT_EQ(model.inputs[0].dim_params[0], "batch");
  auto fixed = b.import({.default_dim = 2});
  EXPECT_EQ(fixed.outputs[0].shape, (kiln::Shape{2, 12}));
  // a given shape must agree with the model's fixed dims
  EXPECT_THROW(b.import({.input_shapes = {{"x", {5, 3, 5}}}}), kiln::ShapeError);
  EXPECT_THROW(b.import({.input_shapes = {{"nope", {5, 3, 4}}}}), kiln::ValueError);
}

TEST(OnnxImport, OneErrorListsEveryUnsupportedOp) {
  ModelBuilder b;
  b.input("x", ::onnx::TensorProto::FLOAT, {2});
  b.node("FancyOp", {"x"}, {"a"}, "fancy_1");
  b.node("Relu", {"a"}, {"b"});
  b.node("FancyOp", {"b"}, {"c"}, "fancy_2");
  b.node("ImageDecoder", {"c"}, {"y"}, "decode_1");
  b.output("y");
  try {
    b.import();
    FAIL() << "imported";
  } catch (const kiln::UnsupportedError& e) {
    const std::string w = e.what();
    for (const char* s : {"FancyOp", "fancy_1", "fancy_2", "not an ONNX op", "ImageDecoder",
                          "decode_1", "opset 17"})
      EXPECT_NE(w.find(s), std::string::npos) << s << " missing from: " << w;
  }
}

TEST(OnnxImport, OpsetRange) {
  // before opset 7: an op imports where kiln maps its schema of then. Relu of opset 5 is Relu-1
  // (with consumed_inputs), which kiln does not map; Relu-6 is today's; Not never changed.
  {
    ModelBuilder b(5);
    b.input("x", ::onnx::TensorProto::FLOAT, {2});
    b.node("Relu", {"x"}, {"y"});
    b.output("y");
    try {
      b.import();
      ADD_FAILURE() << "Relu at opset 5 imported";
    } catch (const kiln::UnsupportedError& e) {
      EXPECT_NE(std::string(e.what()).find("Relu"), std::string::npos) << e.what();
    }
  }
  {
    ModelBuilder b(6);
    b.input("x", ::onnx::TensorProto::FLOAT, {2});
    b.node("Relu", {"x"}, {"y"});
    b.output("y");
    auto model = b.import();
    const auto y = run_cpu(model, {{"x", Array::from_vector<float>({-1.f, 2.f}, {2})}})[0];
    EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{0.f, 2.f}));
  }
  {
    ModelBuilder b(1);
    b.input("x", ::onnx::TensorProto::BOOL, {3});
    b.node("Not", {"x"}, {"y"});
    b.output("y");
    auto model = b.import();
    const auto x = Array::from_vector<float>({1.f, 0.f, 1.f}, {3}).astype(kiln::boolean);
    const auto y = run_cpu(model, {{"x", x}})[0].astype(kiln::f32);
    EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{0.f, 1.f, 0.f}));
  }
  // opset 23: Relu and Add did not change after 21, so the model imports
  ModelBuilder b(23);
  b.input("x", ::onnx::TensorProto::FLOAT, {2});
  b.node("Relu", {"x"}, {"r"});
  b.node("Add", {"r", "x"}, {"y"});
  b.output("y");
  auto model = b.import();
  const auto y = run_cpu(model, {{"x", Array::from_vector<float>({-1.f, 2.f}, {2})}})[0];
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{-1.f, 4.f}));
  EXPECT_TRUE(kiln::onnx::is_supported("Conv", 21));
  EXPECT_FALSE(kiln::onnx::is_supported("Conv", 6 - 6));
}

// BitCast (opset 26): the same bits as another type of that width; other widths and types kiln
// lacks fail, naming them
TEST(OnnxImport, BitCastKeepsTheBits) {
  auto model_to = [](int32_t from, int32_t to) {
    ModelBuilder b(26);
    b.input("x", from, {2, 3});
    ModelBuilder::attr_int(b.node("BitCast", {"x"}, {"y"}, "the_bitcast"), "to", to);
    b.output("y");
    return b;
  };
  std::mt19937 rng(3);
  const auto x = random_vector(6, rng);
  auto model = model_to(::onnx::TensorProto::FLOAT, ::onnx::TensorProto::INT32).import();
  const auto y = run_cpu(model, {{"x", Array::from_vector(x, {2, 3})}})[0];
  ASSERT_EQ(y.dtype(), kiln::i32);
  ASSERT_EQ(y.shape(), (kiln::Shape{2, 3}));
  const auto bits = y.to_vector<int32_t>();
  for (size_t k = 0; k < x.size(); ++k) {
    int32_t want = 0;
    std::memcpy(&want, &x[k], sizeof want);
    EXPECT_EQ(bits[k], want) << k;
  }
  try {
    model_to(::onnx::TensorProto::FLOAT, ::onnx::TensorProto::INT64).import();
    FAIL() << "imported";
  } catch (const kiln::DTypeError& e) {
    const std::string m = e.what();
    for (const char* part : {"the_bitcast", "[bitcast]", "f32", "i64"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " not in: " << m;
  }
  try {
    model_to(::onnx::TensorProto::INT64, ::onnx::TensorProto::COMPLEX64).import();
    FAIL() << "imported";
  } catch (const kiln::UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("COMPLEX64"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(kiln::onnx::is_supported("BitCast", 26));
  EXPECT_FALSE(kiln::onnx::is_supported("BitCast", 25));
}

TEST(OnnxImport, InputValuesFixInputsNeededWhileImporting) {
  ModelBuilder b(18);
  b.input("x", ::onnx::TensorProto::FLOAT, {3, 4});
  b.input("axes", ::onnx::TensorProto::INT64, {1});
  b.node("ReduceSum", {"x", "axes"}, {"y"});
  b.output("y");
  try {
    b.import();
    FAIL() << "imported";
  } catch (const kiln::UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("'axes'"), std::string::npos) << e.what();
  }
  auto model = b.import({.input_values = {{"axes", Array::from_vector<int64_t>({1}, {1})}}});
  ASSERT_EQ(model.inputs.size(), 1u);
  EXPECT_EQ(model.fixed_inputs, std::vector<std::string>{"axes"});
  std::mt19937 rng(2);
  const auto x = random_vector(12, rng);
  const auto y = run_cpu(model, {{"x", Array::from_vector(x, {3, 4})},
                                 {"axes", Array::from_vector<int64_t>({1}, {1})}})[0]
                     .to_vector<float>();
  for (int r = 0; r < 3; ++r)
    EXPECT_NEAR(y[r], double(x[r * 4]) + x[r * 4 + 1] + x[r * 4 + 2] + x[r * 4 + 3], 1e-5);
}

TEST(OnnxImport, ErrorsNameTheNode) {
  ModelBuilder b;
  b.input("x", ::onnx::TensorProto::FLOAT, {2, 3});
  b.input("z", ::onnx::TensorProto::FLOAT, {4, 5});
  b.node("Add", {"x", "z"}, {"y"}, "the_bad_add");
  b.output("y");
  try {
    b.import();
    FAIL() << "imported";
  } catch (const kiln::ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find("the_bad_add"), std::string::npos) << e.what();
  }
}

TEST(OnnxImport, FeedsAreChecked) {
  ModelBuilder b;
  b.input("x", ::onnx::TensorProto::FLOAT, {2, 3});
  b.node("Relu", {"x"}, {"y"});
  b.output("y");
  auto model = b.import();
  EXPECT_THROW(model.feeds({}), kiln::ValueError);
  EXPECT_THROW(model.feeds({{"x", Array::zeros({2, 4}, kiln::f32)}}), kiln::ShapeError);
  EXPECT_THROW(model.feeds({{"x", Array::zeros({2, 3}, kiln::f64)}}), kiln::DTypeError);
  EXPECT_THROW(model.feeds({{"x", Array::zeros({2, 3}, kiln::f32)}, {"w", Array::zeros({1}, kiln::f32)}}),
               kiln::ValueError);
}

TEST(OnnxImport, GraphsOutOfOrderAndBrokenReferences) {
  ModelBuilder b;
  b.input("x", ::onnx::TensorProto::FLOAT, {2});
  b.node("Relu", {"a"}, {"y"});  // reads a value produced below
  b.node("Neg", {"x"}, {"a"});
  b.output("y");
  auto model = b.import();
  EXPECT_EQ(run_cpu(model, {{"x", Array::from_vector<float>({1.f, -2.f}, {2})}})[0].to_vector<float>(),
            (std::vector<float>{0.f, 2.f}));
  ModelBuilder broken;
  broken.input("x", ::onnx::TensorProto::FLOAT, {2});
  broken.node("Relu", {"missing"}, {"y"});
  broken.output("y");
  EXPECT_THROW(broken.import(), kiln::FormatError);
  ModelBuilder cycle;
  cycle.input("x", ::onnx::TensorProto::FLOAT, {2});
  cycle.node("Add", {"x", "b"}, {"a"});
  cycle.node("Relu", {"a"}, {"b"});
  cycle.output("b");
  EXPECT_THROW(cycle.import(), kiln::FormatError);
}

// Sequences: a sequence input's elements become inputs "xs[k]" (ImportOptions::sequence_inputs),
// a sequence output's elements outputs "name[k]" (Model::graph_outputs groups them); Session runs
// them with run_values and refuses them in run.
TEST(OnnxImport, SequenceInputsAndOutputs) {
  ModelBuilder b(17);
  auto* xs = b.g->add_input();
  xs->set_name("xs");
  xs->mutable_type()
      ->mutable_sequence_type()
      ->mutable_elem_type()
      ->mutable_tensor_type()
      ->set_elem_type(::onnx::TensorProto::FLOAT);
  b.input("t", ::onnx::TensorProto::FLOAT, {2});
  b.node("SequenceInsert", {"xs", "t"}, {"ys"});
  b.node("ConcatFromSequence", {"ys"}, {"cat"});
  ModelBuilder::attr_int(b.g->mutable_node(1), "axis", 0);
  b.output("ys");
  b.output("cat");
  try {
    b.import();
    FAIL() << "imported";
  } catch (const kiln::onnx::InputValuesNeeded& e) {
    EXPECT_EQ(e.inputs, std::vector<std::string>{"xs"});
  }
  auto model = b.import({.sequence_inputs = {{"xs", {{3}, {1}}}}});
  ASSERT_EQ(model.inputs.size(), 3u);
  EXPECT_EQ(model.inputs[0].name, "xs[0]");
  EXPECT_EQ(model.inputs[1].sequence, "xs");
  ASSERT_EQ(model.graph_outputs.size(), 2u);
  EXPECT_TRUE(model.graph_outputs[0].sequence);
  EXPECT_EQ(model.graph_outputs[0].count, 3u);
  EXPECT_EQ(model.graph_outputs[1].first, 3u);
  std::mt19937 rng(std::random_device{}());
  const auto a = random_vector(3, rng), c = random_vector(1, rng), t = random_vector(2, rng);
  const std::vector<Array> out = run_cpu(model, {{"xs[0]", Array::from_vector(a, {3})},
                                                 {"xs[1]", Array::from_vector(c, {1})},
                                                 {"t", Array::from_vector(t, {2})}});
  ASSERT_EQ(out.size(), 4u);
  EXPECT_EQ(out[2].to_vector<float>(), t);
  EXPECT_EQ(out[3].to_vector<float>(), (std::vector<float>{a[0], a[1], a[2], c[0], t[0], t[1]}));

  const std::string bytes = b.m.SerializeAsString();
  const auto session = kiln::onnx::Session::from_bytes(bytes.data(), bytes.size());
  using kiln::onnx::Value;
  const std::vector<Value> got =
      session.run_values({{"xs", Value::of_sequence({Array::from_vector(c, {1})})},
                          {"t", Value::of(Array::from_vector(t, {2}))}});
  ASSERT_EQ(got.size(), 2u);
  ASSERT_TRUE(got[0].is_sequence);
  ASSERT_EQ(got[0].sequence.size(), 2u);
  EXPECT_EQ(got[0].sequence[0].to_vector<float>(), c);
  EXPECT_EQ(got[1].tensor.to_vector<float>(), (std::vector<float>{c[0], t[0], t[1]}));
  try {
    session.run({{"xs[0]", Array::from_vector(c, {1})}, {"t", Array::from_vector(t, {2})}});
    FAIL() << "ran";
  } catch (const kiln::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("run_values"), std::string::npos) << e.what();
  }
}

// Optional inputs: one given as absent (ImportOptions::absent_inputs) makes OptionalHasElement
// false while importing; a name that is no optional input is a ValueError.
TEST(OnnxImport, AbsentOptionalInputs) {
  ModelBuilder b(18);
  auto* x = b.g->add_input();
  x->set_name("x");
  auto* t = x->mutable_type()->mutable_optional_type()->mutable_elem_type()->mutable_tensor_type();
  t->set_elem_type(::onnx::TensorProto::FLOAT);
  t->mutable_shape()->add_dim()->set_dim_value(2);
  b.node("OptionalHasElement", {"x"}, {"has"});
  b.output("has");
  const Array yes = run_cpu(b.import(), {{"x", Array::zeros({2}, kiln::f32)}})[0];
  EXPECT_EQ(yes.to_vector<int64_t>(), std::vector<int64_t>{1});
  const auto model = b.import({.absent_inputs = {"x"}});
  EXPECT_TRUE(model.inputs.empty());
  EXPECT_EQ(run_cpu(model, {})[0].to_vector<int64_t>(), std::vector<int64_t>{0});
  EXPECT_THROW(b.import({.absent_inputs = {"nope"}}), kiln::ValueError);
}

// Unsigned initializers from their typed fields (UINT64 and UINT32 in uint64_data, UINT16 in
// int32_data) and unsigned arithmetic after a cast, against 64-bit unsigned arithmetic, with
// values past 2^63; a field that holds another count of values is a FormatError.
TEST(OnnxImport, UnsignedInitializersAndArithmetic) {
  std::mt19937_64 rng(std::random_device{}());
  std::vector<uint64_t> u = {1, uint64_t{1} << 63, ~uint64_t{0}, rng(), rng()};
  std::vector<uint32_t> x = {0, 7, 0xffffffffu, static_cast<uint32_t>(rng()),
                             static_cast<uint32_t>(rng())};
  const std::vector<uint16_t> h = {3, 65535, 0, 1, static_cast<uint16_t>(rng())};
  auto build = [&](int u_values) {
    ModelBuilder b(17);
    b.input("x", ::onnx::TensorProto::UINT32, {5});
    b.input("y", ::onnx::TensorProto::UINT16, {5});
    auto* ut = b.g->add_initializer();
    ut->set_name("u");
    ut->set_data_type(::onnx::TensorProto::UINT64);
    ut->add_dims(5);
    for (int i = 0; i < u_values; ++i) ut->add_uint64_data(u[static_cast<size_t>(i)]);
    auto* ht = b.g->add_initializer();
    ht->set_name("h");
    ht->set_data_type(::onnx::TensorProto::UINT16);
    ht->add_dims(5);
    for (uint16_t v : h) ht->add_int32_data(v);
    ModelBuilder::attr_int(b.node("Cast", {"x"}, {"c"}), "to", ::onnx::TensorProto::UINT64);
    b.node("Mul", {"c", "u"}, {"p"});
    b.node("Add", {"y", "h"}, {"s"});
    b.output("p");
    b.output("s");
    return b;
  };
  const std::vector<uint16_t> y = {1, 1, 65535, 9, 10};
  const auto got = run_cpu(build(5).import(),
                           {{"x", Array::from_vector(x, {5})}, {"y", Array::from_vector(y, {5})}});
  ASSERT_EQ(got[0].dtype(), kiln::u64);
  ASSERT_EQ(got[1].dtype(), kiln::u16);
  const auto p = got[0].to_vector<uint64_t>();
  const auto s = got[1].to_vector<uint16_t>();
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(p[i], uint64_t{x[i]} * u[i]) << i;  // (wrapping mod 2^64)
    EXPECT_EQ(s[i], static_cast<uint16_t>(y[i] + h[i])) << i;
  }
  EXPECT_THROW(build(4).import(), kiln::FormatError);
}

}  // namespace
