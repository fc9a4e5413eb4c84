#include "dist/collective_kernels.h"

#include <map>
#include <mutex>
#include <utility>

#include "core/errors.h"
#include "dist/host_reduce.h"
#include "kiln/dist.h"

namespace kiln::dist::detail {

namespace {
// Collectives in flight, by the buffer they write: the wait reads that buffer (its output is a
// view of it), which stays allocated until the wait has run.
struct Pending {
  std::shared_ptr<Communicator> comm;
  uint64_t ticket = 0;
};
std::mutex g_mu;
std::map<const void*, Pending>& pending() {
  static std::map<const void*, Pending> p;
  return p;
}

Reduction parse_reduction(const std::string& s) {
  if (s == "sum") return Reduction::sum;
  if (s == "mean") return Reduction::mean;
  if (s == "min") return Reduction::min;
  if (s == "max") return Reduction::max;
  if (s == "prod") return Reduction::prod;
  fail<ValueError>("[all_reduce] unknown reduction '{}'", s);
}
}  // namespace

void all_reduce_kernel(KernelContext& ctx, CopyFn copy) {
  const TensorView &in = ctx.in(0), &out = ctx.out(0);
  if (in.numel() == 0) return;  // every rank has the same shapes: all skip it
  const std::string& group = ctx.attrs().str("group");
  std::shared_ptr<Communicator> comm = group_for_run(group, "all_reduce");
  if (!comm) {  // a group of one: the reduction of one value is the value
    if (out.data != in.data && in.numel() > 0)
      copy(out.data, in.data, static_cast<size_t>(in.numel()) * size_of(in.dtype), ctx.stream());
    std::lock_guard<std::mutex> l(g_mu);
    pending().erase(out.data);
    return;
  }
  const bool on_gpu = ctx.stream() != nullptr;
  const Device d = comm->device();
  if (on_gpu != (d.kind == Device::Kind::cuda) || (on_gpu && d.index != ctx.device()))
    fail<ValueError>("[all_reduce] group '{}' is a {} communicator on {}, but this run is on {}",
                     group, comm->backend(), d.str(),
                     on_gpu ? Device::cuda(ctx.device()).str() : Device::cpu().str());
  CollectiveArgs a;
  a.kind = Collective::all_reduce;
  a.send = in.data;
  a.recv = out.data;
  a.count = in.numel();
  a.dtype = in.dtype;
  a.op = parse_reduction(ctx.attrs().str("op"));
  const uint64_t ticket = comm->start(a, ctx.stream());
  std::lock_guard<std::mutex> l(g_mu);
  pending()[out.data] = {std::move(comm), ticket};
}

void collective_wait_kernel(KernelContext& ctx, CopyFn copy) {
  const TensorView &in = ctx.in(0), &out = ctx.out(0);
  Pending p;
  {
    std::lock_guard<std::mutex> l(g_mu);
    auto it = pending().find(in.data);
    if (it != pending().end()) {  // none for a group of one: nothing in flight
      p = std::move(it->second);
      pending().erase(it);
    }
  }
  if (p.comm) p.comm->wait(p.ticket, ctx.stream());
  if (out.data != in.data && in.numel() > 0)
    copy(out.data, in.data, static_cast<size_t>(in.numel()) * size_of(in.dtype), ctx.stream());
}

}  // namespace kiln::dist::detail
