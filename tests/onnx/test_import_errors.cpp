// The ONNX importer on malformed files and on external data: every bad input is an IoError or a
// FormatError (never a crash), and external data is read only from inside the model's directory.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "kiln/executable.h"
#include "kiln/onnx.h"

namespace fs = std::filesystem;

namespace {

// A fresh directory per test under the system temp dir, removed afterwards.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ =
        fs::temp_directory_path() / ("kiln_onnx_" + std::to_string(rd()) + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

void write_file(const fs::path& p, const std::string& bytes) {
  std::ofstream f(p, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string float_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

void add_tensor_value(onnx::ValueInfoProto* v, const std::string& name, std::vector<int64_t> dims) {
  v->set_name(name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  for (int64_t d : dims) tt->mutable_shape()->add_dim()->set_dim_value(d);
}

// Y = X + W with X, W of shape (2, 3); W is an initializer (in raw_data unless the caller moves
// it to external data).
onnx::ModelProto add_model(const std::vector<float>& w) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("kiln-test");
  auto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("add");
  auto* node = g->add_node();
  node->set_op_type("Add");
  node->add_input("X");
  node->add_input("W");
  node->add_output("Y");
  add_tensor_value(g->add_input(), "X", {2, 3});
  add_tensor_value(g->add_output(), "Y", {2, 3});
  auto* init = g->add_initializer();
  init->set_name("W");
  init->set_data_type(onnx::TensorProto::FLOAT);
  init->add_dims(2);
  init->add_dims(3);
  init->set_raw_data(float_bytes(w));
  return m;
}

const std::vector<float> kW = {0.5f, -1.25f, 2.0f, 3.5f, -0.75f, 1.125f};

// Moves W to external data at `location` (with optional offset and length).
onnx::ModelProto external_model(const std::string& location, int64_t offset = -1,
                                int64_t length = -1) {
  onnx::ModelProto m = add_model(kW);
  auto* init = m.mutable_graph()->mutable_initializer(0);
  init->clear_raw_data();
  init->set_data_location(onnx::TensorProto::EXTERNAL);
  auto add = [init](const std::string& k, const std::string& v) {
    auto* e = init->add_external_data();
    e->set_key(k);
    e->set_value(v);
  };
  add("location", location);
  if (offset >= 0) add("offset", std::to_string(offset));
  if (length >= 0) add("length", std::to_string(length));
  return m;
}

fs::path save_model(const fs::path& dir, const onnx::ModelProto& m) {
  fs::path p = dir / "model.onnx";
  write_file(p, m.SerializeAsString());
  return p;
}

bool is_io_or_format(const kiln::Error& e) {
  return dynamic_cast<const kiln::IoError*>(&e) || dynamic_cast<const kiln::FormatError*>(&e);
}

TEST(OnnxImportErrors, ValidModelImportsAndRuns) {
  const std::string bytes = add_model(kW).SerializeAsString();
  kiln::onnx::Model model = kiln::onnx::import_bytes(bytes.data(), bytes.size());
  ASSERT_EQ(model.inputs.size(), 1u);
  ASSERT_EQ(model.outputs.size(), 1u);
  EXPECT_EQ(model.opset, 17);
  EXPECT_EQ(model.parameter_count, 6);
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<float> x(6);
  for (float& v : x) v = d(rng);
  kiln::Executable exe =
      model.graph.compile(kiln::Device::cpu(), model.feed_shapes(), model.output_tensors());
  auto out = exe.run(model.feeds({{"X", kiln::Array::from_vector(x, {2, 3})}}));
  ASSERT_EQ(out.size(), 1u);
  auto y = out[0].to_vector<double>();
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(y[i], double(x[i]) + double(kW[i]), 1e-6) << i;
}

// An op of another domain maps only at an opset of that domain the model imports; the error
// names the domain and what the model imports of it.
TEST(OnnxImportErrors, OtherDomainOpsNeedTheirDomainsOpset) {
  for (int64_t version : {int64_t{0}, int64_t{1}, int64_t{3}}) {
    onnx::ModelProto m = add_model(kW);
    auto* node = m.mutable_graph()->mutable_node(0);
    node->set_op_type("Binarizer");
    node->set_domain("ai.onnx.ml");
    node->clear_input();
    node->add_input("X");
    if (version) {
      auto* ml = m.add_opset_import();
      ml->set_domain("ai.onnx.ml");
      ml->set_version(version);
    }
    const std::string bytes = m.SerializeAsString();
    if (version == 0) {
      try {
        kiln::onnx::import_bytes(bytes.data(), bytes.size());
        ADD_FAILURE() << "imported without the ai.onnx.ml opset";
      } catch (const kiln::UnsupportedError& e) {
        EXPECT_NE(std::string(e.what()).find("domain ai.onnx.ml, which the model does not import"),
                  std::string::npos)
            << e.what();
      }
      continue;
    }
    kiln::onnx::Model model = kiln::onnx::import_bytes(bytes.data(), bytes.size());
    kiln::Executable exe =
        model.graph.compile(kiln::Device::cpu(), model.feed_shapes(), model.output_tensors());
    const std::vector<float> x = {0.5f, 1.5f, -2.f, 0.f, 3.f, 0.25f};
    const auto y = exe.run(model.feeds({{"X", kiln::Array::from_vector(x, {2, 3})}}))[0];
    // (Binarizer's threshold defaults to 0: 1 where x > 0)
    EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{1, 1, 0, 0, 1, 1}));
  }
}

TEST(OnnxImportErrors, MissingFileIsIoError) {
  TempDir dir;
  EXPECT_THROW(kiln::onnx::import((dir.path() / "nothing.onnx").string()), kiln::IoError);
}

TEST(OnnxImportErrors, NonOnnxFileIsFormatError) {
  TempDir dir;
  write_file(dir.path() / "notes.onnx", "This is a text file, not a protobuf.\n");
  EXPECT_THROW(kiln::onnx::import((dir.path() / "notes.onnx").string()), kiln::FormatError);
  EXPECT_THROW(kiln::onnx::import_bytes("", 0), kiln::FormatError);
}

// Every prefix of a valid model either imports or throws IoError/FormatError; cutting inside
// the graph is a FormatError.
TEST(OnnxImportErrors, TruncatedBytes) {
  const std::string bytes = add_model(kW).SerializeAsString();
  for (size_t n = 0; n < bytes.size(); ++n) {
    try {
      kiln::onnx::import_bytes(bytes.data(), n);
    } catch (const kiln::Error& e) {
      EXPECT_TRUE(is_io_or_format(e)) << "prefix " << n << ": " << e.what();
    }
  }
  EXPECT_THROW(kiln::onnx::import_bytes(bytes.data(), bytes.size() / 2), kiln::FormatError);
}

// A file is parsed a chunk at a time: every prefix of a model file imports or throws
// IoError/FormatError (naming the file), and a model larger than one chunk (1 MiB; here 3 MiB of
// weights) imports from its file as from its bytes.
TEST(OnnxImportErrors, TruncatedFilesAndModelsOfSeveralChunks) {
  TempDir dir;
  const std::string bytes = add_model(kW).SerializeAsString();
  const fs::path p = dir.path() / "prefix.onnx";
  for (size_t n = 0; n < bytes.size(); ++n) {
    write_file(p, bytes.substr(0, n));
    try {
      kiln::onnx::import(p.string());
    } catch (const kiln::Error& e) {
      EXPECT_TRUE(is_io_or_format(e)) << "prefix " << n << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find("prefix.onnx"), std::string::npos) << e.what();
    }
  }
  write_file(p, bytes.substr(0, bytes.size() / 2));
  EXPECT_THROW(kiln::onnx::import(p.string()), kiln::FormatError);
  write_file(p, bytes + std::string(7, '\xff'));  // trailing bytes that do not parse
  EXPECT_THROW(kiln::onnx::import(p.string()), kiln::FormatError);

  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> d(-2.0f, 2.0f);
  std::vector<float> big(3 << 18);  // 3 MiB
  for (float& v : big) v = d(rng);
  onnx::ModelProto m = add_model(kW);
  for (auto* v : {m.mutable_graph()->mutable_input(0), m.mutable_graph()->mutable_output(0)})
    v->mutable_type()->mutable_tensor_type()->mutable_shape()->mutable_dim(1)->set_dim_value(
        static_cast<int64_t>(big.size() / 2));
  auto* init = m.mutable_graph()->mutable_initializer(0);
  init->set_dims(1, static_cast<int64_t>(big.size() / 2));
  init->set_raw_data(float_bytes(big));
  const std::string large = m.SerializeAsString();
  write_file(p, large);
  const kiln::onnx::Model from_file = kiln::onnx::import(p.string());
  const kiln::onnx::Model from_bytes = kiln::onnx::import_bytes(large.data(), large.size());
  EXPECT_EQ(from_file.parameter_count, static_cast<int64_t>(big.size()));
  std::vector<float> x(big.size());
  for (float& v : x) v = d(rng);
  const kiln::Array xa = kiln::Array::from_vector(x, {2, static_cast<int64_t>(big.size() / 2)});
  auto run = [&](const kiln::onnx::Model& model) {
    kiln::Executable exe =
        model.graph.compile(kiln::Device::cpu(), model.feed_shapes(), model.output_tensors());
    return exe.run(model.feeds({{"X", xa}}))[0].to_vector<float>();
  };
  const std::vector<float> y = run(from_file);
  EXPECT_EQ(y, run(from_bytes));
  for (size_t i = 0; i < y.size(); i += 4099) EXPECT_EQ(y[i], x[i] + big[i]) << i;
}

TEST(OnnxImportErrors, RandomBytes) {
  const uint32_t seed = std::random_device{}();
  std::mt19937 rng(seed);
  for (int trial = 0; trial < 200; ++trial) {
    std::string bytes(1 + rng() % 512, '\0');
    for (char& c : bytes) c = static_cast<char>(rng());
    try {
      kiln::onnx::import_bytes(bytes.data(), bytes.size());
      ADD_FAILURE() << "random bytes imported (seed " << seed << ", trial " << trial << ")";
    } catch (const kiln::Error& e) {
      EXPECT_TRUE(is_io_or_format(e)) << "seed " << seed << ", trial " << trial << ": " << e.what();
    }
  }
}

// Single bit flips of a valid model never crash: they import or throw a kiln::Error.
TEST(OnnxImportErrors, BitFlipsNeverCrash) {
  const std::string bytes = add_model(kW).SerializeAsString();
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit : {0, 3, 7}) {
      std::string b = bytes;
      b[i] = static_cast<char>(b[i] ^ (1 << bit));
      try {
        kiln::onnx::import_bytes(b.data(), b.size());
      } catch (const kiln::Error&) {
      }
    }
  }
}

// Runs the external-data model (Y = X + W) on the CPU and checks Y against X + kW.
void expect_adds_weights(kiln::onnx::Model& model) {
  const std::vector<float> x = {1.5f, -2.0f, 0.25f, 4.0f, -3.0f, 0.5f};
  kiln::Executable exe =
      model.graph.compile(kiln::Device::cpu(), model.feed_shapes(), model.output_tensors());
  auto y =
      exe.run(model.feeds({{"X", kiln::Array::from_vector(x, {2, 3})}}))[0].to_vector<double>();
  for (size_t i = 0; i < 6; ++i) EXPECT_NEAR(y[i], double(x[i]) + double(kW[i]), 1e-6) << i;
}

TEST(OnnxExternalData, ValidFileImportsWithItsValues) {
  TempDir dir;
  write_file(dir.path() / "weights.bin", std::string(16, 'x') + float_bytes(kW));
  const fs::path model_path = save_model(dir.path(), external_model("weights.bin", 16, 24));
  kiln::onnx::Model model = kiln::onnx::import(model_path.string());
  EXPECT_EQ(model.parameter_count, 6);
  expect_adds_weights(model);
}

TEST(OnnxExternalData, WholeFileWithoutOffsetOrLength) {
  TempDir dir;
  write_file(dir.path() / "w.bin", float_bytes(kW));
  kiln::onnx::Model model =
      kiln::onnx::import(save_model(dir.path(), external_model("w.bin")).string());
  EXPECT_EQ(model.parameter_bytes, 24);
}

TEST(OnnxExternalData, AbsoluteLocationIsIoError) {
  TempDir dir;
  const fs::path weights = dir.path() / "weights.bin";
  write_file(weights, float_bytes(kW));
  const fs::path p = save_model(dir.path(), external_model(weights.string()));
  EXPECT_THROW(kiln::onnx::import(p.string()), kiln::IoError);
}

TEST(OnnxExternalData, DotDotLocationIsIoError) {
  TempDir dir;
  fs::create_directories(dir.path() / "model");
  write_file(dir.path() / "outside.bin", float_bytes(kW));
  const fs::path p = save_model(dir.path() / "model", external_model("../outside.bin"));
  EXPECT_THROW(kiln::onnx::import(p.string()), kiln::IoError);
  const fs::path q = save_model(dir.path() / "model", external_model("sub/../../outside.bin"));
  EXPECT_THROW(kiln::onnx::import(q.string()), kiln::IoError);
}

TEST(OnnxExternalData, SymlinkOutsideTheDirectoryIsIoError) {
  TempDir dir;
  fs::create_directories(dir.path() / "model");
  write_file(dir.path() / "outside.bin", float_bytes(kW));
  fs::create_symlink(dir.path() / "outside.bin", dir.path() / "model" / "weights.bin");
  const fs::path p = save_model(dir.path() / "model", external_model("weights.bin"));
  EXPECT_THROW(kiln::onnx::import(p.string()), kiln::IoError);
}

TEST(OnnxExternalData, RangePastTheFileEndIsIoError) {
  TempDir dir;
  write_file(dir.path() / "weights.bin", float_bytes(kW));  // 24 bytes
  for (auto [offset, length] : {std::pair<int64_t, int64_t>{8, 24}, {0, 48}, {100, 24}, {32, -1}}) {
    const fs::path p = save_model(dir.path(), external_model("weights.bin", offset, length));
    EXPECT_THROW(kiln::onnx::import(p.string()), kiln::IoError)
        << "offset " << offset << " length " << length;
  }
}

TEST(OnnxExternalData, MissingFileIsIoError) {
  TempDir dir;
  const fs::path p = save_model(dir.path(), external_model("absent.bin"));
  EXPECT_THROW(kiln::onnx::import(p.string()), kiln::IoError);
}

TEST(OnnxExternalData, ImportBytesWithoutADirectoryIsIoError) {
  const std::string bytes = external_model("weights.bin").SerializeAsString();
  EXPECT_THROW(kiln::onnx::import_bytes(bytes.data(), bytes.size()), kiln::IoError);
}
// External data is read while importing, never mapped: a file truncated or deleted after the
// import cannot change or crash what was imported.
TEST(OnnxExternalData, FileTruncatedAfterImportStillRunsRight) {
  TempDir dir;
  write_file(dir.path() / "w.bin", float_bytes(kW));
  kiln::onnx::Model model =
      kiln::onnx::import(save_model(dir.path(), external_model("w.bin")).string());
  fs::resize_file(dir.path() / "w.bin", 0);
  fs::remove(dir.path() / "w.bin");
  expect_adds_weights(model);
}

// Another thread truncates the external data at a random moment of the import: the import gives
// an IoError, or the weights it read are the file's.
TEST(OnnxExternalData, FileTruncatedWhileImporting) {
  TempDir dir;
  constexpr size_t kPad = size_t{8} << 20;  // W at the end of 8 MiB: reading takes a while
  const std::string bytes = std::string(kPad, 'x') + float_bytes(kW);
  const fs::path model_path =
      save_model(dir.path(), external_model("w.bin", static_cast<int64_t>(kPad), 24));
  std::mt19937 rng(std::random_device{}());
  for (int round = 0; round < 12; ++round) {
    write_file(dir.path() / "w.bin", bytes);
    const auto delay = std::chrono::microseconds(std::uniform_int_distribution<int>(0, 2000)(rng));
    const uintmax_t cut = std::uniform_int_distribution<uintmax_t>(0, bytes.size() - 1)(rng);
    std::thread cutter([&] {
      std::this_thread::sleep_for(delay);
      std::error_code ec;
      fs::resize_file(dir.path() / "w.bin", cut, ec);
    });
    try {
      kiln::onnx::Model model = kiln::onnx::import(model_path.string());
      cutter.join();
      kiln::Executable exe =
          model.graph.compile(kiln::Device::cpu(), model.feed_shapes(), model.output_tensors());
      const std::vector<float> zeros(6, 0.0f);
      auto y = exe.run(model.feeds({{"X", kiln::Array::from_vector(zeros, {2, 3})}}))[0]
                   .to_vector<double>();
      for (size_t i = 0; i < 6; ++i) EXPECT_EQ(y[i], double(kW[i])) << i;
    } catch (const kiln::IoError&) {
      cutter.join();
    }
  }
}

// An input shape of more than 2^59 elements (its element count overflows, or no memory holds it)
// is refused at import (an Expand computing one: tests/cli/crash_matrix.py).
TEST(OnnxImportErrors, ShapesPastTwoToThe59ElementsAreFormatErrors) {
  for (const std::vector<int64_t>& dims : {std::vector<int64_t>{int64_t{1} << 31, int64_t{1} << 31},
                                           std::vector<int64_t>{999999999999, 999999999999},
                                           std::vector<int64_t>{0, int64_t{1} << 62, 4}}) {
    onnx::ModelProto m = add_model(kW);
    auto* g = m.mutable_graph();
    g->clear_input();
    add_tensor_value(g->add_input(), "X", dims);
    const std::string bytes = m.SerializeAsString();
    try {
      kiln::onnx::import_bytes(bytes.data(), bytes.size());
      ADD_FAILURE() << "imported an input of " << dims.size() << " dims";
    } catch (const kiln::FormatError& e) {
      EXPECT_NE(std::string(e.what()).find("2^59"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
