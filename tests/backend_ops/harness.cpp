// Runs every registered case on the CPU and on the target device and compares the results.
// KILN_HARNESS_DEVICE names the target (default cuda:0); "cpu" compares the CPU with itself,
// which proves that every case builds, compiles and runs on a machine without a GPU.
#include "backend_ops/harness.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <numeric>
#include <optional>
#include <set>

#include "core/graph_impl.h"
#include "core/op_registry.h"
#include "kiln/kernel.h"

namespace kiln::harness {

// ---- registry ----

namespace {
std::map<OpId, OpCases>& registry() {
  static std::map<OpId, OpCases> r;
  return r;
}
}  // namespace

bool register_cases(OpCases cases) {
  const OpId op = cases.op;
  KILN_ASSERT(!registry().count(op));
  registry().emplace(op, std::move(cases));
  return true;
}

const OpCases* find_cases(OpId op) {
  auto it = registry().find(op);
  return it == registry().end() ? nullptr : &it->second;
}

DType first_dtype(const OpCases& oc) {
  if (!oc.dtypes.empty()) return oc.dtypes.front();
  const KernelEntry* k = find_kernel(oc.op, Backend::cpu);
  for (DType t : kHarnessTypes)
    if (k && k->handles(t) && (t == f32 || !k->handles(f32))) return t;
  return f32;
}

void expect_listed_failures(const std::function<std::string(const OpCases&, DType, int)>& check,
                            const std::map<OpId, const char*>& listed, const char* what,
                            int min_checked) {
  std::vector<std::string> unexpected, stale;
  int checked = 0;
  for (OpId op : kAllOps) {
    const OpCases* oc = find_cases(op);
    if (!oc) continue;  // Harness.EveryOpHasCases reports it
    const DType t = first_dtype(*oc);
    std::string failure;
    bool any = false;
    for (int i = 0; i < oc->num_cases && failure.empty(); ++i) {
      std::string m = check(*oc, t, i);
      if (m == "n/a") continue;
      any = true;
      if (!m.empty()) failure = fmt::format("case {} ({}): {}", i, name(t), m);
    }
    if (!any) continue;
    ++checked;
    const bool is_listed = listed.count(op) > 0;
    if (!failure.empty() && !is_listed)
      unexpected.push_back(std::string(op_name(op)) + ": " + failure);
    if (failure.empty() && is_listed) stale.push_back(op_name(op));
  }
  std::string all, s;
  for (auto& u : unexpected) all += "\n  " + u;
  EXPECT_TRUE(unexpected.empty()) << unexpected.size() << " " << what << ":" << all;
  for (auto& u : stale) s += " " + u;
  EXPECT_TRUE(stale.empty()) << "listed, but pass:" << s;
  EXPECT_GE(checked, min_checked);
}

// ---- data ----

void int_range(DType t, int64_t& lo, int64_t& hi) {
  lo = is_signed(t) ? -20 : 0;
  hi = is_signed(t) ? 20 : 40;
  if (t == boolean) lo = 0, hi = 1;
}

Array from_f64(const std::vector<double>& v, const Shape& shape, DType t) {
  return Array::from_vector(v, shape).astype(t);
}

Gen uniform(DType t, double lo, double hi) {
  return [=](const Shape& s) { return test::random_array(s, t, lo, hi); };
}

Gen off_ties(DType t, int64_t lo, int64_t hi) {
  return [=](const Shape& s) {
    std::uniform_int_distribution<int64_t> k(lo, hi);
    std::uniform_real_distribution<double> f(0.1, 0.4);
    std::bernoulli_distribution upper(0.5);
    std::vector<double> v(static_cast<size_t>(numel(s)));
    for (auto& x : v)
      x = static_cast<double>(k(test::rng())) + f(test::rng()) + (upper(test::rng()) ? 0.5 : 0);
    return from_f64(v, s, t);
  };
}

Gen with_nans(DType t, Gen base) {
  if (!is_floating(t)) return base;
  return [t, base](const Shape& s) {
    std::vector<double> v = test::to_f64(base(s));
    std::bernoulli_distribution nan(1.0 / 6);
    for (auto& x : v)
      if (nan(test::rng())) x = NAN;
    return from_f64(v, s, t);
  };
}

Shape shape_of(const std::function<Tensor(Graph&)>& f) {
  Graph g;
  return f(g).shape();
}

// ---- Case ----

Tensor Case::input(const Shape& shape, DType t, const Gen& gen, Layout layout) {
  Shape phys = shape;
  const int r = static_cast<int>(shape.size());
  if (layout == Layout::transposed) {
    KILN_ASSERT(r >= 2);
    std::swap(phys[r - 2], phys[r - 1]);
  } else if (layout == Layout::strided) {
    KILN_ASSERT(r >= 1);
    phys[r - 1] *= 2;
  }
  Tensor p = g.placeholder(dynamic_inputs ? Shape(phys.size(), -1) : phys, t,
                           "x" + std::to_string(feeds.size()));
  // (a dynamic case is fed the data of the same case built with static shapes)
  feeds.emplace_back(p, dynamic_inputs ? Array() : gen(phys));
  if (layout == Layout::transposed) {
    std::vector<int64_t> perm(r);
    for (int d = 0; d < r; ++d) perm[d] = d;
    std::swap(perm[r - 2], perm[r - 1]);
    return transpose(p, perm);
  }
  if (layout == Layout::strided)
    return slice(p, {0}, {dynamic_inputs ? INT64_MAX : phys[r - 1]}, {2}, {r - 1});
  return p;
}

Tensor Case::rand(const Shape& shape, DType t, Layout layout) {
  if (is_floating(t)) return rand(shape, t, -1, 1, layout);
  int64_t lo, hi;
  int_range(t, lo, hi);
  return rand(shape, t, static_cast<double>(lo), static_cast<double>(hi), layout);
}

Tensor Case::rand(const Shape& shape, DType t, double lo, double hi, Layout layout) {
  return input(shape, t, uniform(t, lo, hi), layout);
}

Tensor Case::nonzero(const Shape& shape, DType t, double min_abs, double max_abs, Layout layout) {
  if (!is_signed(t))
    return input(shape, t, uniform(t, std::max(1.0, min_abs), std::max(2.0, max_abs)), layout);
  return input(
      shape, t, [=](const Shape& s) { return test::random_nonzero(s, t, min_abs, max_abs); },
      layout);
}

Tensor Case::variable(const Shape& shape, DType t) {
  std::vector<double> init(static_cast<size_t>(numel(shape)));
  for (size_t j = 0; j < init.size(); ++j) init[j] = 0.5 + 0.25 * static_cast<double>(j * 37 % 23);
  return g.variable(from_f64(init, shape, t), "v");
}

Tensor Case::ints(const Shape& shape, int64_t lo, int64_t hi, DType t, Layout layout) {
  return input(
      shape, t, [=](const Shape& s) { return test::random_ints(s, lo, hi, t); }, layout);
}

Tensor Case::distinct(const Shape& shape, DType t, Layout layout) {
  if (!is_floating(t)) return rand(shape, t, layout);
  return input(
      shape, t,
      [=](const Shape& s) {
        // Blocks of shuffled integers centred on 0, scaled by a power of two: exact in the dtype.
        // A block is the whole array when the dtype holds that many distinct integers, else the
        // last two dims, else the last dim.
        const int64_t exact = t == bf16 ? 513 : t == f16 ? 4097 : int64_t{1} << 24;
        const int r = static_cast<int>(s.size());
        const int64_t n = numel(s), last = r ? s[r - 1] : 1, last2 = r > 1 ? last * s[r - 2] : last;
        const int64_t block = n <= exact ? n : last2 <= exact ? last2 : last;
        std::vector<double> v;
        std::vector<int64_t> perm(static_cast<size_t>(block));
        double scale = 1;
        while (scale < static_cast<double>(block / 2)) scale *= 2;
        for (int64_t b = 0; block && b < n / block; ++b) {
          std::iota(perm.begin(), perm.end(), int64_t{0});
          std::shuffle(perm.begin(), perm.end(), test::rng());
          for (int64_t x : perm) v.push_back(static_cast<double>(x - block / 2) / scale);
        }
        return from_f64(v, s, t);
      },
      layout);
}

// ---- the target ----

Device target_device() {
  const char* s = std::getenv("KILN_HARNESS_DEVICE");
  return Device::parse(s && *s ? s : "cuda:0");
}

// Why the target cannot run here ("" when it can).
std::string target_unavailable() {
  const Device d = target_device();
  if (d.kind != Device::Kind::cuda) return "";
  const int n = cuda_device_count();
  if (n == 0)
    return fmt::format(
        "target {} but no CUDA device is visible (set KILN_HARNESS_DEVICE=cpu to "
        "exercise the cases on the CPU)",
        d.str());
  if (d.index >= n) return fmt::format("target {} but only {} CUDA devices", d.str(), n);
  return "";
}

namespace {
Backend backend_of(Device d) { return d.kind == Device::Kind::cuda ? Backend::cuda : Backend::cpu; }

struct Stats {
  int cases = 0, passed = 0, failed = 0, skipped = 0;
};
Stats& stats() {
  static Stats s;
  return s;
}

struct SummaryPrinter : ::testing::Environment {
  void TearDown() override {
    const Stats& s = stats();
    std::printf("backend_ops: %d cases, %d passed, %d failed, %d skipped\n", s.cases, s.passed,
                s.failed, s.skipped);
  }
};
const auto* kSummary = ::testing::AddGlobalTestEnvironment(new SummaryPrinter);

// Each op's cases return the device memory they cached when they end: the harness runs in
// several processes side by side on one GPU (scripts/test-gpu.sh), and blocks one process keeps
// cached after its largest case would starve the others' launches.
struct ReturnCachedMemory : ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo&) override {
    if (target_device().kind == Device::Kind::cuda && target_unavailable().empty())
      empty_cache(target_device());
  }
};
const bool kReturnCached = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new ReturnCachedMemory);
  return true;
}();

std::string show(double v) { return fmt::format("{:.9g}", v); }
}  // namespace

// ---- comparison ----

// "" when `got` matches `want` (exact for integer and bool dtypes); else the first mismatching
// element and the number of them.
std::string compare(const Array& want, const Array& got, double tol) {
  if (want.dtype() != got.dtype())
    return fmt::format("dtype {} on the CPU, {} on the target", name(want.dtype()),
                       name(got.dtype()));
  if (want.shape() != got.shape())
    return fmt::format("shape {} on the CPU, {} on the target", to_string(want.shape()),
                       to_string(got.shape()));
  const std::vector<double> e = test::to_f64(want), a = test::to_f64(got);
  const bool exact = !is_floating(want.dtype());
  double mean_abs = 0;
  int64_t finite = 0;
  for (double v : e)
    if (std::isfinite(v)) mean_abs += std::fabs(v), ++finite;
  mean_abs = finite ? mean_abs / static_cast<double>(finite) : 0;
  mean_abs = std::max(mean_abs, 1e-30);
  int64_t bad = 0, first = -1;
  for (size_t i = 0; i < e.size(); ++i) {
    bool ok;
    if (std::isnan(e[i]))  // (the 8-bit floats compare exactly, NaNs too)
      ok = std::isnan(a[i]);
    else if (exact || std::isinf(e[i])) ok = a[i] == e[i];
    else
      ok = std::fabs(a[i] - e[i]) <= tol * (std::fabs(e[i]) + mean_abs);
    if (!ok && bad++ == 0) first = static_cast<int64_t>(i);
  }
  if (!bad) return "";
  std::string idx;
  for (int64_t k : test::unravel(first, want.shape()))
    idx += (idx.empty() ? "" : ", ") + std::to_string(k);
  return fmt::format(
      "{} of {} elements differ; first at [{}] (flat {}): cpu {}, target {} "
      "(tolerance {} relative to |cpu| + mean |cpu| {})",
      bad, e.size(), idx, first, show(e[first]), show(a[first]), exact ? 0.0 : tol, show(mean_abs));
}

namespace {

FeedShapes shapes_of(const Feeds& feeds) {
  FeedShapes s;
  for (auto& [t, a] : feeds) s.emplace_back(t, a.shape());
  return s;
}

// Runs `outs` on the CPU and on the target; "" when every output agrees.
std::string run_both(const Graph& g, const Feeds& feeds, const std::vector<Tensor>& outs,
                     double tol_scale) {
  // no optimization: constant folding would evaluate the op under test on the CPU
  const CompileOptions cpu_opts{.optimize = false};
  const CompileOptions target_opts{.optimize = false, .strict_placement = true};
  std::vector<Array> want;
  try {
    for (const Array& a : g.compile(Device::cpu(), shapes_of(feeds), outs, cpu_opts).run(feeds))
      want.push_back(a.copy());
  } catch (const std::exception& e) {
    return std::string("CPU run threw: ") + e.what();
  }
  // a GPU target runs twice: the second run replays the first one's recording (unless
  // KILN_CAPTURE=0), so both ways of running are checked
  const int runs = target_device().kind == Device::Kind::cpu ? 1 : 2;
  std::vector<std::vector<Array>> got(runs);
  try {
    Executable exe = g.compile(target_device(), shapes_of(feeds), outs, target_opts);
    for (int r = 0; r < runs; ++r)
      for (const Array& a : exe.run(feeds)) got[r].push_back(a.to(Device::cpu()).copy());
  } catch (const std::exception& e) {
    return std::string("target run threw: ") + e.what();
  }
  std::string msg;
  for (int r = 0; r < runs; ++r) {
    if (want.size() != got[r].size())
      return fmt::format("{} outputs on the CPU, {} on the target", want.size(), got[r].size());
    for (size_t k = 0; k < want.size(); ++k) {
      const double tol =
          is_floating(want[k].dtype()) ? test::tolerance(want[k].dtype()) * tol_scale : 0;
      std::string m = compare(want[k], got[r][k], tol);
      if (!m.empty())
        msg += fmt::format("{}{}output {}: {}", msg.empty() ? "" : "\n",
                           r ? "second (replayed) run, " : "", k, m);
    }
  }
  return msg;
}

// The gradient graph of sum_k sum(out_k * w_k) with respect to every float input, or nullopt
// when there is nothing to differentiate.
struct GradCase {
  Feeds feeds;
  std::vector<Tensor> grads;
};
std::optional<GradCase> gradient_case(Case& c) {
  std::vector<Tensor> xs;
  for (auto& [t, a] : c.feeds)
    if (is_floating(a.dtype())) xs.push_back(t);
  GradCase gc{c.feeds, {}};
  std::optional<Tensor> loss;
  for (const Tensor& o : c.outs) {
    if (!is_floating(o.dtype())) continue;
    Tensor w = c.g.placeholder(o.shape(), o.dtype(), "w" + std::to_string(gc.feeds.size()));
    gc.feeds.emplace_back(w, test::random_array(o.shape(), o.dtype(), -1, 1));
    Tensor term = sum(o * w);
    loss = loss ? *loss + term : term;
  }
  if (xs.empty() || !loss) return std::nullopt;
  gc.grads = gradients(*loss, xs);
  return gc;
}

// KILN_HARNESS_DTYPES ("f32,f16"): only these dtypes (for the sanitizers' slower runs); unset:
// every dtype.
bool dtype_selected(DType t) {
  static const std::set<DType> only = [] {
    std::set<DType> r;
    const char* s = std::getenv("KILN_HARNESS_DTYPES");
    std::string list = s ? s : "";
    for (size_t at = 0; at < list.size();) {
      const size_t end = std::min(list.find(',', at), list.size());
      if (end > at) r.insert(parse_dtype(list.substr(at, end - at)));
      at = end + 1;
    }
    return r;
  }();
  return only.empty() || only.count(t);
}

std::vector<DType> dtypes_of(const OpCases& oc) {
  std::vector<DType> r;
  const KernelEntry* k = find_kernel(oc.op, Backend::cpu);
  for (DType t : oc.dtypes.empty()
                     ? std::vector<DType>(std::begin(kHarnessTypes), std::end(kHarnessTypes))
                     : oc.dtypes)
    if ((!oc.dtypes.empty() || (k && k->handles(t))) && dtype_selected(t)) r.push_back(t);
  return r;
}

bool grad_dtype(DType t) { return t == f32 || t == f16; }

// (and shape_of, a constant once shapes are specialized: no backend runs it)
bool is_source(OpId op) {
  return op == OpId::Placeholder || op == OpId::Constant || op == OpId::Variable ||
         op == OpId::ShapeOf;
}

// The ops of g other than `op` that backend b has no kernel for: cases that need them (for a
// transposed input, a gradient) are skipped rather than failed; CudaKernelCoverage lists them.
std::set<std::string> missing_helpers(const Graph& g, OpId op, Backend b) {
  std::set<std::string> r;
  for (const auto& n : g.impl().nodes)
    if (!is_source(n.op) && n.op != op && !find_kernel(n.op, b)) r.insert(op_name(n.op));
  return r;
}

void run_op(OpId op) {
  const OpCases* oc = find_cases(op);
  ASSERT_NE(oc, nullptr) << op_name(op) << " has no cases (see Harness.EveryOpHasCases)";
  const std::string unavailable = target_unavailable();
  const Backend backend = backend_of(target_device());
  const KernelEntry* target_kernel = find_kernel(op, backend);
  const bool differentiable = op_def(op).grad_kind == GradKind::rule;
  Stats& s = stats();
  int ran = 0, skipped = 0;
  std::vector<std::string> no_kernel;
  std::set<std::string> helpers;  // missing kernels of other ops that made cases skip
  auto skip_for_helpers = [&](const Graph& g) {
    auto m = missing_helpers(g, op, backend);
    helpers.insert(m.begin(), m.end());
    return !m.empty();
  };
  for (DType t : dtypes_of(*oc)) {
    const bool has_kernel = target_kernel && target_kernel->handles(t);
    if (!has_kernel) no_kernel.push_back(name(t));
    for (int i = 0; i < oc->num_cases; ++i) {
      Case c;
      const std::string where = fmt::format("{} {} case {}", op_name(op), name(t), i);
      bool applies;
      try {
        applies = oc->build(c, t, i);
      } catch (const std::exception& e) {
        ++s.cases, ++s.failed;
        ADD_FAILURE() << where << ": the builder threw: " << e.what();
        continue;
      }
      if (!applies) continue;
      SCOPED_TRACE(where + " (" + c.label + ")");
      const bool with_grad = differentiable && c.grad && grad_dtype(t);
      const int n = with_grad ? 2 : 1;  // the gradient counts as a case of its own
      s.cases += n;
      if (!unavailable.empty() || !has_kernel || skip_for_helpers(c.g)) {
        s.skipped += n, skipped += n;
        continue;
      }
      ++ran;
      std::string m = run_both(c.g, c.feeds, c.outs, c.tol_scale);
      if (m.empty())
        ++s.passed;
      else
        ++s.failed, ADD_FAILURE() << where << " (" << c.label << "): " << m << " (seed "
                                  << test::seed() << ")";
      if (!with_grad) continue;
      std::optional<GradCase> gc;
      try {
        gc = gradient_case(c);
      } catch (const std::exception& e) {
        ++s.failed;
        ADD_FAILURE() << where << " gradient (" << c.label << "): building it threw: " << e.what();
        continue;
      }
      if (!gc || skip_for_helpers(c.g)) {  // nothing to differentiate, or kernels missing
        ++s.skipped, ++skipped;
        continue;
      }
      m = run_both(c.g, gc->feeds, gc->grads, c.tol_scale * 2);
      if (m.empty())
        ++s.passed;
      else
        ++s.failed, ADD_FAILURE() << where << " gradient (" << c.label << "): " << m << " (seed "
                                  << test::seed() << ")";
    }
  }
  if (!unavailable.empty()) GTEST_SKIP() << unavailable;
  const std::string why = fmt::format(
      "{}{}{}",
      no_kernel.empty()
          ? ""
          : fmt::format("no {} kernel for {}", backend_name(backend), fmt::join(no_kernel, " ")),
      !no_kernel.empty() && !helpers.empty() ? "; " : "",
      helpers.empty() ? ""
                      : fmt::format("cases also need {} (no {} kernel)", fmt::join(helpers, ", "),
                                    backend_name(backend)));
  if (skipped)
    std::printf("[backend_ops] %s: %d cases skipped: %s\n", op_name(op), skipped, why.c_str());
  if (dtypes_of(*oc).empty()) GTEST_SKIP() << op_name(op) << ": no dtype of KILN_HARNESS_DTYPES";
  if (ran == 0) GTEST_SKIP() << op_name(op) << ": every case skipped: " << why;
}

std::vector<OpId> tested_ops() {
  std::vector<OpId> r;
  for (OpId op : kAllOps)
    if (!is_source(op)) r.push_back(op);
  return r;
}

}  // namespace
}  // namespace kiln::harness

namespace kiln {
// Test names and messages show the op's name, not its bytes.
void PrintTo(OpId op, std::ostream* os) { *os << op_name(op); }
}  // namespace kiln

namespace kiln::harness {
namespace {

class BackendOps : public ::testing::TestWithParam<OpId> {};

TEST_P(BackendOps, MatchesCpu) { run_op(GetParam()); }

INSTANTIATE_TEST_SUITE_P(Op, BackendOps, ::testing::ValuesIn(tested_ops()),
                         [](const ::testing::TestParamInfo<OpId>& p) {
                           return std::string(op_pascal_name(p.param));
                         });

// Ops that stay on the CPU by design (the placement pass falls back to the CPU for them), exempt
// from CudaKernelCoverage: fused_matmul, which only the CPU's compile makes (a CPU package placed
// on a GPU runs it on the CPU). Every other op gets CUDA kernels for f32, f16 and bf16.
constexpr std::array<OpId, 1> kCpuOnly{OpId::FusedMatmul};

bool cpu_only(OpId op) { return std::find(kCpuOnly.begin(), kCpuOnly.end(), op) != kCpuOnly.end(); }

TEST(Harness, ComparisonNamesTheFirstMismatch) {
  const Array a = from_f64({1, 2, 3, 4, 5, 6}, {2, 3}, f32);
  EXPECT_EQ(compare(a, a.copy(), 1e-5), "");
  const Array b = from_f64({1, 2, 3, 4, 5.5, 6}, {2, 3}, f32);
  const std::string m = compare(a, b, 1e-5);
  EXPECT_NE(m.find("1 of 6 elements differ; first at [1, 1] (flat 4): cpu 5, target 5.5"),
            std::string::npos)
      << m;
  EXPECT_NE(compare(from_f64({1, 2}, {2}, i32), from_f64({1, 3}, {2}, i32), 0), "");
  EXPECT_NE(compare(a, a.astype(f16), 1e-5), "");
  EXPECT_EQ(compare(from_f64({NAN, 1}, {2}, f32), from_f64({NAN, 1}, {2}, f32), 1e-5), "");
}

TEST(Harness, EveryOpHasCases) {
  for (OpId op : tested_ops()) {
    const OpCases* oc = find_cases(op);
    if (!oc) {
      ADD_FAILURE() << op_name(op) << " has no registration in tests/backend_ops/";
      continue;
    }
    // every dtype the op takes gets at least one case
    for (DType t : dtypes_of(*oc)) {
      int n = 0;
      for (int i = 0; i < oc->num_cases; ++i) {
        Case c;
        try {
          n += oc->build(c, t, i);
        } catch (const std::exception& e) {
          ADD_FAILURE() << op_name(op) << " " << name(t) << " case " << i << ": " << e.what();
        }
      }
      EXPECT_GT(n, 0) << op_name(op) << " has no case for dtype " << name(t);
    }
  }
}

TEST(Harness, CudaKernelCoverage) {
  std::vector<std::string> missing;
  for (OpId op : tested_ops()) {
    const KernelEntry* cpu = find_kernel(op, Backend::cpu);
    const KernelEntry* cuda = find_kernel(op, Backend::cuda);
    std::string lacks;
    for (DType t : {f32, f16, bf16})
      if (cpu && cpu->handles(t) && !(cuda && cuda->handles(t)))
        lacks += std::string(" ") + name(t);
    if (lacks.empty()) continue;
    std::printf("[backend_ops] no CUDA kernel: %s:%s%s\n", op_name(op), lacks.c_str(),
                cpu_only(op) ? " (CPU only by design)" : "");
    if (!cpu_only(op)) missing.push_back(op_name(op));
  }
  const std::string unavailable = target_unavailable();
  if (target_device().kind != Device::Kind::cuda)
    GTEST_SKIP() << missing.size() << " ops lack CUDA kernels (listed above); the target is "
                 << target_device().str();
  if (!unavailable.empty()) GTEST_SKIP() << unavailable;
  EXPECT_TRUE(missing.empty()) << missing.size() << " ops lack CUDA kernels for f32/f16/bf16: "
                               << fmt::format("{}", fmt::join(missing, ", "));
}

}  // namespace
}  // namespace kiln::harness
