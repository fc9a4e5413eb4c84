// Collectives over a communicator group (include/kiln/dist.h).
//   all_reduce:      inputs (x); attrs op ("sum" | "mean" | "min" | "max" | "prod"), group (name
//                    of a registered communicator group). Starts the reduction of x over the
//                    group and yields the buffer it lands in; only collective_wait may read it.
//   collective_wait: inputs (the result of a start); yields it once the collective is complete
//                    (a view: no copy).
// The schedule_collectives pass runs starts as early and waits as late as the program allows.
#include "kiln/dist.h"

#include "ops/common.h"

namespace kiln {

using namespace ops;

namespace {
std::vector<TensorInfo> infer_same(const InferContext& ctx) { return {ctx.inputs[0]}; }

std::vector<TensorInfo> infer_all_reduce(const InferContext& ctx) {
  const std::string& op = ctx.attrs.str("op");
  if (op != "sum" && op != "mean" && op != "min" && op != "max" && op != "prod")
    fail<ValueError>("[all_reduce] unknown reduction '{}' (sum, mean, min, max, prod)", op);
  if (ctx.attrs.str("group").empty()) fail<ValueError>("[all_reduce] empty group name");
  const DType t = ctx.inputs[0].dtype;
  if (t == boolean) fail<DTypeError>("[all_reduce] bool tensors cannot be reduced");
  return {ctx.inputs[0]};
}

std::vector<TensorInfo> infer_wait(const InferContext& ctx) { return infer_same(ctx); }

std::vector<std::optional<Tensor>> vjp_all_reduce(const VjpContext& ctx) {
  const std::string& op = ctx.attrs.str("op");
  if (op != "sum" && op != "mean")
    fail<UnsupportedError>("[all_reduce] the gradient of a {} reduction over ranks is not defined "
                           "here; only sum and mean are differentiable",
                           op);
  // every rank's input reaches every rank's output: the cotangents are reduced the same way
  dist::AllReduceOptions o;
  o.op = op == "sum" ? dist::Reduction::sum : dist::Reduction::mean;
  o.group = ctx.attrs.str("group");
  return {dist::all_reduce(ctx.cotangent_or_zeros(0), o)};
}

std::vector<std::optional<Tensor>> vjp_wait(const VjpContext& ctx) {
  return {ctx.cotangent_or_zeros(0)};
}
}  // namespace

void register_dist_ops() {
  // a collective talks to other ranks: never folded, merged or dropped as pure
  define_op(OpId::AllReduce)
      .set_infer(infer_all_reduce)
      .impure()
      .inplace(0)
      .grad(vjp_all_reduce)
      .inputs(1);
  define_op(OpId::CollectiveWait).set_infer(infer_wait).impure().alias().grad(vjp_wait).inputs(1);
}

namespace dist {

const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::sum: return "sum";
    case Reduction::mean: return "mean";
    case Reduction::min: return "min";
    case Reduction::max: return "max";
    case Reduction::prod: return "prod";
  }
  return "sum";
}

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::all_reduce: return "all_reduce";
    case Collective::broadcast: return "broadcast";
    case Collective::all_gather: return "all_gather";
    case Collective::reduce_scatter: return "reduce_scatter";
  }
  return "collective";
}

Tensor all_reduce(const Tensor& x, const AllReduceOptions& opts) {
  if (opts.group.empty()) fail<ValueError>("[all_reduce] empty group name");
  Tensor started = make_node1(OpId::AllReduce, {x},
                              {{"op", std::string(reduction_name(opts.op))}, {"group", opts.group}});
  return make_node1(OpId::CollectiveWait, {started});
}

}  // namespace dist
}  // namespace kiln
