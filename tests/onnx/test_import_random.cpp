// ONNX random ops (src/io/onnx/ops_random.cpp): RandomUniform/RandomNormal and their *Like forms,
// Bernoulli: shapes, dtypes, ranges, the seed attribute, and the same values on every import;
// Dropout in training mode.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <cmath>

#include "kiln/error.h"
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

// Dropout (opset 13) over x (3 x 333, values 1 + i / 999) with ratio and training_mode given as
// initializers, outputs y and mask; `seed` set unless negative.
::onnx::ModelProto dropout_model(float ratio, bool training, int64_t seed) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(13);
  auto* g = m.mutable_graph();
  g->set_name("dropout");
  auto* n = g->add_node();
  n->set_op_type("Dropout");
  n->set_name("d");
  for (const char* in : {"x", "ratio", "training"}) n->add_input(in);
  n->add_output("y");
  n->add_output("mask");
  g->add_output()->set_name("y");
  g->add_output()->set_name("mask");
  if (seed >= 0) {
    auto* a = n->add_attribute();
    a->set_name("seed");
    a->set_type(::onnx::AttributeProto::INT);
    a->set_i(seed);
  }
  auto* x = g->add_initializer();
  x->set_name("x");
  x->set_data_type(::onnx::TensorProto::FLOAT);
  x->add_dims(3);
  x->add_dims(333);
  for (int i = 0; i < 999; ++i) x->add_float_data(1.f + static_cast<float>(i) / 999);
  auto* r = g->add_initializer();
  r->set_name("ratio");
  r->set_data_type(::onnx::TensorProto::FLOAT);
  r->add_float_data(ratio);
  auto* t = g->add_initializer();
  t->set_name("training");
  t->set_data_type(::onnx::TensorProto::BOOL);
  t->add_int32_data(training ? 1 : 0);
  return m;
}

// y and the mask as floats
std::pair<std::vector<float>, std::vector<float>> run_dropout(const ::onnx::ModelProto& m) {
  const std::string bytes = m.SerializeAsString();
  auto model = kiln::onnx::import_bytes(bytes.data(), bytes.size());
  auto exe = model.graph.compile(kiln::Device::cpu(), model.feed_shapes(), model.output_tensors());
  const auto out = exe.run(model.feeds({}));
  EXPECT_EQ(out.at(1).dtype(), kiln::boolean);
  Array y = out.at(0).astype(kiln::f32), mask = out.at(1).astype(kiln::f32);
  return {std::vector<float>(y.data<float>(), y.data<float>() + y.numel()),
          std::vector<float>(mask.data<float>(), mask.data<float>() + mask.numel())};
}

// Training mode keeps about 1 - ratio of the elements, scaled by 1 / (1 - ratio), the mask true
// exactly there; the same seed gives the same draws, another seed others; ratio 0 or inference is
// the identity with an all-true mask, ratio 1 drops everything, a ratio outside [0, 1] fails.
TEST(OnnxImportRandom, DropoutInTrainingModeDrawsItsMask) {
  const auto [y, mask] = run_dropout(dropout_model(0.3f, true, 7));
  ASSERT_EQ(y.size(), 999u);
  int kept = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const float x = 1.f + static_cast<float>(i) / 999;
    if (mask[i] != 0) {
      ++kept;
      EXPECT_NEAR(y[i], x / 0.7f, 1e-5) << i;
    } else {
      EXPECT_EQ(y[i], 0) << i;
    }
  }
  // 999 draws at 0.7: a standard deviation of 14.5, so within five of them
  EXPECT_NEAR(kept, 699.3, 73);
  EXPECT_EQ(run_dropout(dropout_model(0.3f, true, 7)).second, mask);
  EXPECT_NE(run_dropout(dropout_model(0.3f, true, 8)).second, mask);
  EXPECT_EQ(run_dropout(dropout_model(0.3f, true, -1)).second,
            run_dropout(dropout_model(0.3f, true, -1)).second);
  for (const auto& [r, training] : {std::pair{0.f, true}, std::pair{0.3f, false}}) {
    const auto [yi, mi] = run_dropout(dropout_model(r, training, 7));
    for (size_t i = 0; i < yi.size(); ++i) {
      EXPECT_EQ(yi[i], 1.f + static_cast<float>(i) / 999) << i;
      EXPECT_EQ(mi[i], 1) << i;
    }
  }
  const auto [y1, m1] = run_dropout(dropout_model(1.f, true, 7));
  for (size_t i = 0; i < y1.size(); ++i) EXPECT_TRUE(y1[i] == 0 && m1[i] == 0) << i;
  const std::string bad = dropout_model(1.5f, true, 7).SerializeAsString();
  EXPECT_THROW(kiln::onnx::import_bytes(bad.data(), bad.size()), kiln::ValueError);
}

}  // namespace
