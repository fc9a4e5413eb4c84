// Loads the softshrink op library and checks the custom op against the built-in softshrink,
// values and gradients:
//   kiln_example_softshrink <path to the softshrink op library> [--device cpu|cuda]
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "kiln/custom_op.h"
#include "kiln/kiln.h"

using namespace kiln;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s <softshrink op library> [--device cpu|cuda]\n", argv[0]);
    return 2;
  }
  const bool cuda = argc >= 4 && !std::strcmp(argv[2], "--device") && !std::strcmp(argv[3], "cuda");
  try {
    load_op_library(argv[1]);
    const Device dev = cuda ? Device::cuda(0) : Device::cpu();
    Graph g;
    Tensor x = g.placeholder({1000, 17}, f32, "x");
    Tensor mine = custom_op1("my.softshrink", {x}, {{"lambda", 0.3}});
    Tensor ref = softshrink(x, 0.3);
    Tensor w = g.placeholder({1000, 17}, f32, "w");
    Tensor gm = gradients(sum(mine * w), {x})[0], gr = gradients(sum(ref * w), {x})[0];
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> d(-2, 2);
    std::vector<float> xv(17000), wv(17000);
    for (auto& v : xv) v = d(rng);
    for (auto& v : wv) v = d(rng);
    CompileOptions strict;
    strict.strict_placement = true;  // on cuda, the custom kernel must run there
    auto out = g.compile(dev, {}, {mine, ref, gm, gr}, strict)
                   .run({{x, Array::from_vector(xv, {1000, 17})},
                         {w, Array::from_vector(wv, {1000, 17})}});
    double dv = 0, dg = 0;
    for (int k = 0; k < 2; ++k) {
      const Array a = out[2 * k].to(Device::cpu()), b = out[2 * k + 1].to(Device::cpu());
      for (int64_t i = 0; i < a.numel(); ++i) {
        const double e = std::abs(double(a.data<float>()[i]) - b.data<float>()[i]);
        (k ? dg : dv) = std::max(k ? dg : dv, e);
      }
    }
    std::printf(
        "my.softshrink on %s against the built-in: max |diff| %.2e (values), %.2e "
        "(gradients)\n",
        dev.str().c_str(), dv, dg);
    if (dv > 1e-6 || dg > 1e-6) {
      std::fprintf(stderr, "FAILED\n");
      return 1;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
  return 0;
}
