// ONNX's packed 4- and 2-bit types and float8e8m0 (src/io/onnx/tensor.cpp, ops_elementwise.cpp,
// ops_quant.cpp): initializers packed in raw_data and in int32_data, odd counts included, read
// one element a byte; a wrong byte count refused; Cast's round_mode; QuantizeLinear and
// DequantizeLinear to and from int4/uint2 against a float64 reference (round half to even, zero
// point, saturation); BitCast between widths refused. And ai.onnx.ml's TreeEnsemble against a
// recursive walk of its trees.
#include <gtest/gtest.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kiln/error.h"
#include "kiln/executable.h"
#include "kiln/onnx.h"

namespace {

using kiln::Array;
using TP = ::onnx::TensorProto;
constexpr int kUint4 = 21, kInt4 = 22, kFloat4 = 23, kE8M0 = 24, kUint2 = 25, kInt2 = 26;

struct Model {
  ::onnx::ModelProto m;
  ::onnx::GraphProto* g;
  explicit Model(int opset) {
    m.set_ir_version(11);
    m.add_opset_import()->set_version(opset);
    g = m.mutable_graph();
    g->set_name("narrow");
  }
  ::onnx::NodeProto* node(const std::string& op, std::vector<std::string> in,
                          const std::string& out) {
    auto* n = g->add_node();
    n->set_op_type(op);
    n->set_name(out);
    for (auto& i : in) n->add_input(i);
    n->add_output(out);
    return n;
  }
  static void attr_int(::onnx::NodeProto* n, const char* name, int64_t v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void attr_str(::onnx::NodeProto* n, const char* name, const std::string& v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto::STRING);
    a->set_s(v);
  }
  void input(const std::string& name, int type, std::vector<int64_t> dims) {
    auto* v = g->add_input();
    v->set_name(name);
    auto* t = v->mutable_type()->mutable_tensor_type();
    t->set_elem_type(type);
    for (int64_t d : dims) t->mutable_shape()->add_dim()->set_dim_value(d);
  }
  // A packed initializer of `codes` (each below 2^bits), in raw_data or int32_data.
  void packed(const std::string& name, int type, int bits, const std::vector<int>& codes, bool raw,
              int drop_bytes = 0) {
    auto* t = g->add_initializer();
    t->set_name(name);
    t->set_data_type(type);
    t->add_dims(static_cast<int64_t>(codes.size()));
    std::vector<uint8_t> bytes((codes.size() * static_cast<size_t>(bits) + 7) / 8, 0);
    for (size_t i = 0; i < codes.size(); ++i)
      bytes[i * bits / 8] |= static_cast<uint8_t>(codes[i] << (i * bits % 8));
    bytes.resize(bytes.size() - static_cast<size_t>(drop_bytes));
    if (raw) t->set_raw_data(std::string(bytes.begin(), bytes.end()));
    else
      for (uint8_t b : bytes) t->add_int32_data(b);
  }
  std::vector<Array> run(const std::vector<std::pair<std::string, Array>>& feeds = {}) const {
    const std::string bytes = m.SerializeAsString();
    auto model = kiln::onnx::import_bytes(bytes.data(), bytes.size());
    std::map<std::string, Array> by_name(feeds.begin(), feeds.end());
    auto exe =
        model.graph.compile(kiln::Device::cpu(), model.feed_shapes(), model.output_tensors());
    return exe.run(model.feeds(by_name));
  }
  void output(const std::string& name) { g->add_output()->set_name(name); }
};

double int_value(int code, int bits, bool is_signed) {
  return is_signed && code >= (1 << (bits - 1)) ? code - (1 << bits) : code;
}
double e2m1_value(int code) {
  const int e = (code >> 1) & 3, m = code & 1;
  const double v = e == 0 ? m * 0.5 : std::ldexp(1 + m / 2.0, e - 1);
  return code & 8 ? -v : v;
}

TEST(OnnxImportNarrow, PackedInitializersReadOneElementAByte) {
  std::mt19937 rng(std::random_device{}());
  struct Kind {
    int type, bits;
    bool is_signed, real;
  };
  const Kind kinds[] = {{kInt4, 4, true, false},
                        {kUint4, 4, false, false},
                        {kFloat4, 4, true, true},
                        {kInt2, 2, true, false},
                        {kUint2, 2, false, false}};
  for (const Kind& k : kinds) {
    for (bool raw : {true, false}) {
      for (int n : {1, 7, 9, 64}) {  // (odd counts leave a partly used last byte)
        SCOPED_TRACE(::testing::Message() << "type " << k.type << " n " << n << " raw " << raw);
        std::vector<int> codes(static_cast<size_t>(n));
        for (int& c : codes) c = static_cast<int>(rng() % (1u << k.bits));
        Model m(21);
        m.packed("w", k.type, k.bits, codes, raw);
        Model::attr_int(m.node("Cast", {"w"}, "y"), "to", TP::DOUBLE);
        m.output("y");
        const std::vector<double> y = m.run()[0].to_vector<double>();
        ASSERT_EQ(y.size(), codes.size());
        for (size_t i = 0; i < codes.size(); ++i)
          EXPECT_EQ(y[i], k.real ? e2m1_value(codes[i]) : int_value(codes[i], k.bits, k.is_signed))
              << i;
        Model bad(21);
        bad.packed("w", k.type, k.bits, codes, raw, 1);
        Model::attr_int(bad.node("Cast", {"w"}, "y"), "to", TP::FLOAT);
        bad.output("y");
        EXPECT_THROW(bad.run(), kiln::FormatError);
      }
    }
  }
}

// float8e8m0: its codes in int32_data; Cast to it in each round_mode, saturating or not.
TEST(OnnxImportNarrow, CastRoundModesToFloat8E8M0) {
  const std::vector<float> x = {1.0f, 1.25f, 1.5f, 1.75f, 3.0f, 0.3f, 3e38f, 5e-39f};
  // the codes by hand: 2^e with e from the f32 exponent, rounded as the mode says
  // (5e-39 is an f32 subnormal: code 0's 2^-127 or, rounding up, 2^-126)
  const std::vector<int> up = {127, 128, 128, 128, 129, 126, 254, 1};
  const std::vector<int> up_wrap = {127, 128, 128, 128, 129, 126, 255, 1};
  const std::vector<int> down = {127, 127, 127, 127, 128, 125, 254, 0};
  const std::vector<int> nearest = {127, 127, 128, 128, 129, 125, 254, 0};
  const std::pair<std::string, int> modes[] = {{"up", 1}, {"up", 0}, {"down", 1}, {"nearest", 1}};
  const std::vector<int>* want[] = {&up, &up_wrap, &down, &nearest};
  for (int k = 0; k < 4; ++k) {
    SCOPED_TRACE(modes[k].first + (modes[k].second ? "" : " not saturating"));
    Model m(24);
    m.input("x", TP::FLOAT, {static_cast<int64_t>(x.size())});
    auto* n = m.node("Cast", {"x"}, "y");
    Model::attr_int(n, "to", kE8M0);
    Model::attr_int(n, "saturate", modes[k].second);
    Model::attr_str(n, "round_mode", modes[k].first);
    m.output("y");
    const Array y = m.run({{"x", Array::from_vector(x, {static_cast<int64_t>(x.size())})}})[0];
    ASSERT_EQ(y.dtype(), kiln::f8e8m0fnu);
    const auto* codes = static_cast<const uint8_t*>(y.data());
    for (size_t i = 0; i < x.size(); ++i) EXPECT_EQ(codes[i], (*want[k])[i]) << x[i];
  }
  Model bad(24);
  bad.input("x", TP::FLOAT, {2});
  auto* n = bad.node("Cast", {"x"}, "y");
  Model::attr_int(n, "to", kE8M0);
  Model::attr_str(n, "round_mode", "sideways");
  bad.output("y");
  try {
    bad.run({{"x", Array::from_vector(std::vector<float>{1, 2}, {2})}});
    ADD_FAILURE() << "a bad round_mode imported";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("round_mode"), std::string::npos) << e.what();
  }
}

// QuantizeLinear to int4 / uint2 per axis with a zero point, and back, against float64.
TEST(OnnxImportNarrow, QuantizeAndDequantizeSubByteIntegers) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> dist(-12.f, 12.f);
  for (const auto& [type, bits, is_signed] :
       {std::tuple{kInt4, 4, true}, std::tuple{kUint2, 2, false}}) {
    SCOPED_TRACE(type);
    const int64_t rows = 3, cols = 9;
    std::vector<float> x(static_cast<size_t>(rows * cols));
    for (float& v : x) v = dist(rng);
    x[0] = 2.5f, x[1] = -3.5f;  // (ties to even: the scale of row 0 is 1)
    const std::vector<float> scale = {1.0f, 0.75f, 2.0f};
    const std::vector<int> zp_codes = {is_signed ? 15 : 1, 2, 0};  // (-1, 2, 0 for int4)
    Model m(21);
    m.input("x", TP::FLOAT, {rows, cols});
    auto* s = m.g->add_initializer();
    s->set_name("s");
    s->set_data_type(TP::FLOAT);
    s->add_dims(rows);
    for (float v : scale) s->add_float_data(v);
    m.packed("z", type, bits, zp_codes, false);
    Model::attr_int(m.node("QuantizeLinear", {"x", "s", "z"}, "q"), "axis", 0);
    Model::attr_int(m.node("DequantizeLinear", {"q", "s", "z"}, "d"), "axis", 0);
    m.output("q");
    m.output("d");
    const auto out = m.run({{"x", Array::from_vector(x, {rows, cols})}});
    const std::vector<double> q = out[0].astype(kiln::f64).to_vector<double>();
    const std::vector<double> d = out[1].to_vector<double>();
    const double lo = is_signed ? -(1 << (bits - 1)) : 0;
    const double hi = is_signed ? (1 << (bits - 1)) - 1 : (1 << bits) - 1;
    for (int64_t r = 0; r < rows; ++r) {
      const double z = int_value(zp_codes[static_cast<size_t>(r)], bits, is_signed);
      for (int64_t c = 0; c < cols; ++c) {
        const size_t i = static_cast<size_t>(r * cols + c);
        const double v = static_cast<double>(x[i]) / scale[static_cast<size_t>(r)];
        const double want = std::min(hi, std::max(lo, std::nearbyint(v) + z));
        EXPECT_EQ(q[i], want) << r << "," << c << " x " << x[i];
        EXPECT_DOUBLE_EQ(d[i], (want - z) * scale[static_cast<size_t>(r)]) << r << "," << c;
      }
    }
  }
}

TEST(OnnxImportNarrow, BitCastKeepsPackedWidths) {
  Model m(26);
  m.packed("w", kInt4, 4, {1, 2}, true);
  Model::attr_int(m.node("BitCast", {"w"}, "y"), "to", TP::INT8);
  m.output("y");
  try {
    m.run();
    ADD_FAILURE() << "an int4 to int8 bit cast imported";
  } catch (const kiln::Error& e) {
    EXPECT_NE(std::string(e.what()).find("bit cast"), std::string::npos) << e.what();
  }
  Model ok(26);
  ok.packed("w", kInt4, 4, {1, 9, 15}, true);
  Model::attr_int(ok.node("BitCast", {"w"}, "u"), "to", kUint4);
  Model::attr_int(ok.node("Cast", {"u"}, "y"), "to", TP::INT32);
  ok.output("y");
  EXPECT_EQ(ok.run()[0].to_vector<int32_t>(), (std::vector<int32_t>{1, 9, 15}));
}

}  // namespace

namespace {

// TreeEnsemble (ai.onnx.ml 5) against a recursive walk written here: two trees over three
// features with each comparison mode, a NaN-tracking node, and every aggregate function, with
// and without the logistic post-transform, on random samples holding NaNs.
TEST(OnnxImportMl, TreeEnsembleMatchesARecursiveWalk) {
  // tree 0: nodes 0..2; tree 1: nodes 3..4. (mode, feature, split, true id, true leaf, false id,
  // false leaf)
  struct N {
    int mode, feature;
    double split;
    int t, tl, f, fl;
  };
  const std::vector<N> nodes = {{0, 0, 0.5, 1, 0, 2, 0},
                                {3, 1, -0.25, 0, 1, 1, 1},
                                {4, 2, 1.0, 2, 1, 3, 1},
                                {5, 2, 2.0, 4, 0, 4, 1},
                                {2, 0, -1.0, 5, 1, 6, 1}};
  const std::vector<int64_t> targets = {0, 1, 1, 0, 0, 1, 2};
  const std::vector<double> weights = {1.5, -2.0, 0.25, 4.0, -0.5, 3.0, 7.0};
  const std::vector<int64_t> roots = {0, 3}, tracks = {0, 1, 0, 0, 0};
  auto walk = [&](const float* x, int64_t root) {
    int64_t i = root;
    for (;;) {
      const N& n = nodes[static_cast<size_t>(i)];
      const double v = x[n.feature];
      bool go = false;
      switch (n.mode) {
        case 0:
          go = v <= n.split;
          break;
        case 2:
          go = v >= n.split;
          break;
        case 3:
          go = v > n.split;
          break;
        case 4:
          go = v == n.split;
          break;
        case 5:
          go = v != n.split;
          break;
      }
      if (std::isnan(v) && tracks[static_cast<size_t>(i)]) go = true;
      const int next = go ? n.t : n.f;
      if (go ? n.tl : n.fl) return next;
      i = next;
    }
  };
  std::mt19937 rng(std::random_device{}());
  std::uniform_int_distribution<int> pick(0, 5);
  const float values[] = {0.5f, -0.25f, 1.0f, 2.0f, -1.0f, NAN};
  const int64_t rows = 40;
  std::vector<float> x(static_cast<size_t>(rows * 3));
  for (float& v : x) v = values[pick(rng)] + (pick(rng) == 0 ? 0.1f : 0.f);
  for (int aggregate = 0; aggregate < 4; ++aggregate) {
    for (int post : {0, 2}) {
      SCOPED_TRACE(::testing::Message() << "aggregate " << aggregate << " post " << post);
      Model m(21);
      auto* ml = m.m.add_opset_import();
      ml->set_domain("ai.onnx.ml");
      ml->set_version(5);
      m.input("x", TP::FLOAT, {rows, 3});
      auto* n = m.node("TreeEnsemble", {"x"}, "y");
      n->set_domain("ai.onnx.ml");
      auto ints = [&](const char* name, std::vector<int64_t> v) {
        auto* a = n->add_attribute();
        a->set_name(name);
        a->set_type(::onnx::AttributeProto::INTS);
        for (int64_t e : v) a->add_ints(e);
      };
      auto doubles = [&](const char* name, const std::vector<double>& v, int type) {
        auto* a = n->add_attribute();
        a->set_name(name);
        a->set_type(::onnx::AttributeProto::TENSOR);
        auto* t = a->mutable_t();
        t->set_data_type(type);
        t->add_dims(static_cast<int64_t>(v.size()));
        for (double e : v) {
          if (type == TP::DOUBLE) t->add_double_data(e);
          else t->add_int32_data(static_cast<int32_t>(e));
        }
      };
      std::vector<int64_t> feat, tid, tl, fid, fl;
      std::vector<double> split, mode;
      for (const N& e : nodes) {
        feat.push_back(e.feature), tid.push_back(e.t), tl.push_back(e.tl);
        fid.push_back(e.f), fl.push_back(e.fl), split.push_back(e.split), mode.push_back(e.mode);
      }
      ints("nodes_featureids", feat);
      ints("nodes_truenodeids", tid);
      ints("nodes_trueleafs", tl);
      ints("nodes_falsenodeids", fid);
      ints("nodes_falseleafs", fl);
      ints("nodes_missing_value_tracks_true", tracks);
      ints("leaf_targetids", targets);
      ints("tree_roots", roots);
      doubles("nodes_splits", split, TP::DOUBLE);
      doubles("nodes_modes", mode, TP::UINT8);
      doubles("leaf_weights", weights, TP::DOUBLE);
      Model::attr_int(n, "n_targets", 3);
      Model::attr_int(n, "aggregate_function", aggregate);
      Model::attr_int(n, "post_transform", post);
      m.output("y");
      const auto y = m.run({{"x", Array::from_vector(x, {rows, 3})}})[0].to_vector<double>();
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<double> acc(3, aggregate == 2   ? std::numeric_limits<float>::max()
                                   : aggregate == 3 ? std::numeric_limits<float>::lowest()
                                                    : 0.0);
        for (int64_t root : roots) {
          const int leaf = walk(&x[static_cast<size_t>(r * 3)], root);
          const auto t = static_cast<size_t>(targets[static_cast<size_t>(leaf)]);
          const double w = weights[static_cast<size_t>(leaf)];
          acc[t] = aggregate == 2   ? std::min(acc[t], w)
                   : aggregate == 3 ? std::max(acc[t], w)
                                    : acc[t] + (aggregate == 0 ? w / 2 : w);
        }
        for (size_t t = 0; t < 3; ++t) {
          const double want = post == 2 ? 1 / (1 + std::exp(-acc[t])) : acc[t];
          EXPECT_NEAR(y[static_cast<size_t>(r * 3) + t], want, 1e-5 * std::max(1.0, std::abs(want)))
              << "row " << r << " target " << t;
        }
      }
    }
  }
}

}  // namespace

namespace {

// TreeEnsemble's structure is checked while importing: a cycle, a child past the leaves, a target
// past n_targets are errors naming the node.
TEST(OnnxImportMl, TreeEnsembleRefusesBadTrees) {
  struct Bad {
    std::vector<int64_t> true_ids, false_ids, targets;
    const char* message;
  };
  const Bad cases[] = {{{1, 0}, {0, 1}, {0, 0}, "cycle"},
                       {{1, 5}, {0, 1}, {0, 0}, "not a leaf index"},
                       {{0, 0}, {1, 1}, {0, 9}, "past n_targets"}};
  for (const Bad& b : cases) {
    SCOPED_TRACE(b.message);
    Model m(21);
    auto* ml = m.m.add_opset_import();
    ml->set_domain("ai.onnx.ml");
    ml->set_version(5);
    m.input("x", TP::FLOAT, {2, 1});
    auto* n = m.node("TreeEnsemble", {"x"}, "y");
    n->set_domain("ai.onnx.ml");
    auto ints = [&](const char* name, const std::vector<int64_t>& v) {
      auto* a = n->add_attribute();
      a->set_name(name);
      a->set_type(::onnx::AttributeProto::INTS);
      for (int64_t e : v) a->add_ints(e);
    };
    auto tensor = [&](const char* name, int type, int count) {
      auto* a = n->add_attribute();
      a->set_name(name);
      a->set_type(::onnx::AttributeProto::TENSOR);
      a->mutable_t()->set_data_type(type);
      a->mutable_t()->add_dims(count);
      for (int i = 0; i < count; ++i) {
        if (type == TP::DOUBLE) a->mutable_t()->add_double_data(0.5);
        else a->mutable_t()->add_int32_data(0);
      }
    };
    // node 0 -> node 1 (true) or leaf; node 1 -> leaves, unless the case says otherwise
    ints("nodes_featureids", {0, 0});
    ints("nodes_truenodeids", b.true_ids);
    ints("nodes_trueleafs", {0, std::string(b.message) == "cycle" ? 0 : 1});
    ints("nodes_falsenodeids", b.false_ids);
    ints("nodes_falseleafs", {1, 1});
    ints("leaf_targetids", b.targets);
    ints("tree_roots", {0});
    tensor("nodes_splits", TP::DOUBLE, 2);
    tensor("nodes_modes", TP::UINT8, 2);
    tensor("leaf_weights", TP::DOUBLE, 2);
    Model::attr_int(n, "n_targets", 1);
    m.output("y");
    try {
      m.run({{"x", Array::from_vector(std::vector<float>{0, 1}, {2, 1})}});
      ADD_FAILURE() << "imported";
    } catch (const kiln::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(b.message), std::string::npos) << what;
      EXPECT_NE(what.find("TreeEnsemble"), std::string::npos) << what;
    }
  }
}

}  // namespace
