// Seeds of the package loader's fuzz target (tests/fuzz/package_corpus): small valid packages
// that between them use every section kind, attribute kind, slot kind and several ops.
// Regenerate with: kiln_package_tests --gtest_also_run_disabled_tests
// --gtest_filter=PackageCorpus.*
#include <filesystem>
#include <fstream>

#include "package/tuned_package.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

TEST(PackageCorpus, DISABLED_WriteFuzzSeeds) {
  const std::string dir = KILN_SOURCE_DIR "/tests/fuzz/package_corpus/";
  std::filesystem::create_directories(dir);
  {
    Graph g;
    auto x = g.placeholder({2, 3}, f32, "x");
    auto y = softmax(linear(
        relu(linear(x, g.constant(random_array({4, 3}, f32)), g.constant(random_array({4}, f32)))),
        g.constant(random_array({2, 4}, f32))));
    g.compile(Device::cpu(), {}, {y}).save(dir + "mlp.kiln");
  }
  {
    Graph g;
    auto x = g.placeholder({1, 2, 5, 5}, f32, "image");
    auto h = conv2d(x, g.constant(random_array({3, 2, 3, 3}, f32)),
                    g.constant(random_array({3}, f32)), {.padding = {1, 1}});
    h = max_pool(relu(h), {.kernel = {2, 2}});
    g.compile(Device::cpu(), {}, {reshape(global_avg_pool(h), {1, 3})}).save(dir + "conv.kiln");
  }
  {
    Graph g;
    auto x = g.placeholder({2, 4}, f32, "x");
    auto a = cast(leaky_relu(gelu(x, GeluApprox::tanh), 0.2), f64);
    auto [vals, idx] = topk(x, 2, 1);
    auto parts = split(x, 2, 1);
    g.compile(Device::cpu(), {},
              {sum(a, {1}, true), softmax(transpose(a, {1, 0}), 0), vals, idx, parts[1], x})
        .save(dir + "attrs_multi.kiln");
  }
  {
    Graph g;
    auto v = g.variable(random_array({3}, f32), "v");
    auto x = g.placeholder({3}, f32, "x");
    g.compile(Device::cpu(), {}, {add(x, v)}, {assign(v, mul(v, g.scalar(0.5)))})
        .save(dir + "variable.kiln");
  }
  {
    // a tuning section for CUDA (the fuzzer loads on the CPU, which checks and parses it)
    Graph g;
    auto x = g.placeholder({2, 3}, f32, "x");
    auto exe = g.compile(Device::cpu(), {}, {relu(x)});
    const auto bytes = save_with_tuning(exe, sample_identity(), sample_conv_records());
    std::ofstream out(dir + "tuned.kiln", std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  for (auto& e : std::filesystem::directory_iterator(dir))
    EXPECT_LT(std::filesystem::file_size(e.path()), 8192u) << e.path();
}

}  // namespace
}  // namespace kiln
