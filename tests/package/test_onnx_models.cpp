// Every model of the ONNX model tests (tests/data/onnx_models): import, compile for the CPU (and
// for cuda:0 when there is a GPU), save, load, and run both on the same random inputs: the
// outputs agree bit for bit.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "kiln/onnx.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

class PackageOnnxModel : public testing::TestWithParam<std::string> {};

TEST_P(PackageOnnxModel, RoundTripIsBitIdentical) {
  const std::string dir = KILN_SOURCE_DIR "/tests/data/onnx_models/" + GetParam();
  onnx::ImportOptions opts;
  opts.default_dim = 2;  // batch and sequence dims
  onnx::Model m;
  try {
    m = onnx::import(dir + "/model.onnx", opts);
  } catch (const UnsupportedError& e) {
    GTEST_SKIP() << "the importer does not take this model yet: " << e.what();
  }
  std::vector<Device> devices{Device::cpu()};
  if (cuda_device_count() > 0) devices.push_back(Device::cuda(0));
  for (const Device d : devices) {
    SCOPED_TRACE(d.str());
    Executable exe = m.graph.compile(d, m.feed_shapes(), m.output_tensors());
    std::map<std::string, Array> feeds;
    for (const auto& in : exe.inputs())
      feeds[in.name] = is_floating(in.dtype) ? random_array(in.shape, in.dtype)
                                             : random_ints(in.shape, 0, 1, in.dtype);
    const std::string path = testing::TempDir() + "kiln_pkg_onnx_" + std::to_string(::getpid()) +
                             "_" + GetParam() + ".kiln";
    exe.save(path, {.producer = "kiln tests", .source_hash = GetParam()});
    Executable loaded = Executable::load(path, d);
    std::filesystem::remove(path);
    const auto want = exe.run(feeds), got = loaded.run(feeds);
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < want.size(); ++k) {
      ASSERT_EQ(got[k].shape(), want[k].shape()) << "output " << k;
      ASSERT_EQ(got[k].dtype(), want[k].dtype()) << "output " << k;
      const Array g = got[k].to(Device::cpu()), w = want[k].to(Device::cpu());
      EXPECT_EQ(std::memcmp(g.data(), w.data(), w.nbytes()), 0) << "output " << k;
    }
    EXPECT_EQ(loaded.num_steps(), exe.num_steps());
  }
}

std::vector<std::string> models() {
  std::vector<std::string> r;
  for (auto& e : std::filesystem::directory_iterator(KILN_SOURCE_DIR "/tests/data/onnx_models"))
    if (std::filesystem::exists(e.path() / "model.onnx")) r.push_back(e.path().filename().string());
  std::sort(r.begin(), r.end());
  return r;
}

INSTANTIATE_TEST_SUITE_P(Models, PackageOnnxModel, testing::ValuesIn(models()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kiln
