// Distributed benchmarks, one rank per process (started by `kiln launch -n N` for NCCL or
// `mpirun -np N` for MPI); rank 0 prints.
//
//   allreduce  all-reduce of f32 buffers from 1 MB to 1 GB: time, algorithm bandwidth and bus
//              bandwidth (algbw * 2(n-1)/n, as nccl-tests reports it)
//   resnet50   the data-parallel ResNet-50 training step (batch 32 per rank, bf16 autocast,
//              gradients averaged in buckets during the backward pass): step time, images/s, and
//              the first losses
//
// Machine-readable lines: "kiln allreduce <ranks> <bytes> <ms> <algbw GB/s> <busbw GB/s>" and
// "kiln resnet50_dp <ranks> <ms per step> <images/s>". bench/dist/run.py runs them beside
// PyTorch's torch.distributed on the same GPUs.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <vector>

#include "bench/resnet50.h"
#ifdef KILN_BENCH_MPI
#include <mpi.h>
#endif
#include "kiln/kiln.h"

namespace {
using namespace kiln;
using namespace kiln_bench;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

std::shared_ptr<dist::Communicator> world(const std::string& transport, Device& device) {
  const dist::LaunchInfo info = dist::launch_info();
#ifdef KILN_BENCH_NCCL
  if (transport == "nccl") {
    device = Device::cuda(info.local_rank);
    return dist::nccl_world(device, info);
  }
#endif
#ifdef KILN_BENCH_MPI
  if (transport == "mpi") {
    device = Device::cpu();
    return dist::mpi_world();
  }
#endif
  throw UnsupportedError("[bench_dist] transport '" + transport + "' is not built in");
}

void allreduce(dist::Communicator& comm, int64_t max_bytes) {
  const int n = comm.size();
  if (comm.rank() == 0)
    fmt::print("# all-reduce (sum, f32) over {} rank(s) ({} on {}): size, time, algbw, busbw\n", n,
               comm.backend(), comm.device().str());
  for (int64_t bytes = 1 << 20; bytes <= max_bytes; bytes *= 4) {
    const int64_t count = bytes / 4;
    Array a = Array::zeros({count}, f32).to(comm.device());
    const int iters = bytes >= (256 << 20) ? 10 : 30;
    dist::CollectiveArgs args{dist::Collective::all_reduce, a.data(), a.data(), count, f32,
                              dist::Reduction::sum, 0};
    for (int i = 0; i < 3; ++i) comm.wait(comm.start(args, nullptr), nullptr);
    comm.barrier();
    const auto t0 = Clock::now();
    uint64_t last = 0;
    for (int i = 0; i < iters; ++i) last = comm.start(args, nullptr);
    comm.wait(last, nullptr);  // collectives complete in order
    const double ms = ms_since(t0) / iters;
    const double algbw = static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
    const double busbw = algbw * 2.0 * (n - 1) / n;
    if (comm.rank() == 0)
      fmt::print("kiln allreduce {} {} {:.4f} {:.2f} {:.2f}\n", n, bytes, ms, algbw, busbw);
#ifdef KILN_BENCH_MPI
    // the peer on the CPU: the same all-reduces as blocking MPI_Allreduce calls (kiln's worker
    // thread is idle now, so the calls stay serialized)
    if (comm.backend() == "mpi") {
      Array h = Array::zeros({count}, f32);
      MPI_Barrier(MPI_COMM_WORLD);
      const auto p0 = Clock::now();
      for (int i = 0; i < iters; ++i)
        MPI_Allreduce(MPI_IN_PLACE, h.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD);
      const double pms = ms_since(p0) / iters;
      const double pbus = static_cast<double>(bytes) / (pms * 1e-3) / 1e9 * 2.0 * (n - 1) / n;
      if (comm.rank() == 0)
        fmt::print("peer MPI_Allreduce {} {} {:.4f} busbw {:.2f}; kiln/peer time {:.2f}\n", n,
                   bytes, pms, pbus, ms / pms);
    }
#endif
  }
}

void resnet50(dist::Communicator& comm, Device device, int steps) {
  constexpr int64_t batch = 32;
  Graph g;
  auto x = g.placeholder({batch, 3, 224, 224}, f32, "x");
  auto y = g.placeholder({batch}, i64, "y");
  ResNet50 net(g, /*training=*/true);
  auto loss = softmax_cross_entropy(net.forward(x), y);
  auto grads = dist::all_reduce_gradients(gradients(loss, net.params()));
  std::vector<Tensor> updates = optim::sgd(g, net.params(), grads, {.lr = 0.01, .momentum = 0.9});
  updates.insert(updates.end(), net.bn_updates().begin(), net.bn_updates().end());
  Tensor global_loss = dist::all_reduce(loss, {.op = dist::Reduction::mean});
  CompileOptions copts;
  copts.autocast = bf16;
  auto exe = g.compile(device, {}, {global_loss}, updates, copts);
  dist::broadcast_variables(exe, comm);
  // each rank its own images: the global batch is 32 * ranks
  Array xv = Rng(7 + comm.rank()).array({batch, 3, 224, 224}, 1.0f).to(device);
  Array yv = labels(batch, 1000).to(device);
  std::vector<double> losses;
  for (int i = 0; i < 3; ++i)
    losses.push_back(exe.run({{x, xv}, {y, yv}})[0].to(Device::cpu()).to_vector<double>()[0]);
  comm.barrier();
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) exe.run({{x, xv}, {y, yv}});
  const double ms = ms_since(t0) / steps;
  if (comm.rank() == 0) {
    fmt::print("# ResNet-50 data-parallel training step, batch 32 per rank, bf16 autocast, {} "
               "rank(s) on {}: {:.3f} ms per step, {:.0f} images/s; first losses {:.5f} {:.5f} "
               "{:.5f}\n",
               comm.size(), comm.backend(), ms, 1000.0 * batch * comm.size() / ms, losses[0],
               losses[1], losses[2]);
    fmt::print("kiln resnet50_dp {} {:.4f} {:.1f}\n", comm.size(), ms,
               1000.0 * batch * comm.size() / ms);
  }
}
}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  std::string what = "allreduce", transport = "nccl";
  int64_t max_bytes = int64_t{1} << 30;
  int steps = 20;
  CLI::App app{"kiln distributed benchmarks"};
  app.add_option("what", what, "allreduce or resnet50");
  app.add_option("--transport", transport, "nccl or mpi");
  app.add_option("--max-bytes", max_bytes, "Largest all-reduce");
  app.add_option("--steps", steps, "Timed training steps");
  CLI11_PARSE(app, argc, argv);
  try {
    Device device = Device::cpu();
    auto comm = world(transport, device);
    dist::register_group(comm);
    if (what == "allreduce") allreduce(*comm, max_bytes);
    else if (what == "resnet50") resnet50(*comm, device, steps);
    else throw ValueError("[bench_dist] unknown benchmark " + what);
    comm->barrier();
    dist::unregister_group();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
