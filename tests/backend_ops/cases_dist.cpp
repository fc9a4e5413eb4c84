// Cases of the collective ops. Without a registered group a process is a group of one, so the
// harness checks the kernels' plumbing (start, wait, the copy into a returned value, gradients)
// on every backend; reductions over several ranks are tested in tests/ops/test_dist.cpp and
// tests/dist/.
#include <fmt/format.h>

#include "backend_ops/harness.h"
#include "kiln/dist.h"

namespace kiln::harness {
namespace {

constexpr Layout kDense = Layout::dense, kT = Layout::transposed;

// (only sum and mean are differentiable; the harness checks gradients)
const dist::Reduction kOps[] = {dist::Reduction::sum, dist::Reduction::mean, dist::Reduction::sum};

const bool kAllReduce = register_cases(
    {OpId::AllReduce, 3, [](Case& c, DType t, int i) {
       const Shape shapes[] = {{257}, {33, 65}, {0, 5}};
       Tensor x = c.rand(shapes[i], t, i == 1 ? kT : kDense);
       c.outs = {dist::all_reduce(x, {.op = kOps[i]})};
       c.note(fmt::format("{} over a group of one, shape {}", dist::reduction_name(kOps[i]),
                          to_string(shapes[i])));
       return true;
     },
     {f32, f16, bf16, f64, i32, i64, i8, u8}});

const bool kCollectiveWait = register_cases(
    {OpId::CollectiveWait, 2, [](Case& c, DType t, int i) {
       // read by another op (a view) and returned (a copy)
       Tensor y = dist::all_reduce(c.rand({4099}, t));
       c.outs = {i == 0 ? y : y + y};
       c.note(i == 0 ? "returned" : "read by add");
       return true;
     },
     {f32, f16, bf16, f64, i32, i64}});

}  // namespace
}  // namespace kiln::harness
