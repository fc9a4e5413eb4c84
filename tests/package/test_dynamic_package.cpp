// Packages of dynamic executables: the program before any pass with its dynamic dims, dim names
// and ranges, specialized per feed shape after loading; and the reader's checks of such files.
#include "core/op_id.h"
#include "package/package_bytes.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
namespace fb = package::fb;

struct DynamicModel {
  Graph g;
  Tensor x, mask, y;
  DynamicModel() {
    x = g.placeholder({-1, -1, 6}, f32, "x", {{0, "batch", 1, 8}, {1, "seq"}});
    mask = g.placeholder({-1, -1}, f32, "mask", {{0, "batch"}, {1, "seq"}});
    auto w = g.variable(random_array({6, 4}, f32), "w");
    auto b = g.constant(random_array({4}, f32));
    y = relu(matmul(x, w) + b) * expand_dims(mask, {-1});
  }
};

Executable load(const Bytes& b, const LoadOptions& o = {}) {
  return Executable::load_bytes(b.data(), b.size(), default_device(), o);
}

// A cache that a loaded package appends any number of rows to, in place (assign_slice at a fed
// start); the package holds the cache's value as saved, and the loaded one moves on by itself.
TEST(DynamicPackage, AppendsToAVariableInPlaceAfterLoading) {
  Graph g;
  const Array init = random_array({10, 3}, f32);
  auto cache = g.variable(init, "cache");
  auto rows = g.placeholder({-1, 3}, f32, "rows");
  auto start = g.placeholder({2}, i64, "start");
  auto exe = g.compile(default_device(), {}, {}, {assign_slice(cache, rows, start)});
  auto loaded = load(saved_bytes(exe, "append"));
  ASSERT_TRUE(loaded.is_dynamic());
  std::vector<double> want = to_f64(init);
  int64_t at = 0;
  for (int64_t n : {2, 1, 4}) {
    const Array r = random_array({n, 3}, f32);
    loaded.run(std::map<std::string, Array>{{"rows", r},
                                            {"start", Array::from_vector<int64_t>({at, 0}, {2})}});
    const std::vector<double> rv = to_f64(r);
    std::copy(rv.begin(), rv.end(), want.begin() + at * 3);
    at += n;
    expect_equal(loaded.read_variable("cache"), {10, 3}, want);
  }
  expect_error<ValueError>(
      [&] {
        loaded.run(
            std::map<std::string, Array>{{"rows", random_array({4, 3}, f32)},
                                         {"start", Array::from_vector<int64_t>({7, 0}, {2})}});
      },
      {"[assign_slice]", "'cache'", "(10, 3)", "start 7 of dim 0", "[0, 6]"});
  expect_equal(exe.read_variable("cache"), {10, 3}, to_f64(init));  // the graph's own: untouched
}

TEST(DynamicPackage, RoundTripsAndRunsAnyShapeItsDimsAllow) {
  DynamicModel m;
  CompileOptions o;
  o.max_specializations = 3;
  auto exe = m.g.compile(default_device(), {}, {m.y}, o);
  exe.run({{m.x, random_array({2, 3, 6}, f32)}, {m.mask, random_array({2, 3}, f32)}});
  const Bytes bytes = saved_bytes(exe, "dynamic");
  EXPECT_EQ(get<uint32_t>(bytes, package::header::min_reader_version), 2u);
  auto loaded = load(bytes);
  ASSERT_TRUE(loaded.is_dynamic());
  EXPECT_EQ(loaded.inputs()[0].shape, (Shape{-1, -1, 6}));
  EXPECT_EQ(loaded.outputs()[0].shape, (Shape{-1, -1, 4}));
  EXPECT_EQ(loaded.shape_cache().max_entries, 3u);
  EXPECT_EQ(loaded.variable_names(), std::vector<std::string>{"w"});
  for (auto [n, l] : {std::pair<int64_t, int64_t>{1, 7}, {4, 2}, {1, 7}}) {
    const Array xv = random_array({n, l, 6}, f32), mv = random_array({n, l}, f32);
    const Array want = exe.run({{m.x, xv}, {m.mask, mv}})[0].to(Device::cpu());
    const Array got =
        loaded.run(std::map<std::string, Array>{{"x", xv}, {"mask", mv}})[0].to(Device::cpu());
    expect_equal(got, {n, l, 4}, to_f64(want));
  }
  EXPECT_EQ(loaded.shape_cache().misses, 2);
  EXPECT_EQ(loaded.shape_cache().hits, 1);
  // names and ranges hold after loading
  expect_error<ShapeError>(
      [&] {
        loaded.run(std::map<std::string, Array>{{"x", random_array({9, 2, 6}, f32)},
                                                {"mask", random_array({9, 2}, f32)}});
      },
      {"[run] input 'x' dim 0 ('batch') must be in [1, 8] but the feed has 9"});
  expect_error<ShapeError>(
      [&] {
        loaded.run(std::map<std::string, Array>{{"x", random_array({2, 3, 6}, f32)},
                                                {"mask", random_array({2, 4}, f32)}});
      },
      {"[run] input 'mask' dim 1 is 'seq' = 3 (from 'x') but the feed has 4"});
  // saved again from the loaded one: the same file
  EXPECT_EQ(saved_bytes(loaded, "dynamic_again").size(), bytes.size());
}

// Batch buckets travel with the dims' names and ranges.
TEST(DynamicPackage, BucketsRoundTrip) {
  Graph g;
  auto x = g.placeholder({-1, 4}, f32, "x", {{0, "batch", 1, 32, {8, 16}}});
  auto exe = g.compile(default_device(), {}, {x * 3.0});
  auto loaded = load(saved_bytes(exe, "buckets"));
  ASSERT_EQ(loaded.inputs()[0].dims.size(), 1u);
  EXPECT_EQ(loaded.inputs()[0].dims[0].buckets, (std::vector<int64_t>{8, 16}));
  for (int64_t n : {3, 7, 12}) {
    const Array xv = random_array({n, 4}, f32);
    auto want = to_f64(xv);
    for (double& v : want) v *= 3;
    expect_close(loaded.run(std::map<std::string, Array>{{"x", xv}})[0].to(Device::cpu()), {n, 4},
                 want, 1e-6);
  }
  EXPECT_EQ(loaded.shape_cache().misses, 2);  // buckets 8 and 16
}

// Shape arithmetic travels in the file as nodes (shape_of, the integer ops on it, the reshape
// that reads its value) and is computed again for each shape after loading.
TEST(DynamicPackage, ShapeArithmeticRoundTrips) {
  Graph g;
  auto x = g.placeholder({-1, -1, 6}, f32, "x");
  auto s = shape_of(x);
  auto i64v = [&](std::vector<int64_t> v) {
    const auto n = static_cast<int64_t>(v.size());
    return g.constant(Array::from_vector(v, {n}));
  };
  auto b = gather(s, i64v({0})), l = gather(s, i64v({1}));
  auto y = reshape_to(x, concat({b, l * i64v({6})})) + full(concat({b, i64v({1})}), 0.5, f32);
  auto exe = g.compile(default_device(), {}, {y});
  exe.run({{x, random_array({2, 3, 6}, f32)}});
  auto loaded = load(saved_bytes(exe, "shape_values"));
  ASSERT_TRUE(loaded.is_dynamic());
  for (auto [n, len] : {std::pair<int64_t, int64_t>{1, 7}, {4, 2}}) {
    const Array xv = random_array({n, len, 6}, f32);
    std::vector<double> want = to_f64(xv);
    for (double& v : want) v += 0.5;
    const Array got = loaded.run(std::map<std::string, Array>{{"x", xv}})[0].to(Device::cpu());
    expect_close(got, {n, len * 6}, want, 1e-6);
  }
}

// Edits a copy of `bytes` with `edit`, fixes the checksums and expects a FormatError with `what`.
void expect_rejected(const Bytes& bytes, const std::function<void(fb::Manifest&)>& edit,
                     const std::vector<std::string>& what) {
  Bytes b = bytes;
  edit(*manifest(b));
  fix_checksums(b);
  expect_error<FormatError>([&] { load(b); }, what);
}

fb::Node* node_of(fb::Manifest& m, OpId op) {
  for (uint32_t i = 0; i < m.nodes()->size(); ++i)
    if (m.nodes()->Get(i)->op() == static_cast<uint16_t>(op))
      return m.mutable_nodes()->GetMutableObject(i);
  return nullptr;
}

TEST(DynamicPackage, TheReaderChecksItsDims) {
  DynamicModel m;
  const Bytes dyn = saved_bytes(m.g.compile(default_device(), {}, {m.y}), "dyn");
  // a constant of dynamic shape
  expect_rejected(dyn,
                  [](fb::Manifest& fm) {
                    node_of(fm, OpId::Constant)
                        ->mutable_outputs()
                        ->GetMutableObject(0)
                        ->mutable_shape()
                        ->Mutate(0, -1);
                  },
                  {"[package]", "a constant or variable of dynamic shape"});
  // a range that is empty
  expect_rejected(dyn,
                  [](fb::Manifest& fm) {
                    fb::Node* ph = node_of(fm, OpId::Placeholder);
                    for (uint32_t k = 0; k < ph->attrs()->size(); ++k)
                      if (ph->attrs()->Get(k)->key()->str() == "dim_min")
                        ph->mutable_attrs()->GetMutableObject(k)->mutable_ints()->Mutate(0, 99);
                  },
                  {"[package]", "placeholder", "dim 0 has the empty or negative range [99, 8]"});
  // a static package claiming to be dynamic: it has a plan and steps
  Graph g;
  auto x = g.placeholder({2, 3}, f32, "x");
  const Bytes fixed = saved_bytes(g.compile(default_device(), {}, {relu(x)}), "fixed");
  EXPECT_EQ(get<uint32_t>(fixed, package::header::min_reader_version), 1u);
  expect_rejected(
      fixed, [](fb::Manifest& fm) { fm.mutable_metadata()->mutate_dynamic(true); },
      {"[package]", "a dynamic package holds no plan, steps, tuning, kernels or laid-out weights"});
  // and -1 dims are refused in static packages
  expect_rejected(fixed,
                  [](fb::Manifest& fm) {
                    node_of(fm, OpId::Placeholder)
                        ->mutable_outputs()
                        ->GetMutableObject(0)
                        ->mutable_shape()
                        ->Mutate(0, -1);
                  },
                  {"[package]", "has a negative dim"});
}

// kiln inspect shows the dims' names and ranges; kiln run takes any shape they allow, giving
// named dims of inputs without a shape the size of the same name elsewhere.
TEST(DynamicPackage, CliInspectsAndRunsAnyShape) {
  if (!std::filesystem::exists(KILN_CLI)) GTEST_SKIP() << KILN_CLI << " is not there";
  DynamicModel m;
  const std::string dir = testing::TempDir() + "kiln_dyn_cli_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string pkg = dir + "/model.kiln", log = dir + "/log";
  m.g.compile(Device::cpu(), {}, {m.y}).save(pkg);
  auto cli = [&](const std::string& args) {
    const int rc =
        std::system((std::string(KILN_CLI) + " " + args + " > '" + log + "' 2>&1").c_str());
    std::ifstream in(log);
    return std::pair{rc, std::string(std::istreambuf_iterator<char>(in), {})};
  };
  auto [rc, out] = cli("inspect '" + pkg + "'");
  EXPECT_EQ(rc, 0) << out;
  for (const char* part :
       {"(batch=?, seq=?, 6)", "batch in [1, 8]", "(batch=?, seq=?)", "dynamic:"})
    EXPECT_NE(out.find(part), std::string::npos) << part << "\n" << out;
  std::tie(rc, out) =
      cli("run '" + pkg + "' --device cpu --shape x=3,5,6 --output-dir '" + dir + "'");
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("(3, 5, 4)"), std::string::npos) << out;  // the mask took batch and seq
  std::tie(rc, out) =
      cli("run '" + pkg + "' --device cpu --shape x=9,5,6 --output-dir '" + dir + "'");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("dim 0 ('batch') must be in [1, 8] but the feed has 9"), std::string::npos)
      << out;
  std::tie(rc, out) =
      cli("run '" + pkg + "' --device cpu --shape x=3,5 --output-dir '" + dir + "'");
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--shape x: shape (3, 5) does not fit the input (batch=?, seq=?, 6)"),
            std::string::npos)
      << out;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln
