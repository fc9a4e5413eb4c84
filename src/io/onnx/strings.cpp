// String values of ONNX models on the host (strings.h): which nodes handle strings, and an
// interpreter of those nodes with ONNX's semantics (the operators' definitions; Python's
// str.split for StringSplit, as ONNX's reference; RE2, whose syntax RegexFullMatch specifies).
#include "io/onnx/strings.h"

#include <fmt/format.h>
#include <re2/re2.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <set>

#include "core/errors.h"
#include "io/onnx/importer.h"
#include "io/onnx/op_table.h"

namespace kiln::onnx::detail {

namespace {

using SValue = kiln::onnx::Value;
constexpr int32_t kString = ::onnx::TensorProto::STRING;

// A node's inputs, by pointer (string values are not copied); a missing one is an error.
struct In {
  const ::onnx::NodeProto& n;
  const std::vector<const SValue*>& v;
  const SValue& at(size_t i) const {
    if (i >= v.size() || !v[i] || v[i]->is_none)
      fail<ValueError>("[onnx] node '{}' ({}): input {} is missing",
                       n.output_size() ? n.output(0) : n.name(), n.op_type(), i);
    return *v[i];
  }
  const SValue& operator[](size_t i) const { return at(i); }
};

bool string_type(const ::onnx::TypeProto& type) {
  const ::onnx::TypeProto* t = &type;
  if (t->has_optional_type()) t = &t->optional_type().elem_type();
  if (t->has_sequence_type()) t = &t->sequence_type().elem_type();
  return t->has_tensor_type() && t->tensor_type().elem_type() == kString;
}

const ::onnx::AttributeProto* attr(const ::onnx::NodeProto& n, const std::string& name) {
  for (const auto& a : n.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

bool ml_label_encoder(const ::onnx::NodeProto& n) {
  return n.domain() == "ai.onnx.ml" && n.op_type() == "LabelEncoder";
}

// Whether the node makes strings at output k (given which of its inputs are strings).
bool makes_string(const ::onnx::NodeProto& n, int k, bool reads_string) {
  const std::string& op = n.op_type();
  if (op == "StringNormalizer" || op == "StringConcat") return true;
  if (op == "StringSplit") return k == 0;
  if (op == "RegexFullMatch" || op == "Equal") return false;
  if (ml_label_encoder(n)) {
    if (const auto* v = attr(n, "values_strings"); v && v->strings_size() > 0) return true;
    const auto* t = attr(n, "values_tensor");
    return t && t->has_t() && t->t().data_type() == kString;
  }
  if (op == "Constant") {
    const auto* v = attr(n, "value");
    return (v && v->has_t() && v->t().data_type() == kString) || attr(n, "value_string") ||
           attr(n, "value_strings");
  }
  if (op == "Cast" || op == "CastLike") {
    const auto* to = attr(n, "to");
    return to && to->i() == kString;
  }
  return reads_string;  // (Identity and the like; other ops are refused when they run)
}

bool string_op(const ::onnx::NodeProto& n) {
  static const std::set<std::string> ops{"StringNormalizer", "StringConcat", "StringSplit",
                                         "RegexFullMatch"};
  return (n.domain().empty() || n.domain() == "ai.onnx") && ops.count(n.op_type());
}

[[noreturn]] void refuse(const ::onnx::NodeProto& n, const std::string& why) {
  fail<UnsupportedError>("[onnx] node '{}' ({}): {}", n.output_size() ? n.output(0) : n.name(),
                         n.op_type(), why);
}

const std::vector<std::string>& strings_in(const ::onnx::NodeProto& n, const SValue& v, int i) {
  if (!v.is_string) refuse(n, fmt::format("input {} must be strings", i));
  return v.strings;
}

Array host_array(const ::onnx::NodeProto& n, const SValue& v, int i) {
  if (v.is_string || v.is_sequence || v.is_none || !v.tensor.valid())
    refuse(n, fmt::format("input {} must be a tensor", i));
  return v.tensor.to(Device::cpu());
}

// Numpy broadcasting of two shapes; the flat index into an input of shape `in` for output element
// `flat` of shape `out`.
Shape broadcast(const ::onnx::NodeProto& n, const Shape& a, const Shape& b) {
  const size_t r = std::max(a.size(), b.size());
  Shape out(r, 1);
  for (size_t i = 0; i < r; ++i) {
    const int64_t x = i + a.size() >= r ? a[i + a.size() - r] : 1;
    const int64_t y = i + b.size() >= r ? b[i + b.size() - r] : 1;
    if (x != y && x != 1 && y != 1)
      refuse(n, fmt::format("shapes {} and {} do not broadcast", str(a), str(b)));
    out[i] = x == 1 ? y : x;
  }
  return out;
}
int64_t source(const Shape& out, const Shape& in, int64_t flat) {
  int64_t idx = 0, stride = 1;
  for (size_t k = out.size(); k-- > 0;) {
    const int64_t coord = flat % out[k];
    flat /= out[k];
    const size_t d = k + in.size();
    if (d >= out.size()) {
      const int64_t dim = in[d - out.size()];
      if (dim != 1) idx += coord * stride;
      stride *= dim;
    }
  }
  return idx;
}

// Python's str.split(sep, maxsplit) (sep empty: runs of whitespace, ends stripped).
std::vector<std::string> py_split(const std::string& s, const std::string& sep, int64_t maxsplit) {
  std::vector<std::string> r;
  if (!sep.empty()) {
    size_t at = 0;
    while (maxsplit < 0 || static_cast<int64_t>(r.size()) < maxsplit) {
      const size_t f = s.find(sep, at);
      if (f == std::string::npos) break;
      r.push_back(s.substr(at, f - at));
      at = f + sep.size();
    }
    r.push_back(s.substr(at));
    return r;
  }
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  size_t i = 0;
  const size_t n = s.size();
  while (i < n) {
    while (i < n && space(s[i])) ++i;
    if (i == n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(r.size()) == maxsplit) {
      r.push_back(s.substr(i));  // (the rest, its trailing whitespace kept)
      break;
    }
    size_t j = i;
    while (j < n && !space(s[j])) ++j;
    r.push_back(s.substr(i, j - i));
    i = j;
  }
  return r;
}

std::vector<SValue> string_split(const ::onnx::NodeProto& n, const In& in) {
  const auto& x = strings_in(n, in.at(0), 0);
  const auto* d = attr(n, "delimiter");
  const auto* m = attr(n, "maxsplit");
  const std::string sep = d ? d->s() : std::string();
  const int64_t maxsplit = m ? m->i() : -1;
  std::vector<std::vector<std::string>> parts;
  size_t width = 0;
  for (const std::string& s : x) {
    parts.push_back(py_split(s, sep, maxsplit));
    width = std::max(width, parts.back().size());
  }
  std::vector<std::string> y;
  std::vector<int64_t> z;
  for (auto& p : parts) {
    z.push_back(static_cast<int64_t>(p.size()));
    p.resize(width);
    for (auto& s : p) y.push_back(std::move(s));
  }
  Shape ys = in[0].string_shape;
  ys.push_back(static_cast<int64_t>(width));
  return {SValue::of_strings(std::move(y), ys),
          SValue::of(Array::from_vector(z, in[0].string_shape))};
}

std::vector<SValue> string_concat(const ::onnx::NodeProto& n, const In& in) {
  const auto& a = strings_in(n, in.at(0), 0);
  const auto& b = strings_in(n, in.at(1), 1);
  const Shape out = broadcast(n, in[0].string_shape, in[1].string_shape);
  std::vector<std::string> r(static_cast<size_t>(numel(out)));
  for (int64_t i = 0; i < numel(out); ++i)
    r[i] = a[source(out, in[0].string_shape, i)] + b[source(out, in[1].string_shape, i)];
  return {SValue::of_strings(std::move(r), out)};
}

std::vector<SValue> equal_strings(const ::onnx::NodeProto& n, const In& in) {
  const auto& a = strings_in(n, in.at(0), 0);
  const auto& b = strings_in(n, in.at(1), 1);
  const Shape out = broadcast(n, in[0].string_shape, in[1].string_shape);
  std::vector<uint8_t> r(static_cast<size_t>(numel(out)));
  for (int64_t i = 0; i < numel(out); ++i)
    r[i] = a[source(out, in[0].string_shape, i)] == b[source(out, in[1].string_shape, i)];
  return {SValue::of(Array::from_vector(r, out).astype(boolean))};
}

std::vector<SValue> regex_full_match(const ::onnx::NodeProto& n, const In& in) {
  const auto& x = strings_in(n, in.at(0), 0);
  const auto* p = attr(n, "pattern");
  if (!p) refuse(n, "the pattern attribute is missing");
  RE2::Options o;
  o.set_log_errors(false);
  const RE2 re(p->s(), o);
  if (!re.ok())
    fail<ValueError>("[onnx] node '{}' (RegexFullMatch): pattern '{}' is not RE2 syntax: {}",
                     n.output_size() ? n.output(0) : n.name(), p->s(), re.error());
  std::vector<uint8_t> r;
  for (const std::string& s : x) r.push_back(RE2::FullMatch(s, re));
  return {SValue::of(Array::from_vector(r, in[0].string_shape).astype(boolean))};
}

std::string change_case(std::string s, const std::string& action) {
  if (action == "LOWER")
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  else if (action == "UPPER")
    for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::vector<SValue> string_normalizer(const ::onnx::NodeProto& n, const In& in) {
  const auto& x = strings_in(n, in.at(0), 0);
  const Shape& shape = in[0].string_shape;
  if (!(shape.size() == 1 || (shape.size() == 2 && shape[0] == 1)))
    refuse(n, fmt::format("input shape {} is neither [C] nor [1, C]", str(shape)));
  const auto* a = attr(n, "case_change_action");
  const std::string action = a ? a->s() : "NONE";
  if (action != "NONE" && action != "LOWER" && action != "UPPER")
    refuse(n, fmt::format("case_change_action '{}' is none of NONE, LOWER, UPPER", action));
  const auto* cs = attr(n, "is_case_sensitive");
  const bool sensitive = cs && cs->i() != 0;
  std::set<std::string> stop;
  if (const auto* w = attr(n, "stopwords"))
    for (const auto& s : w->strings()) stop.insert(sensitive ? s : change_case(s, "LOWER"));
  std::vector<std::string> r;
  for (const std::string& s : x)
    if (!stop.count(sensitive ? s : change_case(s, "LOWER"))) r.push_back(change_case(s, action));
  if (r.empty()) r.push_back("");  // (all filtered: one empty string)
  Shape out = shape;
  out.back() = static_cast<int64_t>(r.size());
  return {SValue::of_strings(std::move(r), out)};
}

// ai.onnx.ml LabelEncoder (1-4): keys and values as strings, int64s, floats or a tensor.
struct Table {
  std::vector<std::string> skeys, svalues;
  std::vector<double> nkeys, nvalues;
  bool string_keys = false, string_values = false;
  DType value_dtype = i64;
  std::string sdefault = "_Unused";
  double ndefault = -1;
};

Table table_of(const ::onnx::NodeProto& n) {
  Table t;
  auto tensor = [&](const char* name) -> const ::onnx::TensorProto* {
    const auto* a = attr(n, name);
    return a && a->has_t() ? &a->t() : nullptr;
  };
  if (const auto* a = attr(n, "keys_strings"); a && a->strings_size()) {
    t.string_keys = true;
    t.skeys.assign(a->strings().begin(), a->strings().end());
  } else if (const auto* a = attr(n, "keys_int64s"); a && a->ints_size()) {
    for (int64_t v : a->ints()) t.nkeys.push_back(static_cast<double>(v));
  } else if (const auto* a = attr(n, "keys_floats"); a && a->floats_size()) {
    for (float v : a->floats()) t.nkeys.push_back(v);
  } else if (const auto* k = tensor("keys_tensor")) {
    if (k->data_type() == kString) {
      t.string_keys = true;
      t.skeys = strings_of(*k).strings;
    } else {
      const Array v = read_tensor(*k, "").astype(f64);
      t.nkeys = v.to_vector<double>();
    }
  } else {
    refuse(n, "it has no keys");
  }
  if (const auto* a = attr(n, "values_strings"); a && a->strings_size()) {
    t.string_values = true;
    t.svalues.assign(a->strings().begin(), a->strings().end());
  } else if (const auto* a = attr(n, "values_int64s"); a && a->ints_size()) {
    for (int64_t v : a->ints()) t.nvalues.push_back(static_cast<double>(v));
  } else if (const auto* a = attr(n, "values_floats"); a && a->floats_size()) {
    for (float v : a->floats()) t.nvalues.push_back(v);
    t.value_dtype = f32;
    t.ndefault = -0.0;
  } else if (const auto* v = tensor("values_tensor")) {
    if (v->data_type() == kString) {
      t.string_values = true;
      t.svalues = strings_of(*v).strings;
    } else {
      const Array a = read_tensor(*v, "");
      t.value_dtype = a.dtype();
      t.nvalues = a.astype(f64).to_vector<double>();
      t.ndefault = is_floating(a.dtype()) ? -0.0 : -1;
    }
  } else {
    refuse(n, "it has no values");
  }
  const size_t keys = t.string_keys ? t.skeys.size() : t.nkeys.size();
  const size_t values = t.string_values ? t.svalues.size() : t.nvalues.size();
  if (keys != values) refuse(n, fmt::format("it has {} keys and {} values", keys, values));
  if (const auto* d = tensor("default_tensor")) {
    if (d->data_type() == kString) {
      const auto s = strings_of(*d).strings;
      if (!s.empty()) t.sdefault = s[0];
    } else {
      const auto v = read_tensor(*d, "").astype(f64).to_vector<double>();
      if (!v.empty()) t.ndefault = v[0];
    }
  } else if (t.string_values) {
    if (const auto* a = attr(n, "default_string")) t.sdefault = a->s();
  } else if (t.value_dtype == f32) {
    if (const auto* a = attr(n, "default_float")) t.ndefault = a->f();
  } else if (const auto* a = attr(n, "default_int64")) {
    t.ndefault = static_cast<double>(a->i());
  }
  return t;
}

std::vector<SValue> label_encoder(const ::onnx::NodeProto& n, const In& in) {
  const Table t = table_of(n);
  const SValue& x = in.at(0);
  std::vector<size_t> hit;  // index into the values, or SIZE_MAX for the default
  Shape shape;
  if (t.string_keys) {
    std::map<std::string, size_t> at;
    for (size_t i = 0; i < t.skeys.size(); ++i) at.emplace(t.skeys[i], i);
    for (const std::string& s : strings_in(n, x, 0)) {
      auto it = at.find(s);
      hit.push_back(it == at.end() ? SIZE_MAX : it->second);
    }
    shape = x.string_shape;
  } else {
    const Array a = host_array(n, x, 0);
    std::map<double, size_t> at;
    for (size_t i = 0; i < t.nkeys.size(); ++i) at.emplace(t.nkeys[i], i);
    for (double v : a.astype(f64).to_vector<double>()) {
      auto it = at.find(v);
      hit.push_back(it == at.end() ? SIZE_MAX : it->second);
    }
    shape = a.shape();
  }
  if (t.string_values) {
    std::vector<std::string> r;
    for (size_t h : hit) r.push_back(h == SIZE_MAX ? t.sdefault : t.svalues[h]);
    return {SValue::of_strings(std::move(r), shape)};
  }
  std::vector<double> r;
  for (size_t h : hit) r.push_back(h == SIZE_MAX ? t.ndefault : t.nvalues[h]);
  return {SValue::of(Array::from_vector(r, shape).astype(t.value_dtype))};
}

std::vector<SValue> constant(const ::onnx::NodeProto& n) {
  if (const auto* v = attr(n, "value"); v && v->has_t()) return {strings_of(v->t())};
  if (const auto* v = attr(n, "value_string")) return {SValue::of_strings({v->s()}, {})};
  if (const auto* v = attr(n, "value_strings")) {
    std::vector<std::string> s(v->strings().begin(), v->strings().end());
    const auto size = static_cast<int64_t>(s.size());
    return {SValue::of_strings(std::move(s), {size})};
  }
  refuse(n, "a Constant of strings without a value");
}

}  // namespace

SValue strings_of(const ::onnx::TensorProto& t) {
  if (t.data_type() != kString)
    fail<FormatError>("[onnx] tensor '{}' does not hold strings", t.name());
  Shape shape(t.dims().begin(), t.dims().end());
  for (int64_t d : shape)
    if (d < 0) fail<FormatError>("[onnx] tensor '{}' has a negative dim", t.name());
  if (numel(shape) != t.string_data_size())
    fail<FormatError>("[onnx] tensor '{}' of shape {} holds {} strings", t.name(), str(shape),
                      t.string_data_size());
  return SValue::of_strings({t.string_data().begin(), t.string_data().end()}, shape);
}

std::string first_string_node(const ::onnx::ModelProto& model) {
  const auto& g = model.graph();
  std::set<std::string> strings, known;
  for (const auto& in : g.input()) {
    known.insert(in.name());
    if (string_type(in.type())) strings.insert(in.name());
  }
  for (const auto& t : g.initializer()) {
    known.insert(t.name());
    if (t.data_type() == kString) strings.insert(t.name());
  }
  // nodes in an order where producers come first (a node whose inputs never come is left:
  // the importer reports it)
  std::vector<char> done(static_cast<size_t>(g.node_size()), 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int i = 0; i < g.node_size(); ++i) {
      if (done[i]) continue;
      const auto& n = g.node(i);
      bool ready = true, reads = false;
      for (const auto& in : n.input()) {
        if (in.empty()) continue;
        ready = ready && known.count(in);
        reads = reads || strings.count(in);
      }
      if (!ready) continue;
      done[i] = 1;
      progress = true;
      bool makes = false;
      for (int k = 0; k < n.output_size(); ++k) makes = makes || makes_string(n, k, reads);
      if ((reads || makes || string_op(n) || ml_label_encoder(n)) && n.output_size())
        return n.output(0);
      for (const auto& o : n.output()) known.insert(o);
    }
  }
  return "";
}

std::vector<SValue> run_string_node(const ::onnx::NodeProto& n,
                                    const std::vector<const SValue*>& inputs) {
  const In in{n, inputs};
  const std::string& op = n.op_type();
  if (ml_label_encoder(n)) return label_encoder(n, in);
  if (op == "StringSplit") return string_split(n, in);
  if (op == "StringConcat") return string_concat(n, in);
  if (op == "StringNormalizer") return string_normalizer(n, in);
  if (op == "RegexFullMatch") return regex_full_match(n, in);
  if (op == "Equal") return equal_strings(n, in);
  if (op == "Constant") return constant(n);
  if (op == "Identity") return {in.at(0)};
  refuse(n,
         "reads or makes strings, which kiln runs on the host for StringNormalizer, "
         "StringConcat, StringSplit, RegexFullMatch, Equal, LabelEncoder, Constant and "
         "Identity only");
}

// The string ops in the op table: a model holding them never reaches a mapping (the importer
// refuses it first, naming the node; onnx::Session runs the node on the host).
std::vector<Tensor> on_the_host(NodeContext& c) {
  c.unsupported("a string op: onnx::Session runs it on the host (kiln's arrays hold no strings)");
}

void add_string_ops(std::vector<OpEntry>& t) {
  t.insert(t.end(), {{"StringNormalizer", 10, on_the_host},
                     {"StringConcat", 20, on_the_host},
                     {"StringSplit", 20, on_the_host},
                     {"RegexFullMatch", 20, on_the_host},
                     {"ai.onnx.ml.LabelEncoder", 1, on_the_host}});
}

}  // namespace kiln::onnx::detail
