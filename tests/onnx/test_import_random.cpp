// ONNX random ops (src/io/onnx/ops_random.cpp): RandomUniform/RandomNormal and their *Like forms,
// Bernoulli: shapes, dtypes, ranges, the seed attribute, and the same values on every import.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>

#include "kiln/executable.h"
#include "kiln/onnx.h"

namespace {

using kiln::Array;

::onnx::ModelProto model_with(const std::string& op, bool like, float seed, bool seeded) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("random");
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name("r");
  n->add_output("y");
  g->add_output()->set_name("y");
  auto attr_f = [&](const char* name, float v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto::FLOAT);
    a->set_f(v);
  };
  if (like) {
    n->add_input("x");
    auto* x = g->add_initializer();
    x->set_name("x");
    x->set_data_type(::onnx::TensorProto::FLOAT);
    x->add_dims(3);
    x->add_dims(333);
    for (int i = 0; i < 999; ++i) x->add_float_data(i % 3 == 0 ? 0.f : (i % 3 == 1 ? 1.f : 0.5f));
  } else {
    auto* a = n->add_attribute();
    a->set_name("shape");
    a->set_type(::onnx::AttributeProto::INTS);
    a->add_ints(3);
    a->add_ints(333);
  }
  if (op == "RandomUniform" || op == "RandomUniformLike") {
    attr_f("low", -2.f);
    attr_f("high", 3.f);
  }
  if (op == "RandomNormal" || op == "RandomNormalLike") {
    attr_f("mean", 10.f);
    attr_f("scale", 0.5f);
  }
  if (seeded) attr_f("seed", seed);
  return m;
}

std::vector<float> run(const ::onnx::ModelProto& m) {
  const std::string bytes = m.SerializeAsString();
  auto model = kiln::onnx::import_bytes(bytes.data(), bytes.size());
  auto exe = model.graph.compile(kiln::Device::cpu(), model.feed_shapes(), model.output_tensors());
  Array y = exe.run(model.feeds({}))[0];
  EXPECT_EQ(y.shape(), (kiln::Shape{3, 333}));
  Array f = y.astype(kiln::f32);
  const float* p = f.data<float>();
  return std::vector<float>(p, p + f.numel());
}

TEST(OnnxImportRandom, UniformAndNormalRangesAndSeeds) {
  for (bool like : {false, true}) {
    const auto u = run(model_with(like ? "RandomUniformLike" : "RandomUniform", like, 3, true));
    double mean = 0;
    for (float v : u) {
      ASSERT_TRUE(v >= -2 && v < 3) << v;
      mean += v / u.size();
    }
    EXPECT_NEAR(mean, 0.5, 0.2);
    // the same seed gives the same values; another seed others
    EXPECT_EQ(run(model_with(like ? "RandomUniformLike" : "RandomUniform", like, 3, true)), u);
    EXPECT_NE(run(model_with(like ? "RandomUniformLike" : "RandomUniform", like, 4, true)), u);
    const auto n = run(model_with(like ? "RandomNormalLike" : "RandomNormal", like, 0, false));
    mean = 0;
    for (float v : n) mean += v / n.size();
    EXPECT_NEAR(mean, 10, 0.1);
  }
}

TEST(OnnxImportRandom, BernoulliFollowsProbabilities) {
  const auto b = run(model_with("Bernoulli", true, 1, true));
  int halves = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    if (i % 3 == 0) EXPECT_EQ(b[i], 0) << i;  // p = 0
    if (i % 3 == 1) EXPECT_EQ(b[i], 1) << i;  // p = 1
    if (i % 3 == 2) halves += b[i] == 1;
  }
  EXPECT_GT(halves, 333 / 2 - 40);
  EXPECT_LT(halves, 333 / 2 + 40);
}

}  // namespace
