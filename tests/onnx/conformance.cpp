// kiln_onnx_conformance: runs ONNX's backend node tests (onnx/backend/test/data/node: one
// directory per case with model.onnx and test_data_set_*/{input,output}_*.pb) through the
// importer on the CPU and compares with the expected outputs at the onnx backend runner's
// tolerances (rtol 1e-3, atol 1e-7; bf16 and f16 outputs within two units in their last place at
// least; integers and bools exact; NaN equals NaN).
//
// Each case passes, fails (with a one-line reason) or is skipped (an op type kiln does not map,
// an op of another domain kiln does not map, or an element type kiln lacks). Cases run in a forked
// child, so a crash or a hang fails that case only; `--jobs N` runs them in N worker processes side
// by side (each forks its cases in turn). The run fails when a case fails that the expectations
// file does not list, or a listed case passes (the list only shrinks).
#include <fmt/format.h>
#include <onnx/onnx-data_pb.h>
#include <onnx/onnx_pb.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <sstream>

#include "kiln/executable.h"
#include "kiln/onnx.h"

namespace fs = std::filesystem;
using kiln::Array;
using kiln::DType;

namespace {

// the suite's tolerances unless --rtol/--atol say otherwise (the model tests use 1e-4)
double kRtol = 1e-3;
double kAtol = 1e-7;
// per case, from --tolerances (`case  atol=A rtol=R  # reason`): the tolerances the running case
// is compared at
struct Tolerance {
  double rtol, atol;
};
std::map<std::string, Tolerance> g_overrides;
Tolerance g_tol{kRtol, kAtol};
kiln::Device g_device = kiln::Device::cpu();
constexpr unsigned kCaseSeconds = 120;

struct CaseResult {
  std::string name;
  std::string status;    // pass, fail, skip
  std::string category;  // skip: op, domain, opset, dtype; fail: error, mismatch, crash
  std::string reason;
  int64_t opset = 0;
  std::set<std::string> op_types;  // default domain, subgraphs included
  bool expected_failure = false;
  // ran again with its parameter-like inputs (integer, bool, one value) frozen into initializers
  bool frozen = false;
};

nlohmann::ordered_json to_json(const CaseResult& r) {
  return {{"name", r.name},
          {"status", r.status},
          {"category", r.category},
          {"reason", r.reason},
          {"opset", r.opset},
          {"frozen_inputs", r.frozen},
          {"op_types", std::vector<std::string>(r.op_types.begin(), r.op_types.end())},
          {"expected_failure", r.expected_failure}};
}

CaseResult from_json(const nlohmann::json& j) {
  CaseResult r;
  r.name = j.at("name");
  r.status = j.at("status");
  r.category = j.at("category");
  r.reason = j.at("reason");
  r.opset = j.at("opset");
  r.frozen = j.at("frozen_inputs");
  for (const auto& op : j.at("op_types")) r.op_types.insert(op.get<std::string>());
  r.expected_failure = j.at("expected_failure");
  return r;
}

// A skip or a failure found before running, as an exception.
struct Skip {
  std::string category, reason;
};

std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  if (s.size() > 400) s = s.substr(0, 397) + "...";
  return s;
}

bool default_domain(const std::string& d) { return d.empty() || d == "ai.onnx"; }

void collect_ops(const onnx::GraphProto& g, std::set<std::string>& ops,
                 std::set<std::string>& domains) {
  for (const auto& n : g.node()) {
    if (default_domain(n.domain()))
      ops.insert(n.op_type());
    else
      domains.insert(n.domain() + "." + n.op_type());
    for (const auto& a : n.attribute()) {
      if (a.has_g()) collect_ops(a.g(), ops, domains);
      for (const auto& sg : a.graphs()) collect_ops(sg, ops, domains);
    }
  }
}

DType kiln_dtype(int32_t t) {
  using TP = onnx::TensorProto;
  switch (t) {
    case TP::FLOAT:
      return kiln::f32;
    case TP::DOUBLE:
      return kiln::f64;
    case TP::FLOAT16:
      return kiln::f16;
    case TP::BFLOAT16:
      return kiln::bf16;
    case TP::INT8:
      return kiln::i8;
    case TP::UINT8:
      return kiln::u8;
    case TP::INT16:
      return kiln::i16;
    case TP::INT32:
      return kiln::i32;
    case TP::INT64:
      return kiln::i64;
    case TP::UINT16:
      return kiln::u16;
    case TP::UINT32:
      return kiln::u32;
    case TP::UINT64:
      return kiln::u64;
    case TP::BOOL:
      return kiln::boolean;
    // (the float8 types by number: the onnx headers kiln builds with predate them)
    case 17:
      return kiln::f8e4m3fn;
    case 18:
      return kiln::f8e4m3fnuz;
    case 19:
      return kiln::f8e5m2;
    case 20:
      return kiln::f8e5m2fnuz;
    case 21:
      return kiln::u4;
    case 22:
      return kiln::i4;
    case 23:
      return kiln::f4e2m1fn;
    case 24:
      return kiln::f8e8m0fnu;
    case 25:
      return kiln::u2;
    case 26:
      return kiln::i2;
    default:
      throw Skip{
          "dtype",
          fmt::format("element type {} ({})",
                      onnx::TensorProto::DataType_Name(static_cast<onnx::TensorProto::DataType>(t)),
                      t)};
  }
}

// A TensorProto (raw_data or typed fields) as a host Array.
Array to_array(const onnx::TensorProto& t) {
  const DType dt = kiln_dtype(t.data_type());
  kiln::Shape shape(t.dims().begin(), t.dims().end());
  const int64_t n = kiln::numel(shape);
  if (t.data_location() == onnx::TensorProto::EXTERNAL)
    throw Skip{"dtype", "external data in a .pb"};
  Array a = Array::empty(shape, dt);
  // the 4- and 2-bit types: packed, the first element in a byte's low bits (raw_data, or one byte
  // a value in int32_data); kiln holds one element a byte
  const int bits = t.data_type() == 25 || t.data_type() == 26                          ? 2
                   : t.data_type() == 21 || t.data_type() == 22 || t.data_type() == 23 ? 4
                                                                                       : 0;
  if (bits) {
    const int64_t packed = (n * bits + 7) / 8;
    std::vector<uint8_t> p(static_cast<size_t>(packed));
    if (t.has_raw_data()) {
      if (static_cast<int64_t>(t.raw_data().size()) != packed)
        throw std::runtime_error(
            fmt::format("tensor '{}': raw_data holds {} bytes, {} packed "
                        "need {}",
                        t.name(), t.raw_data().size(), n, packed));
      std::memcpy(p.data(), t.raw_data().data(), p.size());
    } else {
      if (t.int32_data_size() != packed)
        throw std::runtime_error(fmt::format("tensor '{}': {} packed values for {} elements",
                                             t.name(), t.int32_data_size(), n));
      for (int64_t i = 0; i < packed; ++i)
        p[static_cast<size_t>(i)] = static_cast<uint8_t>(t.int32_data(static_cast<int>(i)));
    }
    auto* o = static_cast<uint8_t*>(a.data());
    for (int64_t i = 0; i < n; ++i) {
      const int64_t bit = i * bits;
      o[i] =
          static_cast<uint8_t>((p[static_cast<size_t>(bit / 8)] >> (bit % 8)) & ((1 << bits) - 1));
    }
    return a;
  }
  const size_t bytes = a.nbytes();
  // (an empty tensor's repeated field has no storage: memcpy must not see its null pointer)
  auto copy = [&](const void* from) {
    if (bytes) std::memcpy(a.data(), from, bytes);
  };
  if (t.has_raw_data()) {
    if (t.raw_data().size() != bytes)
      throw std::runtime_error(fmt::format("tensor '{}': raw_data holds {} bytes, shape needs {}",
                                           t.name(), t.raw_data().size(), bytes));
    copy(t.raw_data().data());
    return a;
  }
  auto check = [&](int64_t have) {
    if (have != n)
      throw std::runtime_error(
          fmt::format("tensor '{}': {} values for {} elements", t.name(), have, n));
  };
  using TP = onnx::TensorProto;
  switch (t.data_type()) {
    case TP::FLOAT:
      check(t.float_data_size());
      copy(t.float_data().data());
      break;
    case TP::DOUBLE:
      check(t.double_data_size());
      copy(t.double_data().data());
      break;
    case TP::INT64:
      check(t.int64_data_size());
      copy(t.int64_data().data());
      break;
    case TP::UINT32:
    case TP::UINT64: {  // values in uint64_data
      check(t.uint64_data_size());
      std::vector<uint64_t> v(t.uint64_data().begin(), t.uint64_data().end());
      kiln::convert(v.data(), kiln::u64, a.data(), dt, n);
      break;
    }
    case TP::FLOAT16:
    case TP::BFLOAT16: {  // 16-bit patterns in int32_data
      check(t.int32_data_size());
      auto* p = static_cast<uint16_t*>(a.data());
      for (int64_t i = 0; i < n; ++i)
        p[i] = static_cast<uint16_t>(t.int32_data(static_cast<int>(i)));
      break;
    }
    case 17:
    case 18:
    case 19:
    case 20:
    case 24: {  // the float8 types: 8-bit codes in int32_data
      check(t.int32_data_size());
      auto* p = static_cast<uint8_t*>(a.data());
      for (int64_t i = 0; i < n; ++i)
        p[i] = static_cast<uint8_t>(t.int32_data(static_cast<int>(i)));
      break;
    }
    default: {  // INT32, INT16, UINT16, INT8, UINT8, BOOL: values in int32_data
      check(t.int32_data_size());
      std::vector<int64_t> v(t.int32_data().begin(), t.int32_data().end());
      kiln::convert(v.data(), kiln::i64, a.data(), dt, n);
    }
  }
  return a;
}

std::vector<fs::path> numbered(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> files;
  for (int i = 0;; ++i) {
    fs::path p = dir / fmt::format("{}_{}.pb", prefix, i);
    if (!fs::exists(p)) break;
    files.push_back(p);
  }
  return files;
}

using kiln::onnx::Value;
struct DataSet {
  std::vector<Value> inputs, outputs;
};

onnx::TensorProto read_proto(const fs::path& path) {
  onnx::TensorProto t;
  std::ifstream f(path, std::ios::binary);
  if (!f || !t.ParseFromIstream(&f))
    throw Skip{"dtype", "not a TensorProto: " + path.filename().string()};
  return t;
}

// How the model declares a value: a tensor, a sequence of tensors, or an optional of either.
enum class Kind { tensor, sequence, optional };

Value sequence_value(const onnx::SequenceProto& q, const std::string& file) {
  if (q.elem_type() != onnx::SequenceProto::TENSOR && q.tensor_values_size() > 0)
    throw Skip{"dtype", "a sequence of non-tensors: " + file};
  std::vector<Array> items;
  for (const auto& t : q.tensor_values()) items.push_back(to_array(t));
  return Value::of_sequence(std::move(items));
}

// A value file: a TensorProto, a SequenceProto of tensors, or an OptionalProto of either (one
// without a value is none).
Value read_value(const fs::path& path, Kind kind) {
  if (kind == Kind::tensor) {
    const onnx::TensorProto t = read_proto(path);
    if (t.data_type() == onnx::TensorProto::STRING)  // (a session reads strings on the host)
      return Value::of_strings({t.string_data().begin(), t.string_data().end()},
                               kiln::Shape(t.dims().begin(), t.dims().end()));
    return Value::of(to_array(t));
  }
  std::ifstream f(path, std::ios::binary);
  const std::string file = path.filename().string();
  if (kind == Kind::sequence) {
    onnx::SequenceProto q;
    if (!f || !q.ParseFromIstream(&f)) throw Skip{"dtype", "not a SequenceProto: " + file};
    return sequence_value(q, file);
  }
  onnx::OptionalProto o;
  if (!f || !o.ParseFromIstream(&f)) throw Skip{"dtype", "not an OptionalProto: " + file};
  if (o.has_tensor_value()) return Value::of(to_array(o.tensor_value()));
  if (o.has_sequence_value()) return sequence_value(o.sequence_value(), file);
  if (o.has_sparse_tensor_value() || o.has_map_value() || o.has_optional_value())
    throw Skip{"dtype", "an optional of what kiln lacks: " + file};
  return Value::none();
}

// A value that holds a parameter (parameter_like, below): a tensor only.
bool is_tensor(const Value& v) { return !v.is_sequence && !v.is_none && !v.is_string; }

// Inputs that hold parameters rather than data: integers, bools and single values. A case that
// fails as given runs again with these as ImportOptions::input_values (the backend tests feed
// axes, shapes, pads, scales and depths as inputs; kiln needs them while importing), and with
// any other input an import error names as needed while importing.
bool parameter_like(const Array& a) {
  return kiln::is_integer(a.dtype()) || a.dtype() == kiln::boolean || a.numel() <= 1;
}

// Compares one output; "" when it matches.
std::string compare(const Array& got, const Array& want, const std::string& name);
std::string compare(const Value& got, const Value& want, const std::string& name) {
  if (got.is_string || want.is_string) {
    if (got.is_string != want.is_string)
      return fmt::format("output '{}': {} vs {} expected", name,
                         got.is_string ? "strings" : "not strings",
                         want.is_string ? "strings" : "not strings");
    if (got.string_shape != want.string_shape)
      return fmt::format("output '{}': shape {} vs expected {}", name,
                         kiln::to_string(got.string_shape), kiln::to_string(want.string_shape));
    for (size_t i = 0; i < want.strings.size(); ++i)
      if (got.strings[i] != want.strings[i])
        return fmt::format("output '{}'[{}]: '{}' vs expected '{}'", name, i, got.strings[i],
                           want.strings[i]);
    return "";
  }
  if (got.is_none || want.is_none)
    return got.is_none == want.is_none
               ? ""
               : fmt::format("output '{}': {} vs {} expected", name,
                             got.is_none ? "none" : "a value", want.is_none ? "none" : "a value");
  if (got.is_sequence != want.is_sequence)
    return fmt::format("output '{}': a {} vs an expected {}", name,
                       got.is_sequence ? "sequence" : "tensor",
                       want.is_sequence ? "sequence" : "tensor");
  if (!want.is_sequence) return compare(got.tensor, want.tensor, name);
  if (got.sequence.size() != want.sequence.size())
    return fmt::format("output '{}': {} elements vs {} expected", name, got.sequence.size(),
                       want.sequence.size());
  for (size_t k = 0; k < want.sequence.size(); ++k) {
    std::string r = compare(got.sequence[k], want.sequence[k], fmt::format("{}[{}]", name, k));
    if (!r.empty()) return r;
  }
  return "";
}

std::string compare(const Array& got, const Array& want, const std::string& name) {
  if (got.shape() != want.shape())
    return fmt::format("output '{}': shape {} vs expected {}", name, kiln::to_string(got.shape()),
                       kiln::to_string(want.shape()));
  if (got.dtype() != want.dtype())
    return fmt::format("output '{}': dtype {} vs expected {}", name, kiln::name(got.dtype()),
                       kiln::name(want.dtype()));
  auto exact = [&](auto type) -> std::string {  // integers and bools, as values of `type`
    using T = decltype(type);
    const auto g = got.to_vector<T>(), w = want.to_vector<T>();
    for (size_t i = 0; i < w.size(); ++i)
      if (g[i] != w[i])
        return fmt::format("output '{}'[{}]: {} vs expected {}", name, i, g[i], w[i]);
    return "";
  };
  if (want.dtype() == kiln::u64) return exact(uint64_t{});
  const DType wt = want.dtype();
  if (!kiln::is_floating(wt) && !kiln::is_float8(wt) && wt != kiln::f4e2m1fn &&
      wt != kiln::f8e8m0fnu)
    return exact(int64_t{});
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  // 16-bit floats: two units in the last place of the type at least (the reference computes in
  // the type too, rounding each step, where kiln's kernels accumulate in f32)
  const int bits = want.dtype() == kiln::bf16 ? 8 : want.dtype() == kiln::f16 ? 11 : 0;
  auto two_ulps = [&](double x) {  // of the significand's `bits` bits
    int e = 0;
    std::frexp(x, &e);
    return bits ? std::ldexp(2.0, e - bits) : 0.0;
  };
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (std::isnan(w[i]) && std::isnan(g[i])) continue;
    if (g[i] == w[i]) continue;  // infinities
    const double err = std::abs(g[i] - w[i]);
    if (!(err <= g_tol.atol + std::max(g_tol.rtol * std::abs(w[i]), two_ulps(w[i])))) {
      if (bad++ == 0) first = i;
      worst = std::isnan(err) ? err : std::max(worst, err);
    }
  }
  if (bad == 0) return "";
  return fmt::format(
      "output '{}': {} of {} values differ, first [{}] {} vs expected {}, max abs error {:.3g}",
      name, bad, w.size(), first, g[first], w[first], worst);
}

// Runs every data set of a case (in the forked child); "" on success, else the reason.
// As given: an onnx::Session per data set (its shapes fixed, as the frozen runs fix them), the
// inputs whose values the import needs read from the set's feeds.
std::string run_session(const fs::path& dir, const std::vector<std::string>& input_names,
                        const std::vector<DataSet>& sets) {
  for (const DataSet& ds : sets) {
    kiln::onnx::SessionOptions options;
    std::map<std::string, Value> feeds;
    for (size_t i = 0; i < ds.inputs.size() && i < input_names.size(); ++i) {
      if (is_tensor(ds.inputs[i]))
        options.import.input_shapes[input_names[i]] = ds.inputs[i].tensor.shape();
      feeds[input_names[i]] = ds.inputs[i];
    }
    const kiln::onnx::Session session((dir / "model.onnx").string(), g_device, options);
    const std::vector<Value> out = session.run_values(feeds);
    if (out.size() != ds.outputs.size())
      return fmt::format("{} outputs vs {} expected", out.size(), ds.outputs.size());
    const std::vector<std::string> names = session.output_names();
    for (size_t i = 0; i < out.size(); ++i) {
      std::string r = compare(out[i], ds.outputs[i], i < names.size() ? names[i] : "?");
      if (!r.empty()) return r;
    }
  }
  return "";
}

std::string run_case(const fs::path& dir, const std::vector<std::string>& input_names,
                     const std::vector<DataSet>& sets, bool freeze) {
  if (!freeze) return run_session(dir, input_names, sets);
  for (const DataSet& ds : sets) {
    // frozen: parameter-like inputs, then every input an import error names as needed
    std::set<std::string> frozen;
    for (const Value& v : ds.inputs)
      if (!is_tensor(v)) return "(a sequence input: no frozen run)";
    for (size_t i = 0; freeze && i < ds.inputs.size() && i < input_names.size(); ++i)
      if (parameter_like(ds.inputs[i].tensor)) frozen.insert(input_names[i]);
    for (int attempt = 0;; ++attempt) {
      kiln::onnx::ImportOptions options;
      std::map<std::string, Array> feeds;
      for (size_t i = 0; i < ds.inputs.size() && i < input_names.size(); ++i) {
        if (frozen.count(input_names[i])) {
          options.input_values[input_names[i]] = ds.inputs[i].tensor;
          continue;
        }
        options.input_shapes[input_names[i]] = ds.inputs[i].tensor.shape();
        feeds[input_names[i]] = ds.inputs[i].tensor;
      }
      std::optional<kiln::onnx::Model> model;
      try {
        model.emplace(kiln::onnx::import((dir / "model.onnx").string(), options));
      } catch (const kiln::UnsupportedError& e) {
        const std::string w = e.what();
        const size_t at = w.find("must be known while importing"), a = w.find("('"),
                     b = w.find("')", a == std::string::npos ? 0 : a);
        if (!freeze || attempt > 8 || at == std::string::npos || a == std::string::npos ||
            b == std::string::npos)
          throw;
        const std::string name = w.substr(a + 2, b - a - 2);
        if (!feeds.count(name)) throw;
        frozen.insert(name);
        continue;
      }
      std::map<std::string, kiln::Shape> shapes;
      for (const auto& [n, a] : feeds) shapes[n] = a.shape();
      const kiln::Executable exe =
          model->graph.compile(g_device, model->feed_shapes(shapes), model->output_tensors());
      const std::vector<Array> out = exe.run(model->feeds(feeds));
      if (out.size() != ds.outputs.size())
        return fmt::format("{} outputs vs {} expected", out.size(), ds.outputs.size());
      for (size_t i = 0; i < out.size(); ++i) {
        if (!is_tensor(ds.outputs[i])) return "(a sequence or optional output: no frozen run)";
        std::string r = compare(out[i], ds.outputs[i].tensor, model->outputs[i].name);
        if (!r.empty()) return r;
      }
      break;
    }
  }
  return "";
}

// Runs `fn` in a child process with a time limit; returns {ok, message}.
std::pair<bool, std::string> isolated(const std::function<std::string()>& fn, bool fork_cases) {
  auto guarded = [&]() -> std::pair<bool, std::string> {
    try {
      std::string r = fn();
      return {r.empty(), r};
    } catch (const kiln::Error& e) {
      return {false, e.what()};
    } catch (const std::exception& e) {
      return {false, std::string("exception: ") + e.what()};
    }
  };
  if (!fork_cases) return guarded();
  int pipefd[2];
  if (pipe(pipefd) != 0) throw std::runtime_error("pipe failed");
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    close(pipefd[0]);
    alarm(kCaseSeconds);
    auto [ok, msg] = guarded();
    const std::string out = (ok ? "1" : "0") + one_line(msg);
    ssize_t w = write(pipefd[1], out.data(), out.size());
    (void)w;
    _exit(0);
  }
  close(pipefd[1]);
  std::string got;
  char buf[4096];
  ssize_t r;
  while ((r = read(pipefd[0], buf, sizeof buf)) > 0) got.append(buf, static_cast<size_t>(r));
  close(pipefd[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return {false, sig == SIGALRM ? fmt::format("crash: timed out after {} s", kCaseSeconds)
                                  : fmt::format("crash: signal {} ({})", sig, strsignal(sig))};
  }
  if (got.empty()) return {false, "crash: the case exited without a result"};
  return {got[0] == '1', got.substr(1)};
}

CaseResult classify_and_run(const fs::path& dir, bool fork_cases) {
  CaseResult res;
  res.name = dir.filename().string();
  const auto over = g_overrides.find(res.name);
  g_tol = over != g_overrides.end() ? over->second : Tolerance{kRtol, kAtol};
  try {
    onnx::ModelProto model;
    {
      std::ifstream f(dir / "model.onnx", std::ios::binary);
      if (!f || !model.ParseFromIstream(&f)) throw Skip{"error", "model.onnx does not parse"};
    }
    for (const auto& o : model.opset_import())
      if (default_domain(o.domain())) res.opset = o.version();
    std::set<std::string> foreign;
    collect_ops(model.graph(), res.op_types, foreign);
    for (const auto& op : foreign) {  // ("domain.OpType", at the model's opset of that domain)
      int64_t version = 0;
      for (const auto& o : model.opset_import())
        if (op.rfind(o.domain() + ".", 0) == 0 &&
            op.find('.', o.domain().size() + 1) == std::string::npos)
          version = o.version();
      if (!kiln::onnx::is_supported(op, version)) throw Skip{"domain", "non-default domain: " + op};
    }
    std::vector<std::string> unsupported;
    for (const auto& op : res.op_types)
      if (!kiln::onnx::is_supported(op, res.opset)) unsupported.push_back(op);
    if (!unsupported.empty())
      throw Skip{"op", fmt::format("op type not supported: {}", fmt::join(unsupported, ", "))};

    std::set<std::string> initializers;
    for (const auto& t : model.graph().initializer()) initializers.insert(t.name());
    std::vector<std::string> input_names;
    std::vector<Kind> input_kinds, output_kinds;
    // a tensor, a sequence of tensors or an optional of those, of a type kiln has
    auto check_type = [](const onnx::ValueInfoProto& v) {
      const onnx::TypeProto* t = &v.type();
      const bool optional = t->has_optional_type();
      if (optional) t = &t->optional_type().elem_type();
      const bool sequence = t->has_sequence_type();
      if (sequence) t = &t->sequence_type().elem_type();
      if (!t->has_tensor_type()) throw Skip{"dtype", "non-tensor value '" + v.name() + "'"};
      // (strings: a tensor of them, which a session reads and makes on the host)
      if (optional || sequence || t->tensor_type().elem_type() != onnx::TensorProto::STRING)
        kiln_dtype(t->tensor_type().elem_type());
      return optional ? Kind::optional : sequence ? Kind::sequence : Kind::tensor;
    };
    for (const auto& v : model.graph().input()) {
      if (initializers.count(v.name())) continue;
      input_kinds.push_back(check_type(v));
      input_names.push_back(v.name());
    }
    for (const auto& v : model.graph().output()) output_kinds.push_back(check_type(v));

    std::vector<fs::path> set_dirs;
    for (const auto& e : fs::directory_iterator(dir))
      if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0)
        set_dirs.push_back(e.path());
    std::sort(set_dirs.begin(), set_dirs.end());
    std::vector<DataSet> sets;
    for (const auto& sd : set_dirs) {
      DataSet ds;
      auto read_all = [&](const char* prefix, const std::vector<Kind>& kinds) {
        std::vector<Value> values;
        for (const auto& p : numbered(sd, prefix)) {
          const size_t i = values.size();
          values.push_back(read_value(p, i < kinds.size() ? kinds[i] : Kind::tensor));
        }
        return values;
      };
      ds.inputs = read_all("input", input_kinds);
      ds.outputs = read_all("output", output_kinds);
      sets.push_back(std::move(ds));
    }
    auto [ok, msg] = isolated([&] { return run_case(dir, input_names, sets, false); }, fork_cases);
    bool has_frozen = msg.find("must be known while importing") != std::string::npos;
    for (const auto& ds : sets)
      for (const auto& v : ds.inputs)
        has_frozen = has_frozen || (is_tensor(v) && parameter_like(v.tensor));
    if (!ok && has_frozen) {  // again with parameter-like (and needed) inputs as constants
      auto [ok2, msg2] =
          isolated([&] { return run_case(dir, input_names, sets, true); }, fork_cases);
      res.frozen = true;
      ok = ok2;
      if (ok2) msg = "as given: " + msg;  // (a pass's reason: why it needed its inputs frozen)
      else if (msg2 != msg)
        msg = msg2 + " (with parameter inputs frozen; as given: " + msg + ")";
    }
    res.status = ok ? "pass" : "fail";
    res.category = ok                            ? ""
                   : msg.rfind("crash:", 0) == 0 ? "crash"
                   : msg.rfind("output", 0) == 0 ? "mismatch"
                                                 : "error";
    res.reason = one_line(msg);
  } catch (const Skip& s) {
    res.status = s.category == "error" ? "fail" : "skip";
    res.category = s.category;
    res.reason = one_line(s.reason);
  } catch (const std::exception& e) {
    res.status = "fail";
    res.category = "error";
    res.reason = one_line(e.what());
  }
  return res;
}

// `case_name  # reason` per line; blank lines and comment lines are ignored.
// Runs the cases in `jobs` worker processes, case k in worker k % jobs, each writing its results
// as JSON lines into a file of its own; returns them in the cases' order. The workers are forked
// before this process has made any thread or device context, so each starts clean (a CUDA
// context cannot cross a fork).
std::vector<CaseResult> run_in_workers(const std::vector<fs::path>& dirs, int jobs,
                                       bool fork_cases) {
  const fs::path tmp = fs::temp_directory_path() / fmt::format("kiln_conformance_{}", getpid());
  fs::create_directories(tmp);
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> workers;
  for (int w = 0; w < jobs; ++w) {
    const pid_t pid = fork();
    if (pid < 0) throw std::runtime_error("fork failed");
    if (pid == 0) {
      std::ofstream out(tmp / fmt::format("{}.jsonl", w));
      for (size_t k = static_cast<size_t>(w); k < dirs.size(); k += static_cast<size_t>(jobs))
        out << to_json(classify_and_run(dirs[k], fork_cases)).dump() << "\n" << std::flush;
      _exit(out ? 0 : 1);
    }
    workers.push_back(pid);
  }
  bool all_ok = true;
  for (pid_t pid : workers) {
    int status = 0;
    waitpid(pid, &status, 0);
    all_ok = all_ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  std::map<std::string, CaseResult> by_name;
  for (int w = 0; w < jobs; ++w) {
    std::ifstream in(tmp / fmt::format("{}.jsonl", w));
    for (std::string line; std::getline(in, line);) {
      CaseResult r = from_json(nlohmann::json::parse(line));
      by_name.emplace(r.name, std::move(r));
    }
  }
  fs::remove_all(tmp);
  std::vector<CaseResult> results;
  for (const auto& d : dirs) {
    auto it = by_name.find(d.filename().string());
    if (it != by_name.end()) {
      results.push_back(std::move(it->second));
      continue;
    }
    CaseResult lost;  // its worker died before writing it
    lost.name = d.filename().string();
    lost.status = "fail";
    lost.category = "crash";
    lost.reason = "crash: the worker running this case exited without its result";
    results.push_back(std::move(lost));
  }
  if (!all_ok) fmt::print(stderr, "warning: a worker process did not exit cleanly\n");
  return results;
}

// `case  atol=A rtol=R  # reason` lines (either tolerance may be left out: the default's)
std::map<std::string, Tolerance> read_tolerances(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read tolerances file " + path);
  std::map<std::string, Tolerance> out;
  std::string line;
  for (int number = 1; std::getline(f, line); ++number) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string name, word;
    if (!(words >> name)) continue;
    Tolerance t{kRtol, kAtol};
    while (words >> word) {
      const auto eq = word.find('=');
      const std::string key = word.substr(0, eq);
      double* slot = key == "atol" ? &t.atol : key == "rtol" ? &t.rtol : nullptr;
      char* end = nullptr;
      if (slot && eq != std::string::npos) *slot = std::strtod(word.c_str() + eq + 1, &end);
      if (!slot || !end || *end != '\0' || end == word.c_str() + eq + 1)
        throw std::runtime_error(
            fmt::format("{}:{}: '{}' is not atol=NUMBER or rtol=NUMBER", path, number, word));
    }
    out[name] = t;
  }
  return out;
}

std::set<std::string> read_expected(const std::string& path) {
  std::set<std::string> names;
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read expectations file " + path);
  std::string line;
  while (std::getline(f, line)) {
    line = line.substr(0, line.find('#'));
    std::istringstream words(line);
    std::string name;
    if (words >> name) names.insert(name);
  }
  return names;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Runs ONNX's backend node tests through kiln's importer on the CPU"};
  std::string data, expected_path, filter, json_path, write_expected, tolerances_path;
  bool no_fork = false, verbose = false;
  int jobs = 1;
  app.add_option("--data", data, "onnx/backend/test/data/node directory")->required();
  app.add_option("--expected", expected_path, "Expected failures (`case  # reason` lines)");
  app.add_option("--filter", filter, "Only cases whose name matches this regex (search)");
  app.add_option("--json", json_path, "Write per-case results as JSON");
  app.add_option("--write-expected", write_expected,
                 "Write the current failures as an expectations file");
  std::string device = "cpu";
  app.add_option("--rtol", kRtol, "Relative tolerance (default: the suite's 1e-3)");
  app.add_option("--atol", kAtol, "Absolute tolerance (default: the suite's 1e-7)");
  app.add_option("--tolerances", tolerances_path,
                 "Per-case tolerances (`case  atol=A rtol=R  # reason` lines)");
  app.add_option("--device", device, "Device to compile for: cpu, cuda or cuda:N");
  app.add_flag("--no-fork", no_fork, "Run cases in this process (for debuggers)");
  app.add_option("-j,--jobs", jobs, "Worker processes running cases side by side (default 1)")
      ->check(CLI::Range(1, 256));
  app.add_flag("-v,--verbose", verbose, "Print every case");
  CLI11_PARSE(app, argc, argv);
  try {
    g_device = kiln::Device::parse(device);
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }

  try {
    std::vector<fs::path> dirs;
    const std::regex re(filter.empty() ? ".*" : filter);
    for (const auto& e : fs::directory_iterator(data))
      if (e.is_directory() && fs::exists(e.path() / "model.onnx") &&
          std::regex_search(e.path().filename().string(), re))
        dirs.push_back(e.path());
    std::sort(dirs.begin(), dirs.end());
    if (dirs.empty()) throw std::runtime_error("no test cases under " + data);
    if (!tolerances_path.empty()) g_overrides = read_tolerances(tolerances_path);
    const std::set<std::string> expected =
        expected_path.empty() ? std::set<std::string>{} : read_expected(expected_path);

    auto report = [&](CaseResult& r) {
      r.expected_failure = expected.count(r.name) > 0;
      if (verbose || (r.status == "fail" && !r.expected_failure))
        fmt::print("{:<60} {}{}\n", r.name, r.status, r.reason.empty() ? "" : ": " + r.reason);
    };
    std::vector<CaseResult> results;
    if (jobs > 1) {
      results = run_in_workers(dirs, jobs, !no_fork);
      for (auto& r : results) report(r);
    } else {
      for (const auto& d : dirs) {
        results.push_back(classify_and_run(d, !no_fork));
        report(results.back());
      }
    }

    std::map<std::string, int> count, skips;
    int fail_expected = 0, fail_unexpected = 0, all_supported = 0, pass_supported = 0,
        pass_frozen = 0;
    std::vector<std::string> now_passing;
    std::set<std::string> suite_ops, supported_ops;
    int newest_opset = 0;
    for (const auto& e : kiln::onnx::supported_ops())
      newest_opset = std::max(newest_opset, e.since_version);
    for (const auto& r : results) {
      count[r.status]++;
      if (r.status == "skip") skips[r.category]++;
      if (r.status == "pass" && r.frozen) pass_frozen++;
      if (r.status == "fail") (r.expected_failure ? fail_expected : fail_unexpected)++;
      if (r.status == "pass" && r.expected_failure) now_passing.push_back(r.name);
      for (const auto& op : r.op_types) {
        suite_ops.insert(op);
        // supported: kiln maps the op type at some opset it reads (a type may appear in the
        // suite only in cases of an older opset), up to the newest its table names
        for (int v = 7; v <= newest_opset && !supported_ops.count(op); ++v)
          if (kiln::onnx::is_supported(op, v)) supported_ops.insert(op);
      }
      const bool runnable = r.status != "skip" || r.category == "dtype";
      if (runnable && r.category != "domain" && r.category != "opset") {
        all_supported++;
        pass_supported += r.status == "pass";
      }
    }
    for (const auto& n : now_passing)
      fmt::print("{:<60} pass, but listed as an expected failure\n", n);
    fmt::print("cases: {}\n", results.size());
    fmt::print("pass: {} ({} only with integer, bool and one-value inputs frozen as constants)\n",
               count["pass"], pass_frozen);
    fmt::print("fail: {} (expected {}, unexpected {})\n", count["fail"], fail_expected,
               fail_unexpected);
    fmt::print("skip: {}", count["skip"]);
    for (const auto& [k, n] : skips) fmt::print(" {}={}", k, n);
    fmt::print("\nop types: {} supported of {} distinct in the suite\n", supported_ops.size(),
               suite_ops.size());
    fmt::print("pass rate over cases whose op types are all supported: {}/{} = {:.1f}%\n",
               pass_supported, all_supported,
               all_supported ? 100.0 * pass_supported / all_supported : 0.0);

    if (!json_path.empty()) {
      nlohmann::ordered_json j;
      j["summary"] = {{"cases", results.size()},
                      {"pass", count["pass"]},
                      {"pass_frozen_inputs", pass_frozen},
                      {"fail", count["fail"]},
                      {"fail_expected", fail_expected},
                      {"fail_unexpected", fail_unexpected},
                      {"skip", count["skip"]},
                      {"skip_by_reason", skips},
                      {"op_types_supported", supported_ops.size()},
                      {"op_types_in_suite", suite_ops.size()},
                      {"supported_op_types",
                       std::vector<std::string>(supported_ops.begin(), supported_ops.end())},
                      {"cases_all_ops_supported", all_supported},
                      {"pass_all_ops_supported", pass_supported}};
      nlohmann::ordered_json cases = nlohmann::ordered_json::array();
      for (const auto& r : results) cases.push_back(to_json(r));
      j["cases"] = cases;
      std::ofstream(json_path) << j.dump(1) << "\n";
    }
    if (!write_expected.empty()) {
      std::ofstream f(write_expected);
      f << "# ONNX backend node tests that fail on kiln's CPU backend (kiln_onnx_conformance).\n"
           "# One case per line, `case_name  # reason`. Refresh: kiln_onnx_conformance --data DIR\n"
           "# --write-expected tests/onnx/expected_failures.txt\n";
      for (const auto& r : results)
        if (r.status == "fail") f << r.name << "  # " << r.reason << "\n";
    }
    if (fail_unexpected || !now_passing.empty()) {
      fmt::print(
          "FAILED: {} unexpected failures, {} listed cases now pass (remove them from the list)\n",
          fail_unexpected, now_passing.size());
      return 1;
    }
    fmt::print("OK\n");
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", one_line(e.what()));
    return 2;
  }
}
