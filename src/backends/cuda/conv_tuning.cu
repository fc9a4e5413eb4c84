// The conv family's tuning records (tuning.h): the choices of the plan cache (conv_algo.cu) and
// of the channels_last path (conv_nhwc.cu) exported to packages, and seeds imported from them.
#include <algorithm>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "backends/cuda/conv_internal.h"

namespace kiln::cuda {

namespace {

using namespace conv_detail;

// ---- tuning records (tuning.h) ----

constexpr size_t kKeySize = 24, kValueSize = 3;
constexpr uint16_t kNhwcKind = 3;  // an f16/bf16 channels_last forward problem's way (tuning.h)
constexpr size_t kNhwcKeySize = kKeySize + 3;

int algo_count(Pass pass) {
  switch (pass) {
    case Pass::forward:
      return CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    case Pass::backward_data:
      return CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
    case Pass::backward_filter:
      return CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  }
  return 0;
}

// Why a record of a conv pass is not one this backend could have chosen (empty: it could).
std::string check_record(const TuningRecord& r) {
  const auto pass = static_cast<Pass>(r.kind);
  if (r.key.size() != kKeySize || r.value.size() != kValueSize)
    return fmt::format("{} key and {} value entries; a convolution record has {} and {}",
                       r.key.size(), r.value.size(), kKeySize, kValueSize);
  const int64_t algo = r.value[0], math = r.value[1], ws = r.value[2];
  const bool tf32 = r.key[0] == static_cast<int64_t>(DType::f32) + kTf32Key;
  const int64_t t = tf32 ? static_cast<int64_t>(DType::f32) : r.key[0];
  if (t != static_cast<int64_t>(DType::f32) && t != static_cast<int64_t>(DType::f64) &&
      t != static_cast<int64_t>(DType::f16) && t != static_cast<int64_t>(DType::bf16))
    return fmt::format("dtype {} is not one cuDNN convolutions take", t);
  if (algo < 0 || algo >= algo_count(pass))
    return fmt::format("algorithm {} is not one of cuDNN's {}", algo, algo_count(pass));
  if (math != CUDNN_DEFAULT_MATH && math != CUDNN_TENSOR_OP_MATH &&
      math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION && math != CUDNN_FMA_MATH)
    return fmt::format("unknown math type {}", math);
  if (t == static_cast<int64_t>(DType::f64) && !exact(pass, static_cast<int>(algo)))
    return fmt::format("algorithm {} does not sum exactly, as f64 needs", algo);
  if (t == static_cast<int64_t>(DType::f32) && !tf32 && math != CUDNN_FMA_MATH)
    return fmt::format("f32 with math type {} instead of FMA", math);
  if (ws < 0 || static_cast<uint64_t>(ws) > kMaxWorkspace)
    return fmt::format("a workspace of {} bytes", ws);
  return {};
}

// Why a kind-3 record (an NHWC problem's way) is not one this backend could have made.
std::string check_nhwc_record(const TuningRecord& r) {
  if (r.key.size() != kNhwcKeySize || r.value.size() < 3)
    return fmt::format("{} key and {} value entries; an NHWC record has {} and at least 3",
                       r.key.size(), r.value.size(), kNhwcKeySize);
  const int64_t t = r.key[0];
  if (t != static_cast<int64_t>(DType::f16) && t != static_cast<int64_t>(DType::bf16))
    return fmt::format("dtype {} is not f16 or bf16", t);
  if (r.key[1] != 2 + 8) return fmt::format("{} is not the NHWC 2-D marker 10", r.key[1]);
  for (size_t i = kKeySize; i < kNhwcKeySize; ++i)
    if (r.key[i] != 0 && r.key[i] != 1) return fmt::format("epilogue flag {}", r.key[i]);
  const int64_t engine = r.value[0], fused = r.value[1], ws = r.value[2];
  if (engine < -1) return fmt::format("engine {}", engine);
  if (engine == -1 && r.value.size() != 3) return "a legacy choice with knobs";
  if (fused != 0 && fused != 1) return fmt::format("fused flag {}", fused);
  if (ws < 0 || static_cast<uint64_t>(ws) > kMaxWorkspace)
    return fmt::format("a workspace of {} bytes", ws);
  for (size_t i = 3; i < r.value.size(); ++i)
    if (static_cast<uint64_t>(r.value[i]) >> kKnobShift >= CUDNN_KNOB_TYPE_COUNTS)
      return fmt::format("knob type {}", static_cast<uint64_t>(r.value[i]) >> kKnobShift);
  return {};
}

}  // namespace

TuningIdentity conv_tuning_identity(int device) {
  static std::mutex mu;
  static std::map<int, TuningIdentity> known;  // asked once per device: loads ask every time
  std::lock_guard<std::mutex> l(mu);
  if (auto it = known.find(device); it != known.end()) return it->second;
  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, device));
  return known[device] = {prop.name, fmt::format("sm_{}{}", prop.major, prop.minor),
                          fmt::format("cudnn {}", cudnnGetVersion())};
}

std::vector<TuningRecord> export_conv_tuning(int device, const std::vector<KernelCall>& calls) {
  std::vector<std::vector<int64_t>> keys, nhwc_keys;
  for (const KernelCall& k : calls) {
    const bool forward = k.op == OpId::Conv || k.op == OpId::FusedConv;
    if (!forward && k.op != OpId::ConvTranspose && k.op != OpId::ConvGradWeight) continue;
    if (k.inputs.size() < 2 || k.outputs.empty() || !k.attrs) continue;
    const Shape &in0 = k.inputs[0].shape, &in1 = k.inputs[1].shape, &out0 = k.outputs[0].shape;
    if (numel(in0) == 0 || numel(in1) == 0 || numel(out0) == 0) continue;  // no cuDNN call
    const DType t = k.inputs[0].dtype;
    try {
      const bool cl = k.layout == Layout::channels_last && in0.size() == 4;
      auto nchw = [cl](const Shape& s) { return cl ? Shape{s[0], s[3], s[1], s[2]} : s; };
      const ConvParams a = ConvParams::decode(k.op, *k.attrs);
      const ConvCall c = conv_call(k.op, a, nchw(in0), nchw(in1), nchw(out0));
      // (f32 NHWC problems, TF32 ones, are not recorded: they are timed again after loading)
      if (cl && forward && (t == DType::f16 || t == DType::bf16) && c.direct) {
        Problem p = c.p;
        p.nhwc = true;
        nhwc_keys.push_back(nhwc_key(device, t, p, a.has_bias, a.has_residual, a.relu));
      }
      const int64_t chunk = batch_chunk(c.p, op_name(k.op));
      // the batch's chunks: full ones and the rest (run_pass)
      for (const int64_t n : {chunk, c.p.N % chunk}) {
        if (n == 0) continue;
        Problem p = c.p;
        p.N = n;
        p.nhwc = cl;
        keys.push_back(problem_key(c.pass, device, t, p));
      }
    } catch (const Error&) {
      // a call the kernel rejects has no choice to export
    }
  }
  std::sort(keys.begin(), keys.end());
  keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
  std::vector<TuningRecord> out;
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> l(cache.mu);
  for (const auto& key : keys) {
    auto it = cache.plans.find(key);
    if (it == cache.plans.end() || !it->second->algo) continue;
    const Algo& a = *it->second->algo;
    TuningRecord r;
    r.kind = static_cast<uint16_t>(key[0]);
    r.key.assign(key.begin() + 2, key.end());  // without pass and device
    r.value = {a.algo, static_cast<int64_t>(a.math), static_cast<int64_t>(a.workspace)};
    out.push_back(std::move(r));
  }
  std::sort(nhwc_keys.begin(), nhwc_keys.end());
  nhwc_keys.erase(std::unique(nhwc_keys.begin(), nhwc_keys.end()), nhwc_keys.end());
  for (const auto& key : nhwc_keys) {
    auto it = cache.nhwc.find(key);
    if (it == cache.nhwc.end()) continue;
    TuningRecord r;
    r.kind = kNhwcKind;
    r.key.assign(key.begin() + 2, key.end());
    r.value = nhwc_record_value(it->second->plan.get());
    if (r.value.size() > kMaxTuningValue) continue;  // more knobs than a record holds
    out.push_back(std::move(r));
  }
  return out;
}

std::string import_conv_tuning(int device, const std::vector<TuningRecord>& records,
                               size_t* seeded) {
  if (seeded) *seeded = 0;
  constexpr uint16_t kConvKinds = 3;
  for (size_t i = 0; i < records.size(); ++i) {
    if (records[i].kind < kConvKinds)
      if (std::string why = check_record(records[i]); !why.empty())
        return fmt::format("record {} (convolution pass {}): {}", i, records[i].kind, why);
    if (records[i].kind == kNhwcKind)
      if (std::string why = check_nhwc_record(records[i]); !why.empty())
        return fmt::format("record {} (NHWC convolution): {}", i, why);
  }
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> l(cache.mu);
  for (const TuningRecord& r : records) {
    if (r.kind == kNhwcKind) {
      std::vector<int64_t> key{static_cast<int64_t>(Pass::forward), device};
      key.insert(key.end(), r.key.begin(), r.key.end());
      if (cache.nhwc.count(key)) continue;
      cache.nhwc_seeds[key] = r.value;
      if (seeded) ++*seeded;
      continue;
    }
    if (r.kind >= kConvKinds) continue;
    std::vector<int64_t> key{r.kind, device};
    key.insert(key.end(), r.key.begin(), r.key.end());
    if (cache.plans.count(key)) continue;  // chosen in this process already
    cache.seeds[key] = Algo{static_cast<int>(r.value[0]), static_cast<size_t>(r.value[2]),
                            static_cast<cudnnMathType_t>(r.value[1])};
    if (seeded) ++*seeded;
  }
  return {};
}

TuningStats conv_tuning_stats() {
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> l(cache.mu);
  return cache.stats;
}

void clear_conv_tuning() {
  PlanCache& cache = plan_cache();
  std::lock_guard<std::mutex> l(cache.mu);
  cache.plans.clear();
  cache.seeds.clear();
  cache.nhwc.clear();
  cache.nhwc_seeds.clear();
  cache.stats = {};
}

}  // namespace kiln::cuda
