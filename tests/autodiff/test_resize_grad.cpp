// Gradient rule of resize (each resized dim's transposed weight matrix), checked by central
// differences for every mode, including extrapolated outputs and antialiasing.
#include "support/gradcheck.h"

namespace kiln {
namespace {
using namespace kiln::test;
using Ts = std::vector<Tensor>;

ResizeOptions options(ResizeMode m, ResizeCoordinates c) {
  ResizeOptions o;
  o.mode = m;
  o.coordinate_transformation_mode = c;
  return o;
}

TEST(ResizeGrad, NearestAndLinear) {
  check_gradients([](const Ts& x) { return resize(x[0], {2, 7, 3}, {}); },
                  {random_array({2, 4, 5}, f64)});
  check_gradients(
      [](const Ts& x) {
        return resize(x[0], {2, 7, 3}, options(ResizeMode::linear, ResizeCoordinates::half_pixel));
      },
      {random_array({2, 4, 5}, f64)});
  ResizeOptions o = options(ResizeMode::linear, ResizeCoordinates::align_corners);
  o.scales = {1, 1.7, 0.6};
  check_gradients([o](const Ts& x) { return resize(x[0], {3, 8, 3}, o); },
                  {random_array({3, 5, 6}, f64)});
}

TEST(ResizeGrad, CubicAntialiasAndExtrapolation) {
  ResizeOptions o = options(ResizeMode::cubic, ResizeCoordinates::half_pixel);
  o.exclude_outside = true;
  check_gradients([o](const Ts& x) { return resize(x[0], {9, 4}, o); },
                  {random_array({5, 6}, f64)});
  ResizeOptions aa = options(ResizeMode::linear, ResizeCoordinates::pytorch_half_pixel);
  aa.antialias = true;
  check_gradients([aa](const Ts& x) { return resize(x[0], {2, 3}, aa); },
                  {random_array({7, 9}, f64)});
  ResizeOptions crop = options(ResizeMode::linear, ResizeCoordinates::tf_crop_and_resize);
  crop.roi = {-0.3, 0.1, 1.2, 0.8};
  crop.extrapolation_value = 2;
  check_gradients([crop](const Ts& x) { return resize(x[0], {6, 5}, crop); },
                  {random_array({4, 5}, f64)});
}

}  // namespace
}  // namespace kiln
