// Malformed packages: truncated files, flipped bytes in each section, offsets past the end, huge
// sizes, too-new versions and edited manifests with valid checksums all give FormatError (never
// a crash: these run under ASan+UBSan in the sanitizer build).
#include <fmt/format.h>
#include <unistd.h>

#include <climits>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <set>

#include "core/op_id.h"
#include "core/op_registry.h"
#include "io/package/format.h"
#include "io/package/manifest_generated.h"
#include "io/package/validate.h"
#include "package/package_bytes.h"
#include "package/tuned_package.h"
#include "runtime/executable_impl.h"
#include "support/nets.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
namespace fb = kiln::package::fb;

// A small package (an MLP with a variable) and its feeds.
struct Fixture {
  Bytes bytes;
  std::map<std::string, Array> feeds;
  std::vector<Array> want;
};

Fixture make_fixture(bool tuned) {
  Fixture r;
  Graph g;
  auto x = g.placeholder({2, 4}, f32, "x");
  auto v = g.variable(random_array({3}, f32), "bias");
  auto h =
      relu(linear(x, g.constant(random_array({5, 4}, f32)), g.constant(random_array({5}, f32))));
  auto y = add(linear(h, g.constant(random_array({3, 5}, f32))), v);
  // (without fusion: the edits below find the relu and the linears as nodes of their own)
  auto exe = g.compile(Device::cpu(), {}, {y, reshape(h, {10})},
                       CompileOptions{.fuse_elementwise = false});
  if (tuned) {
    r.bytes = save_with_tuning(exe, sample_identity(), sample_conv_records());
  } else {
    r.bytes = saved_bytes(exe, "malformed");
  }
  r.feeds = {{"x", random_array({2, 4}, f32)}};
  r.want = exe.run(r.feeds);
  return r;
}

const Fixture& fixture() {
  static const Fixture f = make_fixture(false);
  return f;
}
// The same with a tuning section for CUDA (made without a GPU), which the CPU checks and skips.
const Fixture& tuned_fixture() {
  static const Fixture f = make_fixture(true);
  return f;
}

Executable load(const Bytes& b, const LoadOptions& o = {}) {
  return Executable::load_bytes(b.data(), b.size(), Device::cpu(), o);
}

void expect_format_error(const Bytes& b, const std::vector<std::string>& parts,
                         const LoadOptions& o = {}) {
  expect_error<FormatError>([&] { load(b, o); }, parts);
}

// Packages check the number of inputs of every node before inference reads them: each op of
// op_list.inc declares its arity in its OpDef (src/ops/<family>.cpp: .inputs, .variadic).
TEST(PackageMalformed, EveryOpHasAnInputCountRule) {
  for (OpId op : kAllOps) {
    int lo = -1, hi = -1;
    EXPECT_TRUE(op_def(op).input_range(Attrs{}, lo, hi)) << op_name(op) << " declares no arity";
    EXPECT_GE(lo, 0) << op_name(op);
    EXPECT_LE(lo, hi) << op_name(op);
    int plo = -1, phi = -1;
    EXPECT_TRUE(package::arity(op, Attrs{}, plo, phi)) << op_name(op);
    EXPECT_EQ(std::pair(plo, phi), std::pair(lo, hi)) << op_name(op);
  }
  // an op without a declared arity cannot be loaded
  OpDef undeclared;
  int lo = 0, hi = 0;
  EXPECT_FALSE(undeclared.input_range(Attrs{}, lo, hi));
}

// Optional inputs (has_<name>) and the counts that follow other attributes.
TEST(PackageMalformed, InputCountsFollowAttributes) {
  auto range = [](OpId op, const Attrs& a) {
    int lo = -1, hi = -1;
    EXPECT_TRUE(package::arity(op, a, lo, hi)) << op_name(op);
    return std::pair(lo, hi);
  };
  EXPECT_EQ(range(OpId::Linear, {}), std::pair(2, 2));
  EXPECT_EQ(range(OpId::Linear, {{"has_bias", true}}), std::pair(3, 3));
  EXPECT_EQ(range(OpId::BatchNorm, {{"has_weight", true}, {"has_bias", true}}), std::pair(5, 5));
  EXPECT_EQ(range(OpId::QuantizedConv, {{"has_residual", true}}), std::pair(9, 9));
  EXPECT_EQ(range(OpId::FusedConv, {{"has_bias", true}, {"has_residual", true}}), std::pair(4, 4));
  EXPECT_EQ(range(OpId::FusedConv, {{"has_residual", true}}), std::pair(3, 3));
  EXPECT_EQ(range(OpId::Conv, {{"has_bias", true}}), std::pair(3, 3));
  EXPECT_EQ(range(OpId::QuantizedConv, {{"has_residual", true}, {"quantized_residual", true}}),
            std::pair(11, 11));
  EXPECT_EQ(range(OpId::QuantizedConv, {{"quantized_residual", true}}), std::pair(8, 8));
  EXPECT_EQ(range(OpId::RnnGrad, {{"cell", int64_t{0}}}), std::pair(7, 7));  // lstm: dc
  EXPECT_EQ(range(OpId::RnnGrad, {{"cell", int64_t{1}}, {"has_h0", true}}), std::pair(7, 7));
  EXPECT_EQ(range(OpId::Concat, {}), std::pair(1, INT_MAX));
  EXPECT_EQ(range(OpId::FusedElementwise, {}), std::pair(1, 32));
  EXPECT_EQ(range(OpId::Placeholder, {}), std::pair(0, 0));
}

// The arity each op declares against the nodes its builders, its gradients and the compiler's
// passes really make.
void expect_declared_arity(const detail::GraphImpl& g, std::set<OpId>& seen) {
  for (const auto& n : g.nodes) {
    int lo = -1, hi = -1;
    ASSERT_TRUE(op_def(n.op).input_range(n.attrs, lo, hi)) << op_name(n.op);
    const int count = static_cast<int>(n.inputs.size());
    EXPECT_TRUE(lo <= count && count <= hi)
        << op_name(n.op) << " built with " << count << " inputs declares " << lo << " to " << hi
        << " for attributes (" << n.attrs.to_string() << ")";
    seen.insert(n.op);
  }
}

TEST(PackageMalformed, DeclaredInputCountsMatchBuilders) {
  std::set<OpId> seen;
  {
    Graph g;
    auto in = [&](const Shape& s, DType t = f32) { return g.placeholder(s, t); };
    const Tensor m = in({5, 6}), m2 = in({5, 6}), w6 = in({6}), b6 = in({6});
    const Tensor lw = in({7, 6}), lb = in({7}), idx = in({3}, i64);
    std::vector<Tensor> outs = {linear(m, lw), linear(m, lw, lb), matmul(m, transpose(lw))};
    outs.insert(outs.end(), {layer_norm(m), layer_norm(m, w6), layer_norm(m, w6, b6), rms_norm(m),
                             rms_norm(m, w6), softmax(m), log_softmax(m)});
    outs.insert(outs.end(), {sum(m, {1}), mean(m, {0}), argmax(m, 1), cumsum(m, 1)});
    outs.insert(outs.end(), {concat({m, m2, m}, 0), slice(m, {0, 1}, {2, 3}), tile(m, {2, 1}),
                             flip(m, {0}), broadcast_to(w6, {5, 6}), reshape(m, {30})});
    outs.insert(outs.end(), {where(greater(m, m2), m, m2), add(m, m2), exp(m), cast(m, f64)});
    outs.insert(outs.end(), {gather(m, idx, 0), one_hot(idx, 4), sort(m), argsort(m),
                             topk(m, 2, 1).first, cholesky(in({3, 3}))});
    for (const Tensor& t : split(m, 2, 1)) outs.push_back(t);
    using Unary = Tensor (*)(const Tensor&);
    for (Unary f : std::initializer_list<Unary>{
             exp,  log,  log1p, expm1, sqrt, rsqrt, reciprocal, sin,   cos,   tanh,      sigmoid,
             neg,  abs,  sign,  floor, ceil, round, selu,       silu,  erf,   hardswish, tan,
             asin, acos, atan,  sinh,  cosh, asinh, acosh,      atanh, isnan, isinf})
      outs.push_back(f(m));
    using Binary = Tensor (*)(const Tensor&, const Tensor&);
    for (Binary f : std::initializer_list<Binary>{sub, mul, div, pow, maximum, minimum, mod, equal,
                                                  not_equal, less, less_equal, greater_equal})
      outs.push_back(f(m, m2));
    const Tensor bm = greater(m, m2);
    outs.insert(outs.end(), {logical_and(bm, bm), logical_or(bm, bm), logical_xor(bm, bm),
                             logical_not(bm), masked_fill(m, bm, 0)});
    const Tensor im = in({5, 6}, i32);
    outs.insert(outs.end(), {bitwise_and(im, im), bitwise_or(im, im), bitwise_xor(im, im)});
    outs.insert(outs.end(),
                {max(m, {1}), min(m, {1}), prod(m, {1}), argmin(m, 1), logsumexp(m, {1}),
                 variance(m, {1}), norm_l1(m, {1}), norm_l2(m, {1})});
    outs.insert(outs.end(), {mse(m, m2), roll(m, {1}, {0}), embedding(lw, idx)});
    // images
    const Tensor x = in({2, 3, 8, 8}), cw = in({4, 3, 3, 3}), c3 = in({3});
    const Tensor c = conv2d(x, cw, in({4}));
    outs.insert(outs.end(), {conv2d(x, cw), c, conv_transpose2d(c, in({4, 3, 3, 3})),
                             conv_transpose2d(c, in({4, 3, 3, 3}), c3), batch_norm(x, c3, in({3})),
                             batch_norm(x, c3, in({3}), in({3}), in({3})), instance_norm(x),
                             instance_norm(x, c3, in({3})), group_norm(x, 3),
                             group_norm(x, 3, c3, in({3})), max_pool(x, {.kernel = {2, 2}}),
                             avg_pool(x, {.kernel = {2, 2}}), adaptive_avg_pool(x, {2, 2})});
    // attention, with and without a mask
    const Tensor q = in({2, 4, 8}), k = in({2, 4, 8}), v = in({2, 4, 8});
    outs.push_back(scaled_dot_product_attention(q, k, v));
    outs.push_back(scaled_dot_product_attention(q, k, v, in({4, 4}, boolean)));
    // recurrent layers (T 3, B 2, I 4, H 5), with optional inputs, trained for their gradients
    const Tensor xr = in({3, 2, 4}), h0 = in({1, 2, 5});
    RnnOptions train;
    train.training = true;
    const Tensor lstm_w = in({1, 20, 4});
    const RnnResult l = lstm(xr, {{lstm_w, in({1, 20, 5}), in({1, 40}), in({1, 15})}}, h0,
                             in({1, 2, 5}), std::nullopt, train);
    const Tensor gru_w = in({1, 15, 4});
    const RnnResult gr = gru(xr, {{gru_w, in({1, 15, 5})}}, h0, std::nullopt, train);
    const RnnResult r = rnn(xr, {{in({1, 5, 4}), in({1, 5, 5}), in({1, 10})}});
    outs.insert(outs.end(), {l.y, gr.y, r.y});
    const Tensor pooled = avg_pool(x, {.kernel = {2, 2}});
    const Tensor attended = scaled_dot_product_attention(q, k, v);
    for (const Tensor& d :
         gradients(sum(l.y) + sum(gr.y) + sum(pooled) + sum(attended), {lstm_w, gru_w, x, q}))
      outs.push_back(d);
    // quantization
    const Tensor s = in({}), zp = in({}, i8);
    const Tensor qm = quantize(m, s, zp);
    outs.insert(outs.end(), {qm, dequantize(qm, s, zp), fake_quantize(m, s, zp)});
    // random numbers
    const Tensor state = random_philox_state(g, 7);
    outs.insert(outs.end(),
                {random_uniform(state, {3}).values, random_integer(state, {3}, -5, 5).values});
    expect_declared_arity(g.impl(), seen);
  }
  {
    // a training step, as built and as compiled (fused elementwise chains, folded constants)
    Graph g;
    const TrainNet t = train_net(g, false);
    std::vector<Tensor> targets = gradients(t.loss, t.params);
    targets.push_back(t.loss);
    expect_declared_arity(g.impl(), seen);
    auto exe = g.compile(Device::cpu(), {}, targets);
    expect_declared_arity(exe.impl().program.graph, seen);
  }
  for (OpId op : {OpId::Linear,
                  OpId::Conv,
                  OpId::ConvTranspose,
                  OpId::ConvGradWeight,
                  OpId::LayerNorm,
                  OpId::RmsNorm,
                  OpId::BatchNorm,
                  OpId::BatchNormTrain,
                  OpId::BatchNormTrainGrad,
                  OpId::InstanceNorm,
                  OpId::GroupNorm,
                  OpId::Lstm,
                  OpId::Gru,
                  OpId::Rnn,
                  OpId::RnnGrad,
                  OpId::ScaledDotProductAttention,
                  OpId::Concat,
                  OpId::Where,
                  OpId::MaxPoolGrad,
                  OpId::FusedElementwise,
                  OpId::Quantize,
                  OpId::RandomPhiloxState,
                  OpId::RandomInteger})
    EXPECT_TRUE(seen.count(op)) << op_name(op) << " was not built";
  std::string missed;
  for (OpId op : kAllOps)
    if (!seen.count(op)) missed += std::string(" ") + op_name(op);
  std::cout << seen.size() << " of " << std::size(kAllOps) << " ops built; not:" << missed << "\n";
}

TEST(PackageMalformed, TheFixtureLoadsAndRuns) {
  const Fixture& f = fixture();
  auto exe = load(f.bytes);
  const auto got = exe.run(f.feeds);
  ASSERT_EQ(got.size(), f.want.size());
  for (size_t k = 0; k < got.size(); ++k)
    EXPECT_EQ(std::memcmp(got[k].data(), f.want[k].data(), got[k].nbytes()), 0);
}

TEST(PackageMalformed, TruncatedAnywhere) {
  for (const Fixture* f : {&fixture(), &tuned_fixture()}) {
    const Bytes& full = f->bytes;
    std::vector<size_t> cuts;
    for (size_t n = 0; n <= package::kHeaderBytes; ++n) cuts.push_back(n);
    for (size_t n = package::kHeaderBytes; n < full.size();
         n += std::max<size_t>(1, full.size() / 300))
      cuts.push_back(n);
    cuts.push_back(full.size() - 1);
    for (size_t n : cuts) {
      SCOPED_TRACE("cut at " + std::to_string(n));
      expect_error<FormatError>([&] { load(Bytes(full.begin(), full.begin() + n)); },
                                {"[package]"});
    }
    // longer than it says
    Bytes longer = full;
    longer.push_back(0);
    expect_format_error(longer, {"header", "truncated or extended"});
  }
}

TEST(PackageMalformed, FlippedByteInHeader) {
  for (size_t i = 0; i < package::kHeaderBytes; ++i) {
    SCOPED_TRACE("header byte " + std::to_string(i));
    Bytes b = fixture().bytes;
    b[i] ^= 0x10;
    expect_format_error(b, {"[package]", "header"});
  }
}

TEST(PackageMalformed, FlippedByteInEachWeightSection) {
  const Fixture& f = fixture();
  Bytes clean = f.bytes;
  const auto* sections = manifest(clean)->sections();
  ASSERT_EQ(sections->size(), 4u);  // three constants and a variable
  for (uint32_t k = 0; k < sections->size(); ++k) {
    SCOPED_TRACE("section " + std::to_string(k));
    const auto* s = sections->Get(k);
    Bytes b = clean;
    b[s->offset() + s->size() / 2] ^= 0x40;
    expect_format_error(b, {fmt::format("section {} (", k), fmt::format("offset {}", s->offset()),
                            "checksum mismatch"});
    // verify_weights = false skips the weights' checksums: the flipped weight is what loads
    auto exe = load(b, {.verify_weights = false});
    const Array& value = exe.impl().program.graph.nodes[s->node()].value;
    ASSERT_EQ(value.nbytes(), s->size());
    const Array host = value.to(Device::cpu());
    EXPECT_EQ(std::memcmp(host.data(), b.data() + s->offset(), s->size()), 0);
    EXPECT_NE(std::memcmp(host.data(), clean.data() + s->offset(), s->size()), 0);
    exe.run(f.feeds);
  }
}

TEST(PackageMalformed, FlippedByteInManifest) {
  const Bytes& full = fixture().bytes;
  const uint64_t off = manifest_offset(full);
  for (uint64_t i = off; i < full.size(); i += 7) {
    Bytes b = full;
    b[i] ^= 0x01;
    expect_format_error(b, {"manifest", fmt::format("offset {}", off), "checksum mismatch"});
  }
}

TEST(PackageMalformed, TooNewVersion) {
  Bytes b = fixture().bytes;
  put<uint32_t>(b, package::header::format_version, 7);
  put<uint32_t>(b, package::header::min_reader_version, 5);
  fix_checksums(b);
  expect_format_error(b, {"format version 7", "reader of version 5",
                          fmt::format("versions up to {}", package::kReaderVersion)});
  // a newer format that older readers may read loads
  Bytes newer = fixture().bytes;
  put<uint32_t>(newer, package::header::format_version, package::kFormatVersion + 1);
  fix_checksums(newer);
  EXPECT_EQ(load(newer).package_info()->format_version, package::kFormatVersion + 1);
}

TEST(PackageMalformed, HeaderOffsetsPastTheEndAndHugeSizes) {
  const Bytes& full = fixture().bytes;
  struct Edit {
    size_t field;
    uint64_t value;
    const char* expect;
  };
  const uint64_t size = full.size();
  const std::vector<Edit> edits = {
      {package::header::manifest_offset, size + 64, "outside the file"},
      {package::header::manifest_offset, ~uint64_t{0} - 7, "outside the file"},
      {package::header::manifest_offset, 8, "outside the file"},
      {package::header::manifest_size, ~uint64_t{0}, "outside the file"},
      {package::header::manifest_size, uint64_t{1} << 63, "outside the file"},
      {package::header::manifest_offset, manifest_offset(full) - 4, "multiple of 8"},
      {package::header::file_size, size * 2, "truncated or extended"},
      {package::header::file_size, 0, "truncated or extended"},
  };
  for (auto& e : edits) {
    SCOPED_TRACE(e.expect);
    Bytes b = full;
    put<uint64_t>(b, e.field, e.value);
    fix_checksums(b);
    expect_format_error(b, {"header", e.expect});
  }
}

// Edits of the manifest that keep every checksum valid: the semantic checks must catch them.
TEST(PackageMalformed, ManifestEditsWithValidChecksums) {
  struct Case {
    const char* name;
    std::function<void(fb::Manifest&, const Bytes&)> edit;
    std::vector<std::string> expect;
  };
  // node 0 is the placeholder; find the first linear and the relu
  auto find = [](fb::Manifest& m, uint16_t op) -> fb::Node* {
    for (uint32_t i = 0; i < m.nodes()->size(); ++i)
      if (m.nodes()->Get(i)->op() == op) return m.mutable_nodes()->GetMutableObject(i);
    return nullptr;
  };
  const auto linear_id = static_cast<uint16_t>(OpId::Linear);
  const auto relu_id = static_cast<uint16_t>(OpId::Relu);
  const std::vector<Case> cases = {
      {"unknown op",
       [&](fb::Manifest& m, const Bytes&) { find(m, relu_id)->mutate_op(9999); },
       {"unknown op id 9999"}},
      {"op of another arity",
       [&](fb::Manifest& m, const Bytes&) {
         find(m, relu_id)->mutate_op(static_cast<uint16_t>(OpId::Add));
       },
       {"(add", "has 1 inputs; the op takes 2"}},
      {"op with other outputs",
       [&](fb::Manifest& m, const Bytes&) {
         find(m, relu_id)->mutate_op(static_cast<uint16_t>(OpId::Sigmoid));
         find(m, linear_id)->mutable_outputs()->GetMutableObject(0)->mutable_shape()->Mutate(1, 4);
       },
       {"outputs", "differ"}},
      {"input from a later node",
       [&](fb::Manifest& m, const Bytes&) {
         find(m, relu_id)->mutable_inputs()->GetMutableObject(0)->mutate_node(1000);
       },
       {"not an earlier node"}},
      {"input output index",
       [&](fb::Manifest& m, const Bytes&) {
         find(m, relu_id)->mutable_inputs()->GetMutableObject(0)->mutate_index(3);
       },
       {"has no output 3"}},
      {"negative dim",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_nodes()
             ->GetMutableObject(0)
             ->mutable_outputs()
             ->GetMutableObject(0)
             ->mutable_shape()
             ->Mutate(0, -2);
       },
       {"negative dim"}},
      {"huge dims",
       [&](fb::Manifest& m, const Bytes&) {
         auto* s = m.mutable_nodes()
                       ->GetMutableObject(0)
                       ->mutable_outputs()
                       ->GetMutableObject(0)
                       ->mutable_shape();
         s->Mutate(0, int64_t{1} << 40);
         s->Mutate(1, int64_t{1} << 40);
       },
       {"too large"}},
      {"unknown dtype",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_nodes()
             ->GetMutableObject(0)
             ->mutable_outputs()
             ->GetMutableObject(0)
             ->mutate_dtype(200);
       },
       {"unknown dtype 200"}},
      {"unknown attribute kind",
       [&](fb::Manifest& m, const Bytes&) {
         find(m, linear_id)
             ->mutable_attrs()
             ->GetMutableObject(0)
             ->mutate_kind(static_cast<fb::AttrKind>(42));
       },
       {"unknown kind 42"}},
      {"section past the end",
       [&](fb::Manifest& m, const Bytes& b) {
         m.mutable_sections()->GetMutableObject(0)->mutate_offset(b.size() + 4096);
       },
       {"section 0 (", "outside the file"}},
      {"section offset overflows",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_sections()->GetMutableObject(1)->mutate_offset(~uint64_t{0} - 63);
       },
       {"section 1 (", "outside the file"}},
      {"section of a huge size",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_sections()->GetMutableObject(0)->mutate_size(uint64_t{1} << 62);
       },
       {"section 0 (", "bytes;"}},
      {"misaligned section",
       [&](fb::Manifest& m, const Bytes&) {
         auto* s = m.mutable_sections()->GetMutableObject(2);
         s->mutate_offset(s->offset() - 8);
       },
       {"section 2 (", "multiple of 64"}},
      {"section of another node",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_sections()->GetMutableObject(0)->mutate_node(0);
       },
       {"section 0 (", "belongs to node %0"}},
      {"node naming a missing section",
       [&](fb::Manifest& m, const Bytes&) {
         for (uint32_t i = 0; i < m.nodes()->size(); ++i)
           if (m.nodes()->Get(i)->section() >= 0) {
             m.mutable_nodes()->GetMutableObject(i)->mutate_section(77);
             break;
           }
       },
       {"data section 77"}},
      {"arena offset past the arena",
       [&](fb::Manifest& m, const Bytes&) {
         for (uint32_t i = 0; i < m.slots()->size(); ++i) {
           auto* r = m.mutable_slots()->GetMutableObject(i)->mutable_slots();
           for (uint32_t o = 0; o < r->size(); ++o)
             if (r->Get(o)->where() == 3)
               return r->GetMutableObject(o)->mutate_offset(~uint64_t{0} - 63), void();
         }
       },
       {"outside the arena"}},
      {"misaligned arena offset",
       [&](fb::Manifest& m, const Bytes&) {
         for (uint32_t i = 0; i < m.slots()->size(); ++i) {
           auto* r = m.mutable_slots()->GetMutableObject(i)->mutable_slots();
           for (uint32_t o = 0; o < r->size(); ++o)
             if (r->Get(o)->where() == 3) return r->GetMutableObject(o)->mutate_offset(4), void();
         }
       },
       {"arena offset 4", "not 64-byte aligned"}},
      {"arena larger than its values",
       [&](fb::Manifest& m, const Bytes&) { m.mutate_arena_bytes(uint64_t{1} << 50); },
       {"more than the", "all values need"}},
      {"arena too small",
       [&](fb::Manifest& m, const Bytes&) { m.mutate_arena_bytes(16); },
       {"outside the arena"}},
      {"unknown slot kind",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_slots()->GetMutableObject(0)->mutable_slots()->GetMutableObject(0)->mutate_where(
             9);
       },
       {"unknown kind 9"}},
      {"a step writing into a constant",
       [&](fb::Manifest& m, const Bytes&) {
         for (uint32_t i = 0; i < m.nodes()->size(); ++i)
           if (m.nodes()->Get(i)->op() == relu_id) {
             auto* s = m.mutable_slots()->GetMutableObject(i)->mutable_slots()->GetMutableObject(0);
             s->mutate_where(2);
             for (uint32_t j = 0; j < m.nodes()->size(); ++j)
               if (m.nodes()->Get(j)->section() >= 0) s->mutate_index(static_cast<int32_t>(j));
           }
       },
       {"would write into constant"}},
      {"a feed slot naming a constant",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_slots()->GetMutableObject(0)->mutable_slots()->GetMutableObject(0)->mutate_index(
             1000);
       },
       {"does not name the node itself"}},
      {"output slot of another output",
       [&](fb::Manifest& m, const Bytes&) {
         auto v = *m.outputs()->Get(0);
         m.mutable_slots()
             ->GetMutableObject(v.node())
             ->mutable_slots()
             ->GetMutableObject(v.index())
             ->mutate_index(1);
       },
       {"output 1"}},
      {"step of another node",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_steps()->GetMutableObject(0)->mutate_node(0);
       },
       {"manifest steps", "should run node"}},
      {"step node out of range",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_steps()->GetMutableObject(0)->mutate_node(-5);
       },
       {"manifest steps", "node %-5"}},
      {"step on cuda in a cpu package",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_steps()->GetMutableObject(0)->mutate_backend(1);
       },
       {"runs on cuda"}},
      {"unknown backend",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_steps()->GetMutableObject(0)->mutate_backend(9);
       },
       {"unknown backend 9"}},
      {"too many returned",
       [&](fb::Manifest& m, const Bytes&) { m.mutate_num_returned(100); },
       {"100 returned"}},
      {"output past the nodes",
       [&](fb::Manifest& m, const Bytes&) {
         m.mutable_outputs()->GetMutableObject(0)->mutate_node(1 << 30);
       },
       {"manifest outputs", "not a value"}},
      {"unknown device kind",
       [&](fb::Manifest& m, const Bytes&) { m.mutable_metadata()->mutate_device_kind(5); },
       {"unknown device kind 5"}},
      {"unknown autocast dtype",
       [&](fb::Manifest& m, const Bytes&) { m.mutable_metadata()->mutate_autocast(77); },
       {"autocast dtype 77"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Bytes b = fixture().bytes;
    c.edit(*manifest(b), b);
    fix_checksums(b);
    std::vector<std::string> parts = c.expect;
    parts.push_back("[package] <memory>: ");
    expect_format_error(b, parts);
  }
}

// Random edits of the manifest with valid checksums: whatever loads must run or throw a
// kiln::Error; nothing may crash (the sanitizer build checks reads and writes).
TEST(PackageMalformed, RandomManifestEditsNeverCrash) {
  const Fixture& f = fixture();
  const uint64_t off = manifest_offset(f.bytes);
  std::uniform_int_distribution<uint64_t> pos(off, f.bytes.size() - 1);
  std::uniform_int_distribution<int> byte(0, 255), count(1, 4);
  int loaded = 0, rejected = 0;
  for (int it = 0; it < 2000; ++it) {
    Bytes b = f.bytes;
    for (int k = count(rng()); k > 0; --k) b[pos(rng())] = static_cast<uint8_t>(byte(rng()));
    fix_checksums(b);
    try {
      auto exe = load(b);
      ++loaded;
      // an edited shape may ask for more memory than there is: an OutOfMemory error, which the
      // sanitizer's allocator reports as a crash instead
      size_t bytes = exe.peak_intermediate_bytes();
      for (const auto& o : exe.outputs()) bytes += numel(o.shape) * size_of(o.dtype);
      if (bytes < (size_t{1} << 26)) exe.run(f.feeds);
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  std::printf("random manifest edits: %d loaded, %d rejected\n", loaded, rejected);
}

// ---- the tuning section ----

fb::Tuning* tuning(Bytes& b) { return manifest(b)->mutable_tuning()->GetMutableObject(0); }

TEST(PackageMalformed, TheTunedFixtureLoadsAndRuns) {
  const Fixture& f = tuned_fixture();
  Bytes b = f.bytes;
  ASSERT_EQ(manifest(b)->tuning()->size(), 1u);
  auto exe = load(b, {.strict = true});
  const auto got = exe.run(f.feeds);
  ASSERT_EQ(got.size(), f.want.size());
  for (size_t k = 0; k < got.size(); ++k)
    EXPECT_EQ(std::memcmp(got[k].data(), f.want[k].data(), got[k].nbytes()), 0);
  // packages without GPU tuning have none
  Bytes plain = fixture().bytes;
  EXPECT_EQ(manifest(plain)->tuning()->size(), 0u);
}

TEST(PackageMalformed, FlippedByteInTuningSection) {
  Bytes clean = tuned_fixture().bytes;
  const uint64_t off = tuning(clean)->offset(), size = tuning(clean)->size();
  ASSERT_GT(size, 16u);
  for (uint64_t i = off; i < off + size; i += 3) {
    SCOPED_TRACE("byte " + std::to_string(i));
    Bytes b = clean;
    b[i] ^= 0x04;
    // checked whether or not the weights are
    for (bool verify : {true, false})
      expect_format_error(b, {"tuning section 0 (cuda)", fmt::format("offset {}", off),
                              "checksum mismatch"},
                          {.verify_weights = verify});
  }
}

// Edits of the tuning entry or of its blob with every checksum valid.
TEST(PackageMalformed, TuningEditsWithValidChecksums) {
  struct Case {
    const char* name;
    std::function<void(fb::Tuning&, Bytes&)> edit;  // the blob's checksum is fixed after it
    std::vector<std::string> expect;
  };
  auto put_blob = [](Bytes& b, const fb::Tuning& t, uint64_t at, auto v) {
    std::memcpy(b.data() + t.offset() + at, &v, sizeof v);
  };
  Bytes clean = tuned_fixture().bytes;
  const uint64_t off = tuning(clean)->offset(), size = clean.size();
  const std::vector<Case> cases = {
      {"past the end", [&](fb::Tuning& t, Bytes&) { t.mutate_offset(size + 64); },
       {"tuning section 0 (cuda)", "outside the file"}},
      {"offset overflows", [&](fb::Tuning& t, Bytes&) { t.mutate_offset(~uint64_t{0} - 63); },
       {"tuning section 0 (cuda)", "outside the file"}},
      {"inside the header", [&](fb::Tuning& t, Bytes&) { t.mutate_offset(0); },
       {"tuning section 0 (cuda)", "outside the file"}},
      {"huge size", [&](fb::Tuning& t, Bytes&) { t.mutate_size(uint64_t{1} << 62); },
       {"tuning section 0 (cuda)", "at most 16777216"}},
      {"misaligned", [&](fb::Tuning& t, Bytes&) { t.mutate_offset(t.offset() - 8); },
       {"tuning section 0 (cuda)", "multiple of 64"}},
      {"unknown backend", [&](fb::Tuning& t, Bytes&) { t.mutate_backend(7); },
       {"tuning section 0", "unknown backend 7"}},
      {"huge record count",
       [&](fb::Tuning& t, Bytes& b) { put_blob(b, t, 8, uint32_t{0xffffffff}); },
       {"tuning section 0 (cuda)", fmt::format("offset {}", off + 8), "do not fit"}},
      {"huge key count", [&](fb::Tuning& t, Bytes& b) { put_blob(b, t, 18, uint16_t{60000}); },
       {fmt::format("offset {}", off + 16), "record 0 has 60000 key"}},
      {"a record cut off", [&](fb::Tuning& t, Bytes& b) { t.mutate_size(t.size() - 8); },
       {"tuning section 0 (cuda)", "record 2 of 3 is cut off"}},
      {"bytes after the records", [&](fb::Tuning& t, Bytes& b) { put_blob(b, t, 8, uint32_t{2}); },
       {"bytes after the last record"}},
      {"bad magic", [&](fb::Tuning& t, Bytes& b) { put_blob(b, t, 0, uint32_t{0}); },
       {fmt::format("offset {}", off), "bad magic"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    Bytes b = clean;
    fb::Tuning& t = *tuning(b);
    c.edit(t, b);
    if (t.offset() == off && t.size() <= b.size() - off)
      t.mutate_xxh3(package::xxh3(b.data() + off, t.size()));
    fix_checksums(b);
    std::vector<std::string> parts = c.expect;
    parts.push_back("[package] <memory>: ");
    expect_format_error(b, parts);
  }
  // a blob of a later version is skipped, not an error
  Bytes newer = clean;
  fb::Tuning& t = *tuning(newer);
  std::memcpy(newer.data() + off + 4, "\x05\0\0\0", 4);
  t.mutate_xxh3(package::xxh3(newer.data() + off, t.size()));
  fix_checksums(newer);
  load(newer, {.strict = true}).run(tuned_fixture().feeds);
}

// Random bytes in the blob with valid checksums: the loader rejects or loads, never crashes.
TEST(PackageMalformed, RandomTuningEditsNeverCrash) {
  const Fixture& f = tuned_fixture();
  Bytes clean = f.bytes;
  const uint64_t off = tuning(clean)->offset(), size = tuning(clean)->size();
  std::uniform_int_distribution<uint64_t> pos(off, off + size - 1);
  std::uniform_int_distribution<int> byte(0, 255), count(1, 4);
  int loaded = 0, rejected = 0;
  for (int it = 0; it < 1000; ++it) {
    Bytes b = clean;
    for (int k = count(rng()); k > 0; --k) b[pos(rng())] = static_cast<uint8_t>(byte(rng()));
    tuning(b)->mutate_xxh3(package::xxh3(b.data() + off, size));
    fix_checksums(b);
    try {
      load(b).run(f.feeds);
      ++loaded;
    } catch (const FormatError&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_GT(loaded, 0);  // edits of keys and values are records the CPU does not read
}

TEST(PackageMalformed, NotAFile) {
  expect_error<IoError>([] { Executable::load("/nonexistent/dir/x.kiln", Device::cpu()); },
                        {"[package]", "cannot open"});
  expect_error<IoError>([] { Executable::load(testing::TempDir(), Device::cpu()); },
                        {"[package]", "not a regular file"});
  expect_format_error({}, {"header", "has 0 bytes"});
}

// A package compiled for CUDA loads on the CPU by placing and planning its program again.
TEST(PackageMalformed, PackageForAnotherDeviceIsPlannedAgain) {
  const Fixture& f = fixture();
  Bytes b = f.bytes;
  manifest(b)->mutable_metadata()->mutate_device_kind(1);
  fix_checksums(b);
  auto exe = load(b);
  ASSERT_NE(exe.package_info(), nullptr);
  EXPECT_TRUE(exe.package_info()->replanned);
  EXPECT_EQ(exe.package_info()->compiled_for, "cuda:0");
  EXPECT_NE(exe.report().find("planned again"), std::string::npos) << exe.report();
  const auto got = exe.run(f.feeds);
  for (size_t k = 0; k < got.size(); ++k)
    EXPECT_EQ(std::memcmp(got[k].data(), f.want[k].data(), got[k].nbytes()), 0);
  expect_error<UnsupportedError>([&] { load(b, {.strict = true}); },
                                 {"compiled for cuda:0, loaded for cpu", "strict"});
}

}  // namespace
}  // namespace kiln
