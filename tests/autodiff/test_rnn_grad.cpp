// Gradients of lstm, gru and rnn (through rnn_grad) against central differences in float64, for
// every differentiable input: x, w, r, b, peepholes, h0 and c0; with lengths, both directions,
// two layers, clip and other activations. Tolerances: 1e-6 absolute + 1e-5 relative.
#include "kiln/ops/rnn.h"
#include "ops/rnn_cases.h"
#include "support/gradcheck.h"

namespace kiln {
namespace {
using namespace kiln::test;
using namespace kiln::rnn_test;

void check_grad(Cfg c, bool training = false) {
  SCOPED_TRACE(c.str() + (training ? " training" : ""));
  c.dtype = f64;
  c.T = 3;
  c.B = 3;
  c.I = 2;
  c.H = 2;
  const Data data = make_data(c);
  GradCheckOptions o;
  o.atol = 1e-6;
  o.rtol = 1e-5;
  check_gradients([&](Graph&, const std::vector<Tensor>& t) { return build(c, t, training); },
                  data.arrays, o);
}

TEST(LstmGrad, FiniteDifferences) {
  Cfg c;
  c.init = c.lens = true;
  check_grad(c);
  c.dir = RnnDirection::bidirectional;
  c.layers = 2;
  c.batch_first = true;
  check_grad(c, true);
  c.layers = 1;
  c.peep = true;
  c.clip = 0.8;
  c.dir = RnnDirection::reverse;
  check_grad(c);
  c.input_forget = true;
  c.acts = {RnnActivation{K::hard_sigmoid, 0.3, 0.45}, RnnActivation{K::scaled_tanh, 0.9, 1.3},
            RnnActivation{K::softsign}};
  check_grad(c);
}

TEST(GruGrad, FiniteDifferences) {
  for (bool lbr : {false, true}) {
    Cfg c;
    c.cell = RnnCell::gru;
    c.lbr = lbr;
    c.init = c.lens = true;
    c.dir = RnnDirection::bidirectional;
    check_grad(c);
    c.layers = 2;
    c.init = false;
    c.clip = 0.9;
    c.acts = {RnnActivation{K::leaky_relu, 0.1}, RnnActivation{K::elu, 0.8}};
    check_grad(c, true);
  }
}

TEST(RnnGrad, FiniteDifferences) {
  Cfg c;
  c.cell = RnnCell::rnn;
  c.init = c.lens = true;
  c.dir = RnnDirection::bidirectional;
  check_grad(c);
  c.layers = 2;
  c.acts = {RnnActivation{K::softplus}};
  c.batch_first = true;
  check_grad(c, true);
}

}  // namespace
}  // namespace kiln
