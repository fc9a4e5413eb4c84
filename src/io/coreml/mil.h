// The ML Program importer's internals (include/kiln/coreml.h): MIL values while importing, the
// context an op's mapping sees, and the op table that the ops_*.cpp files fill.
#pragma once

#include <fmt/format.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "MIL.pb.h"
#include "Model.pb.h"
#include "core/errors.h"
#include "io/file.h"
#include "kiln/array.h"
#include "kiln/coreml.h"
#include "kiln/graph.h"

namespace kiln::coreml::detail {

namespace mil = ::CoreML::Specification::MILSpec;

/// A MIL value while importing: a tensor of the graph, a value known now (a const op's, an
/// immediate argument's), or a string (a const of MIL's string type: pad modes, dtypes).
struct Value {
  std::optional<Tensor> tensor;
  std::optional<Array> known;
  std::optional<std::string> text;
};

/// The package's weight files (`@model_path/weights/weight.bin`), each opened once and read blob
/// by blob (a file of several GiB is never held whole beside the arrays made from it).
class Weights {
 public:
  explicit Weights(std::string dir);
  ~Weights();
  /// The blob at `offset` of `file` (its metadata's offset) as an array of `dtype` and `shape`
  /// (MIL's storage type: sub-byte and unsigned types are widened, see blob_dtype). Throws
  /// IoError or FormatError naming the file and offset.
  Array read(const std::string& file, uint64_t offset, mil::DataType dtype, const Shape& shape);

 private:
  const io::RegularFile& open(const std::string& file);
  std::string dir_;
  std::map<std::string, std::unique_ptr<io::RegularFile>> files_;
};

/// kiln's dtype for a MIL tensor type (sub-byte and unsigned integer types become u8 or the next
/// wider signed type); throws UnsupportedError for strings and types kiln cannot hold.
DType dtype_of(mil::DataType t, const std::string& where);
/// A MIL tensor type's shape (-1 for an unknown dim); throws for a variadic rank.
Shape shape_of(const mil::TensorType& t, const std::string& where);
/// An immediate tensor value as an array of the type's dtype and shape.
Array array_of(const mil::TensorValue& v, const mil::ValueType& type, const std::string& where);

class Importer;

/// One operation being mapped: its inputs by parameter name, and its outputs.
class OpContext {
 public:
  OpContext(Importer& imp, const mil::Operation& op) : imp_(imp), op_(op) {}

  Graph& graph();
  const mil::Operation& op() const { return op_; }
  const std::string& type() const { return op_.type(); }

  /// Whether parameter `name` is given (one binding or more).
  bool has(const std::string& name) const;
  /// Parameter `name` as a tensor of the graph (a known value becomes a constant).
  Tensor in(const std::string& name);
  /// A variadic parameter's tensors (concat's `values`).
  std::vector<Tensor> ins(const std::string& name);
  /// Whether `name` is known now (a const or an immediate value).
  bool is_known(const std::string& name) const;
  /// Parameter `name`'s value, which must be known now (else UnsupportedError naming the op).
  Array known(const std::string& name);
  /// Known parameters read as numbers, lists, flags and strings, with defaults where absent.
  int64_t int_of(const std::string& name);
  int64_t int_of(const std::string& name, int64_t fallback);
  double number(const std::string& name, double fallback);
  double number(const std::string& name);
  bool flag(const std::string& name, bool fallback);
  std::vector<int64_t> ints(const std::string& name);
  std::vector<int64_t> ints(const std::string& name, const std::vector<int64_t>& fallback);
  std::string text(const std::string& name, const std::string& fallback);
  std::string text(const std::string& name);
  /// The declared dtype and shape of output k (the program's types: -1 for an unknown dim).
  DType out_dtype(int k = 0) const;
  Shape out_shape(int k = 0) const;
  int num_outputs() const { return op_.outputs_size(); }

  /// Output k of the op.
  void set(int k, const Tensor& t);
  void set(const std::vector<Tensor>& outs);
  /// Output k as a value known now (a constexpr op's expanded weight).
  void set_known(int k, const Array& a);

  /// The op's nested blocks (cond's true_fn and false_fn, while_loop's condition and body).
  int num_blocks() const { return op_.blocks_size(); }
  const mil::Block& nested(int k) const;
  /// Maps nested block k onto the graph being built (inside a control op's BodyFn: the body's
  /// graph) with its inputs bound, in order, to `inputs`; the values of the blocks around it are
  /// read by name (kiln captures them). Returns the block's outputs. The names the block
  /// defines are forgotten afterwards.
  std::vector<Tensor> block(int k, const std::vector<Tensor>& inputs);
  /// Maps nested block k, which takes no inputs, in place and makes its outputs the op's (values
  /// known while importing stay known): a cond whose predicate is known then.
  void inline_block(int k);

  /// "op 'type' (output 'name')", for messages.
  std::string where() const;
  template <typename... A> [[noreturn]] void fail(fmt::format_string<A...> f, A&&... args) const {
    kiln::fail<ValueError>("[coreml] {}: {}", where(), fmt::format(f, std::forward<A>(args)...));
  }

 private:
  const Value& value(const std::string& name, int k = 0) const;
  const mil::Argument* arg(const std::string& name) const;
  const mil::Value* attr(const std::string& name) const;
  Importer& imp_;
  const mil::Operation& op_;
};

using OpMapper = std::function<void(OpContext&)>;
using OpTable = std::map<std::string, OpMapper>;

/// The op table's families (ops_*.cpp).
void add_elementwise_ops(OpTable& t);
void add_nn_ops(OpTable& t);
void add_tensor_ops(OpTable& t);
void add_constexpr_ops(OpTable& t);
void add_rnn_ops(OpTable& t);
void add_control_ops(OpTable& t);
const OpTable& op_table();

/// Fails with one UnsupportedError: "[coreml] unsupported <what>: type (names...); ..." for every
/// unmapped op or layer type with the first values or layers it names.
[[noreturn]] void report_unsupported(const std::string& what,
                                     const std::map<std::string, std::vector<std::string>>& where);
/// Checks that every ImportOptions::input_shapes entry names one of `inputs`.
void check_shape_names(const std::map<std::string, Shape>& shapes,
                       const std::vector<ValueInfo>& inputs);

/// "RGB", "BGR" or "GRAYSCALE": an image input's channel order (ValueInfo::image).
std::string color_space(const ::CoreML::Specification::ImageFeatureType& t);

/// A warning on kiln's log (KILN_LOG=warn; runtime/log.h, whose namespace the op headers'
/// `log` would clash with here).
void warn(const std::string& message);

/// Normalizes a possibly negative axis against `rank`, or fails naming the op.
int64_t axis_of(const OpContext& c, int64_t axis, int64_t rank);

}  // namespace kiln::coreml::detail
