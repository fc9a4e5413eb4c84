// lstm, gru and rnn against PyTorch's nn.LSTM / nn.GRU / nn.RNN: forward outputs and the
// gradients of every input and parameter, from golden data that tests/data/rnn/make_golden.py
// writes (into tests/data/rnn/golden). Skips while that data is missing.
// Tolerances: f64 1e-9 relative + absolute; f32 1e-4 relative + 1e-5 absolute.
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kiln/ops/rnn.h"
#include "support/reference.h"

#ifndef KILN_RNN_GOLDEN_DIR
#error "KILN_RNN_GOLDEN_DIR must point at tests/data/rnn/golden"
#endif

namespace kiln {
namespace {
using namespace kiln::test;

std::string golden_dir() {
  // KILN_TEST_DATA_DIR in the environment wins (suites run from a copied build elsewhere)
  const char* env = std::getenv("KILN_TEST_DATA_DIR");
  return env ? std::string(env) + "/rnn/golden" : std::string(KILN_RNN_GOLDEN_DIR);
}

struct GoldenCase {
  std::string name, cell, dtype;
  int layers = 1, bidi = 0, bf = 0, init = 0;
  int64_t T = 0, B = 0, I = 0, H = 0;
};

TEST(RnnTorchGolden, MatchesPyTorch) {
  const std::string dir = golden_dir();
  std::ifstream list(dir + "/cases.txt");
  if (!list)
    GTEST_SKIP() << "no golden data in " << dir << " (run tests/data/rnn/make_golden.py " << dir
                 << " where torch is installed)";
  std::string line;
  int n = 0;
  while (std::getline(list, line)) {
    if (line.empty()) continue;
    std::istringstream in(line);
    GoldenCase c;
    in >> c.name >> c.cell >> c.layers >> c.bidi >> c.bf >> c.init >> c.dtype >> c.T >> c.B >>
        c.I >> c.H;
    SCOPED_TRACE(c.name);
    ++n;
    auto load = [&](const std::string& key) {
      return Array::load_npy(dir + "/" + c.name + "_" + key + ".npy");
    };
    const RnnCell cell = c.cell == "lstm"  ? RnnCell::lstm
                         : c.cell == "gru" ? RnnCell::gru
                                           : RnnCell::rnn;
    Graph g;
    std::vector<Tensor> wrt;
    std::vector<std::string> names;
    auto input = [&](const std::string& key) {
      Tensor t = g.constant(load(key));
      wrt.push_back(t);
      names.push_back(key);
      return t;
    };
    Tensor x = input("x");
    std::optional<Tensor> h0, c0;
    if (c.init) {
      h0 = input("h0");
      if (cell == RnnCell::lstm) c0 = input("c0");
    }
    std::vector<RnnLayerWeights> layers;
    for (int l = 0; l < c.layers; ++l) {
      std::vector<Tensor> wih, whh, bih, bhh;
      for (int d = 0; d < (c.bidi ? 2 : 1); ++d) {
        const std::string sfx = fmt::format("_l{}{}", l, d ? "_reverse" : "");
        wih.push_back(input("weight_ih" + sfx));
        whh.push_back(input("weight_hh" + sfx));
        bih.push_back(input("bias_ih" + sfx));
        bhh.push_back(input("bias_hh" + sfx));
      }
      layers.push_back(torch_rnn_weights(cell, wih, whh, bih, bhh));
    }
    RnnOptions o;
    o.direction = c.bidi ? RnnDirection::bidirectional : RnnDirection::forward;
    o.batch_first = c.bf;
    o.linear_before_reset = true;  // PyTorch's GRU
    RnnResult r = cell == RnnCell::lstm  ? lstm(x, layers, h0, c0, std::nullopt, o)
                  : cell == RnnCell::gru ? gru(x, layers, h0, std::nullopt, o)
                                         : rnn(x, layers, h0, std::nullopt, o);
    const Shape ys = r.y.shape();
    Tensor y = reshape(r.y, {ys[0], ys[1], ys[2] * ys[3]});
    Tensor loss = sum(y * g.constant(load("dy"))) + sum(r.h * g.constant(load("dhn")));
    if (r.c) loss = loss + sum(*r.c * g.constant(load("dcn")));
    std::vector<Tensor> targets{y, r.h};
    if (r.c) targets.push_back(*r.c);
    const size_t n_out = targets.size();
    for (const Tensor& gr : gradients(loss, wrt)) targets.push_back(gr);
    const auto got = eval(g, targets, {}, {.optimize = false});
    const double rtol = c.dtype == "f64" ? 1e-9 : 1e-4, atol = c.dtype == "f64" ? 1e-9 : 1e-5;
    auto expect = [&](const Array& a, const std::string& key) {
      SCOPED_TRACE(key);
      const Array want = load(key);
      expect_close(a, want.shape(), to_f64(want), rtol, atol);
    };
    expect(got[0], "y");
    expect(got[1], "hn");
    if (r.c) expect(got[2], "cn");
    for (size_t i = 0; i < names.size(); ++i) expect(got[n_out + i], "grad_" + names[i]);
  }
  EXPECT_GT(n, 0) << dir << "/cases.txt lists no case";
}

}  // namespace
}  // namespace kiln
