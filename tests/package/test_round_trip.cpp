// Packages: compile -> save -> load -> run gives the in-memory executable's outputs bit for bit,
// the loaded program is the compiled one, and a training run resumed from a package follows the
// uninterrupted run exactly.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "core/graph_impl.h"
#include "core/op_registry.h"
#include "package/package_bytes.h"
#include "runtime/executable_impl.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

std::string temp_path(const std::string& name) {
  return testing::TempDir() + "kiln_pkg_" + std::to_string(::getpid()) + "_" + name + ".kiln";
}

void expect_bitwise_equal(const Array& got, const Array& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  const Array g = got.to(Device::cpu()), w = want.to(Device::cpu());
  EXPECT_EQ(std::memcmp(g.data(), w.data(), w.nbytes()), 0) << what << ": outputs differ";
}

// The loaded program has the same nodes (ops, inputs, attributes, outputs, names, origins),
// outputs, memory plan and schedule as the compiled one.
void expect_same_program(const Executable& a, const Executable& b) {
  const auto &x = a.impl(), &y = b.impl();
  const auto &na = x.program.graph.nodes, &nb = y.program.graph.nodes;
  ASSERT_EQ(na.size(), nb.size());
  for (size_t i = 0; i < na.size(); ++i) {
    EXPECT_EQ(na[i].op, nb[i].op) << "node " << i;
    EXPECT_EQ(na[i].inputs, nb[i].inputs) << "node " << i;
    EXPECT_TRUE(na[i].attrs == nb[i].attrs)
        << "node " << i << ": " << na[i].attrs.to_string() << " vs " << nb[i].attrs.to_string();
    EXPECT_EQ(na[i].outputs, nb[i].outputs) << "node " << i;
    EXPECT_EQ(na[i].name, nb[i].name) << "node " << i;
    EXPECT_EQ(na[i].origin, nb[i].origin) << "node " << i;
  }
  EXPECT_EQ(x.program.outputs, y.program.outputs);
  EXPECT_EQ(x.program.num_returned, y.program.num_returned);
  EXPECT_EQ(x.plan.arena_bytes, y.plan.arena_bytes);
  EXPECT_EQ(x.plan.num_buffers, y.plan.num_buffers);
  ASSERT_EQ(x.plan.slots.size(), y.plan.slots.size());
  for (size_t i = 0; i < x.plan.slots.size(); ++i)
    for (size_t o = 0; o < x.plan.slots[i].size(); ++o) {
      const ValueSlot &s = x.plan.slots[i][o], &t = y.plan.slots[i][o];
      EXPECT_TRUE(s.where == t.where && s.offset == t.offset && s.index == t.index &&
                  s.storage == t.storage)
          << "slot " << i << ":" << o;
    }
  ASSERT_EQ(x.steps.size(), y.steps.size());
  for (size_t k = 0; k < x.steps.size(); ++k) {
    EXPECT_EQ(x.steps[k].node, y.steps[k].node);
    EXPECT_EQ(x.steps[k].kernel, y.steps[k].kernel);
    EXPECT_EQ(x.steps[k].backend, y.steps[k].backend);
  }
  EXPECT_EQ(x.placeholders, y.placeholders);
  EXPECT_EQ(x.variables, y.variables);
}

// Saves, loads, checks the program and runs both on `feeds`.
Executable round_trip(const Executable& exe, const std::map<std::string, Array>& feeds,
                      const std::string& name) {
  const std::string path = temp_path(name);
  exe.save(path, {.producer = "kiln tests", .source_hash = "abc123"});
  Executable loaded = Executable::load(path, Device::cpu());
  std::filesystem::remove(path);
  expect_same_program(exe, loaded);
  const auto want = exe.run(feeds);
  const auto got = loaded.run(feeds);
  EXPECT_EQ(got.size(), want.size());
  for (size_t k = 0; k < want.size() && k < got.size(); ++k)
    expect_bitwise_equal(got[k], want[k], name + " output " + std::to_string(k));
  const auto ia = exe.inputs(), ib = loaded.inputs();
  EXPECT_EQ(ia.size(), ib.size());
  for (size_t i = 0; i < ia.size() && i < ib.size(); ++i) {
    EXPECT_EQ(ia[i].name, ib[i].name);
    EXPECT_EQ(ia[i].shape, ib[i].shape);
    EXPECT_EQ(ia[i].dtype, ib[i].dtype);
  }
  const auto oa = exe.outputs(), ob = loaded.outputs();
  EXPECT_EQ(oa.size(), ob.size());
  for (size_t i = 0; i < oa.size() && i < ob.size(); ++i) {
    EXPECT_EQ(oa[i].name, ob[i].name);
    EXPECT_EQ(oa[i].shape, ob[i].shape);
  }
  const PackageInfo* info = loaded.package_info();
  EXPECT_NE(info, nullptr);
  if (info) {
    EXPECT_EQ(info->producer, "kiln tests");
    EXPECT_EQ(info->source_hash, "abc123");
    EXPECT_EQ(info->kiln_version, version());
    EXPECT_EQ(info->compiled_for, "cpu");
    EXPECT_FALSE(info->replanned);
  }
  EXPECT_EQ(exe.package_info(), nullptr);
  return loaded;
}

TEST(Package, MlpRoundTripMatchesCompiledAndReference) {
  constexpr int N = 5, I = 7, H = 16, C = 3;
  const Array w1 = random_array({H, I}, f32), b1 = random_array({H}, f32);
  const Array w2 = random_array({C, H}, f32), b2 = random_array({C}, f32);
  Graph g;
  auto x = g.placeholder({-1, I}, f32, "x");
  auto y = softmax(
      linear(relu(linear(x, g.constant(w1), g.constant(b1))), g.constant(w2), g.constant(b2)));
  auto exe = g.compile(Device::cpu(), {{x, {N, I}}}, {y});
  const Array xs = random_array({N, I}, f32, -2, 2);
  Executable loaded = round_trip(exe, {{"x", xs}}, "mlp");

  // and against a float64 reference
  const auto xv = to_f64(xs), w1v = to_f64(w1), b1v = to_f64(b1), w2v = to_f64(w2),
             b2v = to_f64(b2);
  std::vector<double> want(N * C);
  for (int n = 0; n < N; ++n) {
    std::vector<double> h(H), z(C);
    for (int j = 0; j < H; ++j) {
      double a = b1v[j];
      for (int i = 0; i < I; ++i) a += w1v[j * I + i] * xv[n * I + i];
      h[j] = std::max(a, 0.0);
    }
    double mx = -1e300, se = 0;
    for (int c = 0; c < C; ++c) {
      z[c] = b2v[c];
      for (int j = 0; j < H; ++j) z[c] += w2v[c * H + j] * h[j];
      mx = std::max(mx, z[c]);
    }
    for (int c = 0; c < C; ++c) se += std::exp(z[c] - mx);
    for (int c = 0; c < C; ++c) want[n * C + c] = std::exp(z[c] - mx) / se;
  }
  expect_close(loaded.run(std::map<std::string, Array>{{"x", xs}})[0], {N, C}, want, 1e-5, 1e-6);
}

TEST(Package, ConvNetRoundTrip) {
  Graph g;
  auto x = g.placeholder({2, 3, 16, 16}, f32, "image");
  auto w1 = g.constant(random_array({8, 3, 3, 3}, f32, -0.5, 0.5));
  auto h = conv2d(x, w1, g.constant(random_array({8}, f32)), {.padding = {1, 1}});
  // folded into the conv by the optimizer
  h = batch_norm(h, g.constant(random_array({8}, f32)), g.constant(random_array({8}, f32, 0.5, 2)),
                 g.constant(random_array({8}, f32)), g.constant(random_array({8}, f32)));
  h = max_pool(relu(h), {.kernel = {2, 2}});
  h = conv2d(h, g.constant(random_array({16, 4, 3, 3}, f32, -0.3, 0.3)), std::nullopt,
             {.stride = {2, 2}, .padding = {1, 1}, .groups = 2});
  h = reshape(global_avg_pool(relu(h)), {2, 16});
  auto logits = linear(h, g.constant(random_array({10, 16}, f32)));
  auto exe = g.compile(Device::cpu(), {}, {logits});
  round_trip(exe, {{"image", random_array({2, 3, 16, 16}, f32)}}, "convnet");
}

// A program with channels_last nodes (what the channels_last pass makes for a GPU, here built by
// hand: a fused_conv with its residual and relu, then a max pool) runs on the CPU, saves, loads
// with each node's kernel looked up for its layout, and gives the NCHW program's outputs.
TEST(Package, ChannelsLastNodesLoadWithTheirLayoutsKernels) {
  Graph g;
  auto x = g.placeholder({2, 6, 7, 4}, f32, "x");  // NHWC
  auto r = g.placeholder({2, 6, 7, 8}, f32, "residual");
  const Tensor w = g.constant(random_array({8, 3, 3, 4}, f32, -0.5, 0.5));  // (O, kh, kw, C)
  const Tensor ref_conv = conv2d(transpose(x, {0, 3, 1, 2}), transpose(w, {0, 3, 1, 2}),
                                 std::nullopt, {.padding = {1, 1}});
  const Tensor ref = max_pool(relu(ref_conv + transpose(r, {0, 3, 1, 2})), {.kernel = {2, 2}});
  Attrs ca = ref_conv.graph_impl()->nodes[ref_conv.node_id()].attrs;
  ca.set("channels_last", true);
  ca.set("relu", true);
  ca.set("has_residual", true);
  const Tensor h = detail::make_node1(OpId::FusedConv, {x, w, r}, ca);
  Attrs pa = ref.graph_impl()->nodes[ref.node_id()].attrs;
  pa.set("channels_last", true);
  const Tensor y = detail::make_node(OpId::MaxPool, {h}, pa)[0];
  ASSERT_EQ(y.shape(), (Shape{2, 3, 3, 8}));
  // (the channels_last pass off: the reference stays NCHW, the hand-made nodes alone NHWC)
  CompileOptions o;
  o.kernels.channels_last = false;
  auto exe = g.compile(Device::cpu(), {}, {transpose(y, {0, 3, 1, 2}), ref}, o);
  const Executable loaded = round_trip(
      exe, {{"x", random_array({2, 6, 7, 4}, f32)}, {"residual", random_array({2, 6, 7, 8}, f32)}},
      "channels_last");
  int nhwc_steps = 0;
  for (const Step& st : loaded.impl().steps) {
    const auto& n = loaded.impl().program.graph.nodes[st.node];
    const Layout l = layout_of(n.op, n.attrs);
    EXPECT_EQ(st.kernel, find_kernel(n.op, Backend::cpu, l)) << op_name(n.op);
    nhwc_steps += l == Layout::channels_last;
  }
  EXPECT_EQ(nhwc_steps, 2);
  const Array xv = random_array({2, 6, 7, 4}, f32), rv = random_array({2, 6, 7, 8}, f32);
  const auto out = loaded.run({{"x", xv}, {"residual", rv}});
  const auto got = out[0].to_vector<float>(), want = out[1].to_vector<float>();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
}

// Files written before fused_conv existed hold a conv with its fused epilogue as attributes
// (relu, has_residual, the residual as a last input): the reader reads that node as fused_conv.
TEST(Package, ConvWithAFusedEpilogueFromOlderFilesReadsAsFusedConv) {
  for (const bool channels_last : {false, true}) {
    SCOPED_TRACE(channels_last ? "channels_last" : "plain");
    Graph g;
    auto x = g.placeholder({2, 3, 6, 5}, f32, "x");
    auto r = g.placeholder({2, 4, 6, 5}, f32, "residual");
    const Tensor w = g.constant(random_array({4, 3, 3, 3}, f32, -0.5, 0.5));
    const Tensor b = g.constant(random_array({4}, f32));
    const Tensor conv = conv2d(x, w, b, {.padding = {1, 1}});
    const Tensor ref = relu(conv + r);
    Attrs a = conv.graph_impl()->nodes[conv.node_id()].attrs;
    a.set("relu", true);
    a.set("has_residual", true);
    Tensor y;
    if (channels_last) {
      a.set("channels_last", true);
      const Tensor nhwc = detail::make_node1(
          OpId::FusedConv,
          {transpose(x, {0, 2, 3, 1}), transpose(w, {0, 2, 3, 1}), b, transpose(r, {0, 2, 3, 1})},
          a);
      y = transpose(nhwc, {0, 3, 1, 2});
    } else {
      y = detail::make_node1(OpId::FusedConv, {x, w, b, r}, a);
    }
    // (fusion and the channels_last pass off: the reference's conv, add and relu stay apart, the
    // hand-made fused_conv alone)
    CompileOptions o;
    o.fuse_elementwise = false;
    o.kernels.channels_last = false;
    const Executable exe = g.compile(Device::cpu(), {}, {y, ref}, o);
    Bytes bytes = saved_bytes(exe, "older_conv");
    // the file as an older writer wrote it: the node's op is conv
    auto* nodes = manifest(bytes)->mutable_nodes();
    int edited = 0;
    for (uint32_t i = 0; i < nodes->size(); ++i)
      if (nodes->Get(i)->op() == static_cast<uint16_t>(OpId::FusedConv))
        edited += nodes->GetMutableObject(i)->mutate_op(static_cast<uint16_t>(OpId::Conv));
    ASSERT_EQ(edited, 1);
    fix_checksums(bytes);
    const Executable loaded = Executable::load_bytes(bytes.data(), bytes.size(), Device::cpu());
    int fused = 0;
    for (const auto& n : loaded.impl().program.graph.nodes) fused += n.op == OpId::FusedConv;
    EXPECT_EQ(fused, 1);
    const Array xv = random_array({2, 3, 6, 5}, f32), rv = random_array({2, 4, 6, 5}, f32);
    const auto out = loaded.run({{"x", xv}, {"residual", rv}});
    const auto got = out[0].to_vector<float>(), want = out[1].to_vector<float>();
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
  }
}

// On a GPU: a package compiled for cuda:0 loads for cuda:0 and gives the in-memory executable's
// outputs bit for bit, and loads for the CPU (recompiled placement) within float tolerance.
TEST(Package, CudaRoundTripAndCrossDeviceLoad) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Graph g;
  auto x = g.placeholder({4, 3, 16, 16}, f32, "image");
  auto h = conv2d(x, g.constant(random_array({8, 3, 3, 3}, f32, -0.5, 0.5)),
                  g.constant(random_array({8}, f32)), {.padding = {1, 1}});
  h = max_pool(relu(h), {.kernel = {2, 2}});
  h = reshape(global_avg_pool(h), {4, 8});
  auto y = softmax(linear(h, g.constant(random_array({5, 8}, f32))));
  auto exe = g.compile(Device::cuda(0), {}, {y});
  const std::string path = temp_path("cuda");
  exe.save(path);
  const Array in = random_array({4, 3, 16, 16}, f32);
  const Array want = exe.run({{"image", in}})[0];
  auto loaded = Executable::load(path, Device::cuda(0));
  EXPECT_EQ(loaded.device(), Device::cuda(0));
  expect_bitwise_equal(loaded.run({{"image", in}})[0], want, "cuda package on cuda");
  auto on_cpu = Executable::load(path, Device::cpu());
  const auto got = on_cpu.run({{"image", in}})[0].to_vector<float>(), w = want.to_vector<float>();
  ASSERT_EQ(got.size(), w.size());
  for (size_t i = 0; i < w.size(); ++i) EXPECT_NEAR(got[i], w[i], 1e-5) << i;
  std::filesystem::remove(path);
}

// A CUDA f16 convolution whose residual add and relu run in its epilogue (the channels_last
// pass gives it the residual as one more input) saves, loads and runs bit for bit.
TEST(Package, CudaConvWithFusedResidualRoundTrips) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  Graph g;
  auto x = g.placeholder({2, 16, 8, 8}, f16, "x");
  auto r = g.placeholder({2, 16, 8, 8}, f16, "residual");
  auto h = conv2d(x, g.constant(random_array({16, 16, 3, 3}, f16, -0.2, 0.2)),
                  g.constant(random_array({16}, f16)), {.padding = {1, 1}});
  auto y = relu(h + r);
  auto exe = g.compile(Device::cuda(0), {}, {y});
  bool fused = false;
  for (auto& n : exe.impl().program.graph.nodes)
    fused = fused || (n.op == OpId::FusedConv && n.attrs.b("has_residual", false));
  ASSERT_TRUE(fused) << "the residual was not fused into the convolution";
  const std::string path = temp_path("cuda_residual");
  exe.save(path);
  const Array in = random_array({2, 16, 8, 8}, f16), res = random_array({2, 16, 8, 8}, f16);
  const Array want = exe.run({{"x", in}, {"residual", res}})[0];
  auto loaded = Executable::load(path, Device::cuda(0));
  expect_bitwise_equal(loaded.run({{"x", in}, {"residual", res}})[0], want, "fused residual");
  std::filesystem::remove(path);
}

TEST(Package, EveryAttributeKindRoundTrips) {
  Graph g;
  auto x = g.placeholder({4, 6}, f32, "x");
  auto a = gelu(x, GeluApprox::tanh);         // string
  auto b = cast(leaky_relu(a, 0.2), f64);     // double, dtype
  auto c = sum(b, {1}, true);                 // ints, bool
  auto d = softmax(transpose(b, {1, 0}), 0);  // int, ints
  // a floats attribute: no op takes one yet, and nodes keep attributes they do not read
  auto e = detail::make_node1(
      OpId::Relu, {x},
      {{"scales", std::vector<double>{0.5, -1.25, 3e300}}, {"flag", true}, {"kind", DType::bf16}});
  auto exe = g.compile(Device::cpu(), {}, {c, d, e}, CompileOptions{.optimize = false});
  bool seen_floats = false;
  for (auto& n : exe.impl().program.graph.nodes) seen_floats = seen_floats || n.attrs.has("scales");
  ASSERT_TRUE(seen_floats);
  round_trip(exe, {{"x", random_array({4, 6}, f32)}}, "attrs");
}

TEST(Package, MultipleOutputsFeedsConstantsAndRepeats) {
  Graph g;
  auto x = g.placeholder({3, 8}, f32, "x");
  auto k = g.constant(random_array({3, 8}, f32), "k");
  auto parts = split(add(x, k), 2, 1);
  auto [vals, idx] = topk(x, 3, 1);
  // returned: a split, top-k values and indices, the placeholder itself, a constant, a repeat
  auto exe = g.compile(Device::cpu(), {}, {parts[0], parts[1], vals, idx, x, k, parts[0]});
  auto loaded = round_trip(exe, {{"x", random_array({3, 8}, f32)}}, "multi");
  const auto names = loaded.outputs();
  ASSERT_EQ(names.size(), 7u);
  EXPECT_EQ(names[4].name, "x");
  EXPECT_EQ(names[5].name, "k");
}

TEST(Package, OutputNamesAndRunByNameOnly) {
  Graph g;
  auto x = g.placeholder({2, 2}, f32, "x");
  auto y = mul(x, x), z = add(x, x);
  auto exe = g.compile(Device::cpu(), {}, {y, z});
  const std::string path = temp_path("names");
  expect_error<ValueError>([&] { exe.save(path, {.output_names = {"only_one"}}); },
                           {"[package]", "1 output names", "2 returned"});
  expect_error<IoError>([&] { exe.save(testing::TempDir() + "no/such/dir/x.kiln"); },
                        {"[package]", "cannot open"});
  exe.save(path, {.output_names = {"square", "double"}});
  auto loaded = Executable::load(path, Device::cpu());
  std::filesystem::remove(path);
  EXPECT_EQ(loaded.outputs()[0].name, "square");
  EXPECT_EQ(loaded.outputs()[1].name, "double");
  // no source graph: tensors cannot feed it, names can
  expect_error<ValueError>(
      [&] {
        loaded.run(Feeds{{x, random_array({2, 2}, f32)}});
      },
      {"[run]", "by name"});
  expect_error<ValueError>(
      [&] {
        loaded.run(std::map<std::string, Array>{{"nope", random_array({2, 2}, f32)}});
      },
      {"[run]", "no placeholder named 'nope'"});
  expect_error<ValueError>([&] { loaded.run(std::map<std::string, Array>{}); },
                           {"[run]", "'x' has no feed"});
  expect_error<ShapeError>(
      [&] {
        loaded.run(std::map<std::string, Array>{{"x", random_array({3, 2}, f32)}});
      },
      {"[run]", "'x'", "(2, 2)", "(3, 2)"});
  // a package of a package is the same package
  const std::string again = temp_path("names_again");
  loaded.save(again);
  auto twice = Executable::load(again, Device::cpu());
  std::filesystem::remove(again);
  EXPECT_EQ(twice.outputs()[1].name, "double");
  expect_same_program(loaded, twice);
}

TEST(Package, LoadForMissingDeviceFails) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a GPU is present";
  Graph g;
  auto x = g.placeholder({2}, f32, "x");
  auto exe = g.compile(Device::cpu(), {}, {neg(x)});
  const std::string path = temp_path("nodevice");
  exe.save(path);
  expect_error<UnsupportedError>([&] { Executable::load(path, Device::cuda(0), {.strict = true}); },
                                 {"[package]", "compiled for cpu, loaded for cuda:0", "strict"});
  expect_error<UnsupportedError>([&] { Executable::load(path, Device::cuda(0)); },
                                 {"[device]", "cuda:0", "not available"});
  std::filesystem::remove(path);
}

// Training state: variables and Adam's moments are saved midway, and the loaded executable
// continues exactly where the uninterrupted one goes on.
TEST(Package, TrainingResumedFromPackageMatchesUninterruptedRun) {
  constexpr int N = 6, I = 4, H = 8, C = 3, kSteps = 10, kSaveAt = 4;
  const Array w1 = random_array({H, I}, f32), b1 = random_array({H}, f32);
  const Array w2 = random_array({C, H}, f32), b2 = random_array({C}, f32);
  std::vector<Array> xs, ys;
  for (int s = 0; s < kSteps; ++s) {
    xs.push_back(random_array({N, I}, f32, -2, 2));
    ys.push_back(random_ints({N}, 0, C - 1));
  }
  struct Model {
    Graph g;
    Executable exe;
  };
  auto build = [&](Model& m) {
    Graph& g = m.g;
    auto vw1 = g.variable(w1, "w1"), vb1 = g.variable(b1, "b1");
    auto vw2 = g.variable(w2, "w2"), vb2 = g.variable(b2, "b2");
    auto x = g.placeholder({N, I}, f32, "x");
    auto y = g.placeholder({N}, i64, "y");
    auto loss = softmax_cross_entropy(linear(tanh(linear(x, vw1, vb1)), vw2, vb2), y);
    std::vector<Tensor> params{vw1, vb1, vw2, vb2};
    auto step = optim::adam(g, params, gradients(loss, params), {.lr = 0.05});
    m.exe = g.compile(Device::cpu(), {}, {loss}, step);
  };
  auto feeds = [&](int s) { return std::map<std::string, Array>{{"x", xs[s]}, {"y", ys[s]}}; };

  Model full, part;
  build(full);
  build(part);
  std::vector<Array> want;
  for (int s = 0; s < kSteps; ++s) want.push_back(full.exe.run(feeds(s))[0]);

  for (int s = 0; s < kSaveAt; ++s)
    expect_bitwise_equal(part.exe.run(feeds(s))[0], want[s], "before");
  const std::string path = temp_path("training");
  part.exe.save(path);
  Executable resumed = Executable::load(path, Device::cpu());
  std::filesystem::remove(path);
  // Adam's moments and step count are variables too
  EXPECT_GT(resumed.variable_names().size(), 4u);
  for (int s = kSaveAt; s < kSteps; ++s)
    expect_bitwise_equal(resumed.run(feeds(s))[0], want[s], "step " + std::to_string(s));
  for (const char* v : {"w1", "b1", "w2", "b2"})
    expect_bitwise_equal(resumed.read_variable(v), full.exe.read_variable(v), v);
  // the loaded executable owns its variables: the graph it came from did not move on
  EXPECT_NE(std::memcmp(part.exe.read_variable("w1").data(), resumed.read_variable("w1").data(),
                        w1.nbytes()),
            0);
}

TEST(Package, VariablesCanBeReadAndWritten) {
  Graph g;
  auto v = g.variable(Array::from_vector<float>({1, 2, 3}, {3}), "v");
  auto x = g.placeholder({3}, f32, "x");
  auto exe = g.compile(Device::cpu(), {}, {add(x, v)}, {assign(v, mul(v, g.scalar(2)))});
  const std::string path = temp_path("vars");
  exe.save(path);
  auto loaded = Executable::load(path, Device::cpu());
  std::filesystem::remove(path);
  ASSERT_EQ(loaded.variable_names(), std::vector<std::string>{"v"});
  const Array zeros = Array::from_vector<float>({0, 0, 0}, {3});
  expect_equal(loaded.run(std::map<std::string, Array>{{"x", zeros}})[0], {3}, {1, 2, 3});
  expect_equal(loaded.read_variable("v"), {3}, {2, 4, 6});
  loaded.write_variable("v", Array::from_vector<float>({5, 6, 7}, {3}));
  expect_equal(loaded.run(std::map<std::string, Array>{{"x", zeros}})[0], {3}, {5, 6, 7});
  expect_error<ValueError>([&] { loaded.read_variable("w"); }, {"[read_variable]", "'w'"});
  expect_error<ShapeError>(
      [&] {
        loaded.write_variable("v", zeros.reshape({1, 3}));
      },
      {"[write_variable]", "'v'"});
  expect_error<DTypeError>([&] { loaded.write_variable("v", Array::zeros({3}, f64)); },
                           {"[write_variable]", "f64"});
  // the graph's own executable sees the graph's variable, untouched by the loaded one
  expect_equal(exe.read_variable("v"), {3}, {1, 2, 3});
}

}  // namespace
}  // namespace kiln
