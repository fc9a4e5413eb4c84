// The op table and ONNX's schema versions; NodeContext's accessors.
#include "io/onnx/op_table.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <unordered_map>

#include "core/errors.h"
#include "io/onnx/importer.h"

namespace kiln::onnx::detail {

namespace {
// kiln maps default-domain opsets up to this one; a schema version above it maps only where an
// entry names that version (RMSNormalization 23, Attention 24, ...).
constexpr int kMaxOpset = 21;

const std::unordered_map<std::string, std::vector<int>>& schema_table() {
  static const auto* table = [] {
    auto* t = new std::unordered_map<std::string, std::vector<int>>;
#define KILN_ONNX_SCHEMA(name, ...) (*t)[name] = {__VA_ARGS__};
#include "io/onnx/schema_versions.inc"
#undef KILN_ONNX_SCHEMA
    return t;
  }();
  return *table;
}
}  // namespace

const std::vector<OpEntry>& op_table() {
  static const std::vector<OpEntry> table = [] {
    std::vector<OpEntry> t;
    add_elementwise_ops(t);
    add_nn_ops(t);
    add_tensor_ops(t);
    add_reduce_ops(t);
    add_misc_ops(t);
    add_signal_ops(t);
    add_quant_ops(t);
    add_rnn_ops(t);
    add_random_ops(t);
    add_control_ops(t);
    add_transformer_ops(t);
    add_linear_attention_ops(t);
    add_sequence_ops(t);
    add_unique_ops(t);
    add_training_ops(t);
    add_ml_ops(t);
    add_text_ops(t);
    add_string_ops(t);
    std::sort(t.begin(), t.end(), [](const OpEntry& a, const OpEntry& b) {
      const int c = std::string_view(a.op_type).compare(b.op_type);
      return c != 0 ? c < 0 : a.since_version < b.since_version;
    });
    return t;
  }();
  return table;
}

const std::vector<int>& schema_versions(const std::string& op_type) {
  static const std::vector<int> none;
  auto it = schema_table().find(op_type);
  return it == schema_table().end() ? none : it->second;
}

std::string op_key(const ::onnx::NodeProto& node) {
  const std::string& d = node.domain();
  return d.empty() || d == "ai.onnx" ? node.op_type() : d + "." + node.op_type();
}

const OpEntry* find_entry(const std::string& op_type, int64_t opset, int* schema_version) {
  int version = 0;
  if (op_type.find('.') != std::string::npos) {  // another domain's op: its entries' versions
    for (const OpEntry& e : op_table())
      if (op_type == e.op_type && e.since_version <= opset) version = e.since_version;
  }
  for (int v : schema_versions(op_type))
    if (v <= opset) version = v;
  if (schema_version) *schema_version = version;
  if (version == 0) return nullptr;
  const OpEntry* best = nullptr;
  for (const OpEntry& e : op_table())
    if (op_type == e.op_type && e.since_version <= version) best = &e;
  if (best && version > kMaxOpset && best->since_version != version) return nullptr;
  return best;
}

std::optional<DType> from_onnx_dtype(int32_t t) {
  switch (t) {
    case ::onnx::TensorProto::FLOAT: return f32;
    case ::onnx::TensorProto::UINT8: return u8;
    case ::onnx::TensorProto::INT8: return i8;
    case ::onnx::TensorProto::INT16: return i16;
    case ::onnx::TensorProto::UINT16:
      return u16;
    case ::onnx::TensorProto::UINT32:
      return u32;
    case ::onnx::TensorProto::UINT64:
      return u64;
    case ::onnx::TensorProto::INT32: return i32;
    case ::onnx::TensorProto::INT64: return i64;
    case ::onnx::TensorProto::BOOL: return boolean;
    case ::onnx::TensorProto::FLOAT16: return f16;
    case ::onnx::TensorProto::DOUBLE: return f64;
    case ::onnx::TensorProto::BFLOAT16: return bf16;
    case kOnnxFloat8E4M3FN:
      return f8e4m3fn;
    case kOnnxFloat8E4M3FNUZ:
      return f8e4m3fnuz;
    case kOnnxFloat8E5M2:
      return f8e5m2;
    case kOnnxFloat8E5M2FNUZ:
      return f8e5m2fnuz;
    case kOnnxUint4:
      return u4;
    case kOnnxInt4:
      return i4;
    case kOnnxFloat4E2M1:
      return f4e2m1fn;
    case kOnnxFloat8E8M0:
      return f8e8m0fnu;
    case kOnnxUint2:
      return u2;
    case kOnnxInt2:
      return i2;
    default: return std::nullopt;
  }
}

const char* onnx_dtype_name(int32_t t) {
  static const char* names[] = {
      "UNDEFINED",      "FLOAT",    "UINT8",        "INT8",           "UINT16",
      "INT16",          "INT32",    "INT64",        "STRING",         "BOOL",
      "FLOAT16",        "DOUBLE",   "UINT32",       "UINT64",         "COMPLEX64",
      "COMPLEX128",     "BFLOAT16", "FLOAT8E4M3FN", "FLOAT8E4M3FNUZ", "FLOAT8E5M2",
      "FLOAT8E5M2FNUZ", "UINT4",    "INT4",         "FLOAT4E2M1",     "FLOAT8E8M0",
      "UINT2",          "INT2"};
  if (t >= 0 && t < static_cast<int32_t>(std::size(names))) return names[t];
  return "an unknown type";
}

// ---- NodeContext ----

Graph& NodeContext::graph() { return imp_.graph(); }
const std::string& NodeContext::op_type() const { return node_.op_type(); }
int NodeContext::num_inputs() const { return node_.input_size(); }
bool NodeContext::has_input(int i) const {
  return i >= 0 && i < node_.input_size() && !node_.input(i).empty();
}
int NodeContext::num_outputs() const { return node_.output_size(); }
bool NodeContext::has_output(int i) const {
  return i >= 0 && i < node_.output_size() && !node_.output(i).empty();
}

Tensor NodeContext::input(int i) const {
  if (!has_input(i)) fail(fmt::format("input {} is missing", i));
  const Value* v = imp_.find(node_.input(i));
  KILN_ASSERT(v);
  if (v->sequence)
    fail(fmt::format("input {} ('{}') is a sequence; a tensor is needed", i, node_.input(i)));
  if (v->absent)
    fail(fmt::format("input {} ('{}') is an optional without a value; a tensor is needed", i,
                     node_.input(i)));
  return v->tensor;
}

bool NodeContext::is_absent(int i) const {
  if (!has_input(i)) return false;
  const Value* v = imp_.find(node_.input(i));
  return v && v->absent;
}

void NodeContext::set_absent(int i) {
  if (has_output(i)) imp_.set_absent(node_.output(i));
}

Value NodeContext::value(int i) const {
  if (!has_input(i)) fail(fmt::format("input {} is missing", i));
  const Value* v = imp_.find(node_.input(i));
  KILN_ASSERT(v);
  return *v;
}

bool NodeContext::is_sequence(int i) const {
  if (!has_input(i)) return false;
  const Value* v = imp_.find(node_.input(i));
  return v && v->sequence;
}

const Sequence& NodeContext::sequence(int i) const {
  if (!has_input(i)) fail(fmt::format("input {} is missing", i));
  const Value* v = imp_.find(node_.input(i));
  KILN_ASSERT(v);
  if (!v->sequence)
    fail(fmt::format("input {} ('{}') is a tensor; a sequence is needed", i, node_.input(i)));
  return *v->sequence;
}

void NodeContext::set_sequence(int i, Sequence s) {
  if (has_output(i)) imp_.set_sequence(node_.output(i), std::move(s));
}

const Array* NodeContext::constant(int i) const {
  if (!has_input(i)) return nullptr;
  const Value* v = imp_.find(node_.input(i));
  return v && v->data ? &*v->data : nullptr;
}

std::vector<int64_t> NodeContext::ints(int i) const {
  const Array* a = constant(i);
  if (!a) {
    if (!has_input(i)) fail(fmt::format("input {} is missing", i));
    needs_values({i}, fmt::format("input {} ('{}') must be known while importing: make it a "
                                  "constant or shape arithmetic on static shapes, or give the "
                                  "graph input it comes from a value (ImportOptions::input_values)",
                                  i, node_.input(i)));
  }
  if (is_floating(a->dtype()))
    fail(fmt::format("input {} ('{}') must hold integers, not {}", i, node_.input(i),
                     name(a->dtype())));
  return a->astype(i64).to_vector<int64_t>();
}

std::vector<double> NodeContext::doubles(int i) const {
  const Array* a = constant(i);
  if (!a) {
    if (!has_input(i)) fail(fmt::format("input {} is missing", i));
    needs_values({i}, fmt::format("input {} ('{}') must be known while importing: make it a "
                                  "constant, or give the graph input it comes from a value "
                                  "(ImportOptions::input_values)",
                                  i, node_.input(i)));
  }
  return a->astype(f64).to_vector<double>();
}

const ::onnx::AttributeProto* NodeContext::attr(const std::string& name) const {
  for (const auto& a : node_.attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

bool NodeContext::has_attr(const std::string& name) const { return attr(name) != nullptr; }

int64_t NodeContext::attr_int(const std::string& name, int64_t fallback) const {
  const auto* a = attr(name);
  return a ? a->i() : fallback;
}
int64_t NodeContext::required_int(const std::string& name) const {
  const auto* a = attr(name);
  if (!a) fail(fmt::format("attribute '{}' is required", name));
  return a->i();
}
float NodeContext::attr_float(const std::string& name, float fallback) const {
  const auto* a = attr(name);
  return a ? a->f() : fallback;
}
std::string NodeContext::attr_string(const std::string& name, const std::string& fallback) const {
  const auto* a = attr(name);
  return a ? a->s() : fallback;
}
std::vector<int64_t> NodeContext::attr_ints(const std::string& name,
                                            const std::vector<int64_t>& fallback) const {
  const auto* a = attr(name);
  return a ? std::vector<int64_t>(a->ints().begin(), a->ints().end()) : fallback;
}
std::vector<float> NodeContext::attr_floats(const std::string& name) const {
  const auto* a = attr(name);
  return a ? std::vector<float>(a->floats().begin(), a->floats().end()) : std::vector<float>{};
}
Array NodeContext::attr_tensor(const std::string& name) const {
  const auto* a = attr(name);
  if (!a || !a->has_t()) fail(fmt::format("tensor attribute '{}' is missing", name));
  return imp_.tensor(a->t());
}

const ::onnx::GraphProto& NodeContext::attr_graph(const std::string& name) const {
  const auto* a = attr(name);
  if (!a || !a->has_g()) fail(fmt::format("graph attribute '{}' is missing", name));
  return a->g();
}

std::string NodeContext::where() const {
  return fmt::format("node '{}' ({})", node_.name().empty() ? node_.output_size() ? node_.output(0) : "" : node_.name(), node_.op_type());
}
void NodeContext::fail(const std::string& message) const {
  throw ValueError(fmt::format("[onnx] {}: {}", where(), message));
}
void NodeContext::unsupported(const std::string& message) const {
  throw UnsupportedError(fmt::format("[onnx] {}: {}", where(), message));
}
void NodeContext::needs_values(const std::vector<int>& inputs, const std::string& message) const {
  needs(inputs, message, false);
}
void NodeContext::needs_data(const std::vector<int>& inputs, const std::string& message,
                             std::vector<Shape> output_dims) const {
  needs(inputs, message, true, std::move(output_dims));
}
void NodeContext::needs(const std::vector<int>& inputs, const std::string& message, bool data,
                        std::vector<Shape> output_dims) const {
  std::vector<std::string> names;
  for (int i : inputs)
    if (has_input(i))
      for (const std::string& n : imp_.graph_inputs_behind(node_.input(i)))
        if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  std::string from;
  for (const std::string& n : names) from += (from.empty() ? "'" : ", '") + n + "'";
  const std::string what =
      fmt::format("[onnx] {}: {}{}", where(), message,
                  from.empty() ? "" : " (it comes from graph input " + from + ")");
  std::vector<std::string> values;
  if (data)
    for (int i : inputs)
      if (has_input(i) && !constant(i)) values.push_back(node_.input(i));
  if (values.empty() && names.empty()) throw UnsupportedError(what);
  throw InputValuesNeeded(what, std::move(names), data ? node_.output(0) : std::string(),
                          std::move(values), std::move(output_dims));
}

}  // namespace kiln::onnx::detail

namespace kiln::onnx {

std::vector<OpSupport> supported_ops() {
  std::vector<OpSupport> r;
  for (const auto& e : detail::op_table()) r.push_back({e.op_type, e.since_version});
  return r;
}

bool is_supported(const std::string& op_type, int64_t opset) {
  return detail::find_entry(op_type, opset, nullptr) != nullptr;
}

}  // namespace kiln::onnx
