// y = relu(x * 2 - 1) on the CPU, checked against a loop.
#include <cmath>
#include <cstdio>
#include <kiln/kiln.h>

int main() {
  kiln::Graph g;
  auto x = g.placeholder({4}, kiln::f32, "x");
  auto y = kiln::relu(x * 2.0 - 1.0);
  auto exe = g.compile(kiln::Device::cpu(), {}, {y});
  std::vector<float> in = {-1.0f, 0.25f, 0.75f, 3.0f};
  auto out = exe.run({{x, kiln::Array::from_vector(in, {4})}})[0].to_vector<float>();
  for (size_t i = 0; i < in.size(); ++i)
    if (std::fabs(out[i] - std::max(0.0f, in[i] * 2 - 1)) > 1e-6f) return 1;
  std::printf("kiln %s: ok\n", kiln::version());
  return 0;
}
