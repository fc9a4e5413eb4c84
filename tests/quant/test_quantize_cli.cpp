// `kiln quantize` on an ONNX model written here (conv, relu, residual add, global pool, Gemm)
// and on a kiln package, calibrated on a directory of .npy batches: the package it writes loads
// and runs close to the float model. Then the errors: a missing or empty directory, batches of
// the wrong shape or dtype.
#include <onnx/onnx_pb.h>
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "kiln/onnx.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
namespace fs = std::filesystem;

struct Result {
  int rc = -1;
  std::string out;  // stdout and stderr
};

Result shell(const std::string& cmd) {
  Result r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return r;
  char buf[4096];
  while (size_t n = fread(buf, 1, sizeof buf, p)) r.out.append(buf, n);
  const int status = pclose(p);
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

void add_f32(::onnx::GraphProto* g, const std::string& name, const Shape& dims, const Array& v) {
  auto* t = g->add_initializer();
  t->set_name(name);
  t->set_data_type(::onnx::TensorProto::FLOAT);
  for (int64_t d : dims) t->add_dims(d);
  for (float x : v.to_vector<float>()) t->add_float_data(x);
}

::onnx::NodeProto* add_node(::onnx::GraphProto* g, const std::string& op,
                            const std::vector<std::string>& in, const std::string& out) {
  auto* n = g->add_node();
  n->set_op_type(op);
  n->set_name(out);
  for (const auto& i : in) n->add_input(i);
  n->add_output(out);
  return n;
}

void attr_ints(::onnx::NodeProto* n, const std::string& name, const std::vector<int64_t>& v) {
  auto* a = n->add_attribute();
  a->set_name(name);
  a->set_type(::onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}

// x (N, 3, 8, 8) -> conv 8 -> relu -> conv 8 (+ the relu) -> relu -> global pool -> Gemm 4
std::string write_model(const fs::path& dir) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("kiln-test");
  m.add_opset_import()->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("cnn");
  auto* in = g->add_input();
  in->set_name("x");
  auto* tt = in->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(::onnx::TensorProto::FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_param("N");
  for (int64_t d : {3, 8, 8}) tt->mutable_shape()->add_dim()->set_dim_value(d);
  add_f32(g, "w1", {8, 3, 3, 3}, random_array({8, 3, 3, 3}, f32, -0.5, 0.5));
  add_f32(g, "b1", {8}, random_array({8}, f32, -0.1, 0.1));
  add_f32(g, "w2", {8, 8, 3, 3}, random_array({8, 8, 3, 3}, f32, -0.3, 0.3));
  add_f32(g, "b2", {8}, random_array({8}, f32, -0.1, 0.1));
  add_f32(g, "wf", {4, 8}, random_array({4, 8}, f32, -2, 2));
  add_f32(g, "bf", {4}, random_array({4}, f32, -0.1, 0.1));
  attr_ints(add_node(g, "Conv", {"x", "w1", "b1"}, "c1"), "pads", {1, 1, 1, 1});
  add_node(g, "Relu", {"c1"}, "r1");
  attr_ints(add_node(g, "Conv", {"r1", "w2", "b2"}, "c2"), "pads", {1, 1, 1, 1});
  add_node(g, "Add", {"c2", "r1"}, "s");
  add_node(g, "Relu", {"s"}, "r2");
  add_node(g, "GlobalAveragePool", {"r2"}, "p");
  add_node(g, "Flatten", {"p"}, "f");
  auto* gemm = add_node(g, "Gemm", {"f", "wf", "bf"}, "logits");
  auto* a = gemm->add_attribute();
  a->set_name("transB");
  a->set_type(::onnx::AttributeProto::INT);
  a->set_i(1);
  g->add_output()->set_name("logits");
  const std::string path = (dir / "model.onnx").string();
  std::ofstream(path, std::ios::binary) << m.SerializeAsString();
  return path;
}

class QuantizeCli : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(KILN_CLI)) GTEST_SKIP() << KILN_CLI << " is not there (a copied test binary)";
    dir_ = fs::temp_directory_path() /
           ("kiln_quantize_cli_" + std::to_string(seed()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    model_ = write_model(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }
  // A directory of `n` batches of shape `s` and dtype `t`.
  std::string batches(const std::string& name, int n, const Shape& s, DType t = f32) {
    const fs::path d = dir_ / name;
    fs::create_directories(d);
    for (int i = 0; i < n; ++i)
      random_array(s, t, -1, 1).save_npy((d / ("batch" + std::to_string(i) + ".npy")).string());
    return d.string();
  }
  Result quantize(const std::string& args) {
    return shell(std::string(KILN_CLI) + " quantize " + args);
  }
  std::vector<double> float_logits(const Array& x) {
    const onnx::Model m = onnx::import(model_);
    const Executable e =
        m.graph.compile(Device::cpu(), m.feed_shapes({{"x", x.shape()}}), m.output_tensors());
    return to_f64(e.run(m.feeds({{"x", x}}))[0]);
  }
  void expect_close_to_float(const std::string& package, const Shape& shape) {
    const Executable q = Executable::load(package, Device::cpu());
    ASSERT_EQ(q.inputs().size(), 1u);
    EXPECT_EQ(q.inputs()[0].name, "x");
    EXPECT_EQ(q.inputs()[0].shape, shape);
    EXPECT_EQ(q.package_info()->producer, "kiln quantize");
    const Array x = random_array(shape, f32, -1, 1);
    const auto a = float_logits(x), b = to_f64(q.run({{"x", x}})[0]);
    ASSERT_EQ(a.size(), b.size());
    double dot = 0, na = 0, nb = 0;
    for (size_t i = 0; i < a.size(); ++i) dot += a[i] * b[i], na += a[i] * a[i], nb += b[i] * b[i];
    EXPECT_GT(dot / std::sqrt(na * nb), 0.99);
  }
  fs::path dir_;
  std::string model_;
};

TEST_F(QuantizeCli, OnnxModelToPackage) {
  const std::string calib = batches("calib", 4, {2, 3, 8, 8});
  const std::string out = (dir_ / "model.int8.kiln").string();
  const Result r =
      quantize("'" + model_ + "' --calibrate '" + calib + "' --method entropy -o '" + out + "'");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("calibration: 4 batches"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ops: 2 quantized, 1 kept float"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("package size:"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("wrote " + out), std::string::npos) << r.out;
  expect_close_to_float(out, {1, 3, 8, 8});  // dims nothing fixes are 1, as kiln convert
  // --shape fixes the package's shape; calibration batches keep theirs
  const Result s =
      quantize("'" + model_ + "' --calibrate '" + calib +
               "' --method percentile --per-tensor --shape x=5,3,8,8 -o '" + out + "'");
  ASSERT_EQ(s.rc, 0) << s.out;
  expect_close_to_float(out, {5, 3, 8, 8});
}

TEST_F(QuantizeCli, PackageToPackage) {
  const onnx::Model m = onnx::import(model_);
  const std::string f32_package = (dir_ / "model.kiln").string();
  m.graph.compile(Device::cpu(), m.feed_shapes({{"x", {2, 3, 8, 8}}}), m.output_tensors())
      .save(f32_package, {"test", "", {"logits"}});
  const std::string out = (dir_ / "model.int8.kiln").string();
  const Result r = quantize("'" + f32_package + "' --calibrate '" +
                            batches("calib", 3, {2, 3, 8, 8}) + "' -o '" + out + "'");
  ASSERT_EQ(r.rc, 0) << r.out;
  expect_close_to_float(out, {2, 3, 8, 8});
  // a package's shapes are fixed
  const Result bad =
      quantize("'" + f32_package + "' --calibrate '" + batches("other", 2, {4, 3, 8, 8}) + "'");
  EXPECT_EQ(bad.rc, 1);
  EXPECT_NE(bad.out.find("has shape (4, 3, 8, 8), input 'x' takes (2, 3, 8, 8)"), std::string::npos)
      << bad.out;
}

TEST_F(QuantizeCli, Errors) {
  auto expect_error = [&](const std::string& args, const std::string& part) {
    const Result r = quantize(args);
    EXPECT_EQ(r.rc, 1) << args << ": " << r.out;
    EXPECT_NE(r.out.find("error: [quantize]"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find(part), std::string::npos) << "'" << r.out << "' lacks '" << part << "'";
  };
  const std::string m = "'" + model_ + "'";
  expect_error(m + " --calibrate '" + (dir_ / "missing").string() + "'", "does not exist");
  fs::create_directories(dir_ / "empty");
  expect_error(m + " --calibrate '" + (dir_ / "empty").string() + "'", "holds no .npy files");
  expect_error(m + " --calibrate '" + batches("wrong_shape", 2, {2, 3, 9, 9}) + "'",
               "has shape (2, 3, 9, 9), input 'x' takes (?, 3, 8, 8)");
  expect_error(m + " --calibrate '" + batches("wrong_dtype", 2, {2, 3, 8, 8}, f64) + "'",
               "has dtype f64, input 'x' takes f32");
  // batches of one input must share a shape
  const std::string mixed = batches("mixed", 1, {2, 3, 8, 8});
  random_array({3, 3, 8, 8}, f32).save_npy((fs::path(mixed) / "batch9.npy").string());
  expect_error(m + " --calibrate '" + mixed + "'", "every batch of an input must have one shape");
  expect_error(m + " --calibrate '" + batches("ok", 1, {2, 3, 8, 8}) + "' --method kl", "'kl'");
}

}  // namespace
}  // namespace kiln
