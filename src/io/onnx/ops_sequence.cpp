// ONNX sequence ops (SequenceConstruct, SequenceEmpty, SequenceInsert, SequenceAt, SequenceErase,
// SequenceLength, SplitToSequence, ConcatFromSequence, SequenceMap). kiln holds a sequence while
// importing as the list of its element tensors (detail::Sequence): its length and every position
// read or written must be known then (constants, shape arithmetic, or graph inputs whose values
// onnx::Session reads from the feeds), and each element stays a tensor of the graph. Loops that
// carry sequences are unrolled while importing (ops_control.cpp).
#include <onnx/onnx_pb.h>

#include "io/onnx/map_util.h"

namespace kiln::onnx::detail {

namespace {

// A position of a sequence of `n` elements in [-n, n - 1] (or [-n, n] where `end_ok`: an insert
// may append), as an index from the front.
int64_t position(NodeContext& c, int i, int64_t n, bool end_ok) {
  const std::vector<int64_t> v = c.ints(i);
  if (v.size() != 1) c.fail(fmt::format("the position must be one value, got {}", v.size()));
  const int64_t p = v[0];
  const int64_t hi = end_ok ? n : n - 1;
  if (p < -n || p > hi)
    c.fail(fmt::format("position {} is out of range for a sequence of {} elements ([{}, {}])", p, n,
                       -n, hi));
  return p < 0 ? p + n : p;
}

Outs sequence_construct(NodeContext& c) {
  Sequence s;
  for (int i = 0; i < c.num_inputs(); ++i) {
    Tensor t = c.input(i);
    if (i == 0) s.dtype = t.dtype();
    if (t.dtype() != s.dtype)
      c.fail(fmt::format("input {} is {}; a sequence holds one element type ({})", i,
                         name(t.dtype()), name(s.dtype)));
    s.items.push_back(t);
  }
  if (s.items.empty()) c.fail("takes at least one tensor");
  c.set_sequence(0, std::move(s));
  return {};
}

Outs sequence_empty(NodeContext& c) {
  Sequence s;
  const auto dt = from_onnx_dtype(static_cast<int32_t>(c.attr_int("dtype", 1)));
  if (!dt)
    c.unsupported(fmt::format("a sequence of {} elements",
                              onnx_dtype_name(static_cast<int32_t>(c.attr_int("dtype", 1)))));
  s.dtype = *dt;
  c.set_sequence(0, std::move(s));
  return {};
}

Outs sequence_insert(NodeContext& c) {
  Sequence s = c.sequence(0);
  Tensor t = c.input(1);
  if (t.dtype() != s.dtype)
    c.fail(
        fmt::format("inserts a {} tensor into a sequence of {}", name(t.dtype()), name(s.dtype)));
  const auto n = static_cast<int64_t>(s.items.size());
  const int64_t at = c.has_input(2) ? position(c, 2, n, true) : n;
  s.items.insert(s.items.begin() + at, t);
  c.set_sequence(0, std::move(s));
  return {};
}

Outs sequence_at(NodeContext& c) {
  const Sequence& s = c.sequence(0);
  return {s.items[position(c, 1, static_cast<int64_t>(s.items.size()), false)]};
}

Outs sequence_erase(NodeContext& c) {
  Sequence s = c.sequence(0);
  const auto n = static_cast<int64_t>(s.items.size());
  if (n == 0) c.fail("erases from an empty sequence");
  const int64_t at = c.has_input(1) ? position(c, 1, n, false) : n - 1;
  s.items.erase(s.items.begin() + at);
  c.set_sequence(0, std::move(s));
  return {};
}

Outs sequence_length(NodeContext& c) {
  return {known(c, Array::scalar(static_cast<int64_t>(c.sequence(0).items.size())))};
}

// SplitToSequence(x, split?): pieces along `axis` of the sizes `split` gives (one size: pieces of
// it, the last the rest), or of 1 each without it (then squeezed unless keepdims).
Outs split_to_sequence(NodeContext& c) {
  const Tensor x = c.input(0);
  const int64_t axis = axis_of(c, c.attr_int("axis", 0), x.rank());
  const int64_t len = x.dim(static_cast<int>(axis));
  if (len < 0) c.unsupported("splits a dim known only at run time (the sequence's length)");
  Sequence s;
  s.dtype = x.dtype();
  std::vector<int64_t> sizes;
  const bool given = c.has_input(1);
  if (given) {
    const std::vector<int64_t> v = c.ints(1);
    const Array* a = c.constant(1);
    if (a->rank() == 0) {
      if (v[0] <= 0) c.fail(fmt::format("split {} must be positive", v[0]));
      if ((len + v[0] - 1) / v[0] > (int64_t{1} << 16))
        c.unsupported(fmt::format("a sequence of {} elements", (len + v[0] - 1) / v[0]));
      for (int64_t at = 0; at < len; at += v[0]) sizes.push_back(std::min(v[0], len - at));
    } else {
      int64_t sum = 0;
      for (int64_t d : v) {
        if (d < 0) c.fail(fmt::format("split sizes {} hold a negative one", str(v)));
        sum += d;
      }
      if (sum != len)
        c.fail(fmt::format("split sizes {} add up to {}, not the dim's {}", str(v), sum, len));
      sizes = v;
    }
  } else {
    if (len > (int64_t{1} << 16)) c.unsupported(fmt::format("a sequence of {} elements", len));
    sizes.assign(static_cast<size_t>(len), 1);
  }
  constexpr size_t kMaxItems = size_t{1} << 16;
  if (sizes.size() > kMaxItems)
    c.unsupported(fmt::format("a sequence of {} elements (kiln holds up to {} while importing)",
                              sizes.size(), kMaxItems));
  const bool squeeze_each = !given && c.attr_int("keepdims", 1) == 0;
  int64_t at = 0;
  for (int64_t d : sizes) {
    Tensor piece = slice(x, {at}, {at + d}, {}, {axis});
    s.items.push_back(squeeze_each ? squeeze(piece, {axis}) : piece);
    at += d;
  }
  c.set_sequence(0, std::move(s));
  return {};
}

// ConcatFromSequence: the elements joined along `axis`, or stacked on a new axis (new_axis = 1,
// where axis may be rank, a new last dim).
Outs concat_from_sequence(NodeContext& c) {
  const Sequence& s = c.sequence(0);
  if (s.items.empty()) c.fail("joins an empty sequence");
  const bool stacked = c.attr_int("new_axis", 0) != 0;
  const int rank = s.items[0].rank() + (stacked ? 1 : 0);
  const int64_t axis = axis_of(c, c.required_int("axis"), rank);
  return {stacked ? stack(s.items, axis) : concat(s.items, axis)};
}

// SequenceMap(seq, more...): the body run on the k-th element of every sequence input (tensor
// inputs passed whole), its outputs gathered into sequences.
Outs sequence_map(NodeContext& c) {
  const ::onnx::GraphProto& body = c.attr_graph("body");
  if (body.input_size() != c.num_inputs())
    c.fail(fmt::format("the body takes {} inputs for the node's {}", body.input_size(),
                       c.num_inputs()));
  const size_t n = c.sequence(0).items.size();
  for (int i = 1; i < c.num_inputs(); ++i)
    if (c.is_sequence(i) && c.sequence(i).items.size() != n)
      c.fail(
          fmt::format("input {} holds {} elements, input 0 {}", i, c.sequence(i).items.size(), n));
  std::vector<Sequence> outs(static_cast<size_t>(body.output_size()));
  for (int j = 0; j < body.output_size(); ++j) {
    const auto& t = body.output(j).type();
    const auto dt =
        t.has_tensor_type() ? from_onnx_dtype(t.tensor_type().elem_type()) : std::nullopt;
    if (dt) outs[j].dtype = *dt;
  }
  for (size_t k = 0; k < n; ++k) {
    if (!c.importer().count_unrolled())
      c.unsupported(
          "maps its body once per element while importing; the model's 65,536 bodies "
          "are used up");
    std::vector<Value> in;
    for (int i = 0; i < c.num_inputs(); ++i) {
      in.push_back(c.is_sequence(i) ? c.importer().value_of(c.sequence(i).items[k]) : c.value(i));
    }
    const std::vector<Value> out = c.importer().inline_values(body, in);
    for (size_t j = 0; j < out.size(); ++j) {
      if (out[j].sequence) c.unsupported("a body whose output is a sequence");
      outs[j].dtype = out[j].tensor.dtype();
      outs[j].items.push_back(out[j].tensor);
    }
  }
  for (size_t j = 0; j < outs.size(); ++j) c.set_sequence(static_cast<int>(j), std::move(outs[j]));
  return {};
}

}  // namespace

void add_sequence_ops(std::vector<OpEntry>& t) {
  t.insert(t.end(), {
                        {"ConcatFromSequence", 11, concat_from_sequence},
                        {"SequenceAt", 11, sequence_at},
                        {"SequenceConstruct", 11, sequence_construct},
                        {"SequenceEmpty", 11, sequence_empty},
                        {"SequenceErase", 11, sequence_erase},
                        {"SequenceInsert", 11, sequence_insert},
                        {"SequenceLength", 11, sequence_length},
                        {"SequenceMap", 17, sequence_map},
                        {"SplitToSequence", 11, split_to_sequence},
                    });
}

}  // namespace kiln::onnx::detail
