// Data-parallel training of the digits convnet (the demo's model) for the distributed tests and
// as an example: each rank trains on its slice of every global batch, gradients are averaged over
// the ranks in buckets, and rank 0 writes the loss of every step.
//
//   one process:  kiln_dp_train --data DIR --transport none --out losses.txt
//   MPI (CPU):    mpirun -np 4 kiln_dp_train --data DIR --transport mpi --out losses.txt
//   NCCL (GPUs):  kiln launch -n 2 -- kiln_dp_train --data DIR --transport nccl --out losses.txt
//
// Failure drills for the tests: --kill-rank R --fail-step S makes rank R die (SIGKILL) at step S;
// --hang-rank R makes it stop answering instead, --exit-rank R makes it leave quietly.
// --queue runs the steps (and their collectives) asynchronously on a kiln Queue: the next batch is
// gathered while a step runs, and an event that each step signals orders the checkpoint after it.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <future>
#include <optional>
#include <random>
#include <thread>

#include "kiln/kiln.h"

namespace {

using namespace kiln;

struct Options {
  std::string data = "build/data";
  std::string transport = "none";  // none | mpi | nccl
  std::string out;
  std::string checkpoint;
  int steps = 40;
  int global_batch = 32;
  int checkpoint_step = -1;
  int kill_rank = -1, hang_rank = -1, exit_rank = -1, fail_step = 5;
  double lr = 0.05;
  std::string device;  // default: cuda:LOCAL_RANK for nccl, else cpu
  bool selftest = false;
  bool queue = false;
  int64_t bucket_bytes = 16 << 10;
};

Array kaiming(const Shape& shape, double fan_in, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, static_cast<float>(std::sqrt(2.0 / fan_in)));
  Array a = Array::empty(shape, f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = d(rng);
  return a;
}

// Rank r's data for a check: the same on every rank, so each can compute every reference.
Array rank_data(int r, const Shape& s, DType t, int salt) {
  std::mt19937 rng(1000 * r + salt);
  std::uniform_int_distribution<int> d(1, 4);  // small integers: sums and products stay exact
  Array a = Array::empty(s, f32);
  for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = static_cast<float>(d(rng));
  return a.astype(t);
}

// Every collective of the communicator against references computed from every rank's data.
int selftest(dist::Communicator& c) {
  const int n = c.size(), me = c.rank();
  const Device dev = c.device();
  int failures = 0;
  auto expect = [&](const Array& got, const std::vector<double>& want, const std::string& what,
                    double tol = 1e-6) {
    const auto g = got.to(Device::cpu()).astype(f64).to_vector<double>();
    for (size_t i = 0; i < want.size(); ++i)
      if (g.size() != want.size() || std::abs(g[i] - want[i]) > tol * (1 + std::abs(want[i]))) {
        std::fprintf(stderr, "selftest rank %d: %s: element %zu is %g, expected %g\n", me,
                     what.c_str(), i, i < g.size() ? g[i] : -1.0, want[i]);
        ++failures;
        return;
      }
  };
  const Shape s{3, 5};
  for (DType t : {f32, f16, bf16, f64, i32, i64})
    for (auto op : {dist::Reduction::sum, dist::Reduction::mean, dist::Reduction::max,
                    dist::Reduction::min, dist::Reduction::prod}) {
      if (op == dist::Reduction::mean && !is_floating(t)) continue;  // NCCL's average is float
      Array a = rank_data(me, s, t, 1).to(dev);
      c.all_reduce(a, op);
      std::vector<double> want(15);
      for (int i = 0; i < 15; ++i) {
        double acc = op == dist::Reduction::prod ? 1 : op == dist::Reduction::max ? -1e300
                     : op == dist::Reduction::min ? 1e300 : 0;
        for (int r = 0; r < n; ++r) {
          const double v = rank_data(r, s, f64, 1).data<double>()[i];
          if (op == dist::Reduction::prod) acc *= v;
          else if (op == dist::Reduction::max) acc = std::max(acc, v);
          else if (op == dist::Reduction::min) acc = std::min(acc, v);
          else acc += v;
        }
        want[i] = op == dist::Reduction::mean ? acc / n : acc;
      }
      // a mean rounds to the dtype (the sums of small integers are exact)
      expect(a, want, fmt::format("all_reduce {} {}", dist::reduction_name(op), name(t)),
             t == bf16 ? 8e-3 : t == f16 ? 1e-3 : 1e-6);
    }
  for (int root = 0; root < n; ++root) {
    Array b = rank_data(me, s, f32, 2).to(dev);
    c.broadcast(b, root);
    expect(b, rank_data(root, s, f64, 2).to_vector<double>(), fmt::format("broadcast from {}", root));
  }
  Array gathered = c.all_gather(rank_data(me, s, bf16, 3).to(dev));
  std::vector<double> cat;
  for (int r = 0; r < n; ++r) {
    auto v = rank_data(r, s, f64, 3).to_vector<double>();
    cat.insert(cat.end(), v.begin(), v.end());
  }
  expect(gathered, cat, "all_gather bf16");
  Array scattered = c.reduce_scatter(rank_data(me, {2 * n, 3}, f32, 4).to(dev));
  std::vector<double> part(6, 0);
  for (int r = 0; r < n; ++r) {
    auto v = rank_data(r, {2 * n, 3}, f64, 4).to_vector<double>();
    for (int i = 0; i < 6; ++i) part[i] += v[me * 6 + i];
  }
  expect(scattered, part, "reduce_scatter");
  c.barrier();
  if (failures) return 1;
  if (me == 0) fmt::print("selftest passed: every collective on {} rank(s) of {}\n", n, c.backend());
  return 0;
}

int train(const Options& o) {
  const dist::LaunchInfo info = dist::launch_info();
  std::shared_ptr<dist::Communicator> comm;
  Device device = Device::cpu();
  if (o.transport == "mpi") {
#ifdef KILN_DP_TRAIN_MPI
    comm = dist::mpi_world();
#else
    throw UnsupportedError("[dp_train] built without MPI (kiln_dp_train has it)");
#endif
  } else if (o.transport == "nccl") {
#ifdef KILN_DP_TRAIN_NCCL
    device = Device::cuda(info.local_rank);
    comm = dist::nccl_world(device, info);
#else
    throw UnsupportedError("[dp_train] built without NCCL (kiln_dp_train_nccl has it)");
#endif
  } else if (o.transport != "none") {
    throw ValueError("[dp_train] --transport takes none, mpi or nccl");
  }
  if (!o.device.empty()) device = Device::parse(o.device);
  if (comm) dist::register_group(comm);
  if (o.selftest) {
    auto c = comm ? comm : dist::local_group(1)[0];
    return selftest(*c);
  }
  const int rank = comm ? comm->rank() : 0, size = comm ? comm->size() : 1;
  if (o.global_batch % size != 0)
    throw ValueError(fmt::format("[dp_train] global batch {} does not divide over {} ranks",
                                 o.global_batch, size));
  const int64_t local_batch = o.global_batch / size;

  Array images = Array::load_npy(o.data + "/digits_images.npy");
  Array labels = Array::load_npy(o.data + "/digits_labels.npy");
  const int64_t n = images.shape()[0];

  Graph g;
  // every rank starts from its own random weights: broadcast_variables makes them rank 0's
  std::mt19937 rng(2026 + 7919 * rank);
  Tensor w1 = g.variable(kaiming({16, 1, 3, 3}, 9, rng), "conv1.weight");
  Tensor b1 = g.variable(Array::zeros({16}, f32), "conv1.bias");
  Tensor w2 = g.variable(kaiming({32, 16, 3, 3}, 144, rng), "conv2.weight");
  Tensor b2 = g.variable(Array::zeros({32}, f32), "conv2.bias");
  Tensor wf = g.variable(kaiming({10, 128}, 128, rng), "fc.weight");
  Tensor bf = g.variable(Array::zeros({10}, f32), "fc.bias");
  const std::vector<Tensor> params{w1, b1, w2, b2, wf, bf};
  Tensor x = g.placeholder({local_batch, 1, 8, 8}, f32, "images");
  Tensor y = g.placeholder({local_batch}, i64, "labels");
  ConvOptions same;
  same.padding = {1, 1};
  PoolOptions pool2;
  pool2.kernel = {2, 2};
  Tensor h = max_pool(relu(conv2d(x, w1, b1, same)), pool2);
  h = max_pool(relu(conv2d(h, w2, b2, same)), pool2);
  Tensor loss = softmax_cross_entropy(linear(reshape(h, {-1, 128}), wf, bf), y);
  auto grads = dist::all_reduce_gradients(gradients(loss, params), {.bucket_bytes = o.bucket_bytes, .first_bucket_bytes = o.bucket_bytes});
  Tensor global_loss = dist::all_reduce(loss, {.op = dist::Reduction::mean});
  Executable step = g.compile(device, {}, {global_loss},
                              optim::sgd(g, params, grads, {.lr = o.lr, .momentum = 0.9}));
  if (comm) dist::broadcast_variables(step, *comm);

  std::FILE* out = nullptr;
  if (rank == 0 && !o.out.empty()) {
    out = std::fopen(o.out.c_str(), "w");
    if (!out) throw IoError("[dp_train] cannot write " + o.out);
  }
  // global batch t: positions [t*B, (t+1)*B) of a fixed permutation; this rank's slice of it
  std::vector<int64_t> perm(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), std::mt19937(7));
  const dist::Shard mine = dist::shard(o.global_batch, rank, size);
  const auto t0 = std::chrono::steady_clock::now();
  std::optional<Queue> queue;
  if (o.queue) queue.emplace(step.device());
  Event steps_done;
  std::future<std::vector<Array>> in_flight;
  auto write_loss = [&] {
    if (!in_flight.valid()) return;
    const double l = in_flight.get()[0].to(Device::cpu()).to_vector<double>()[0];
    if (out) std::fprintf(out, "%.9g\n", l);
  };
  for (int s = 0; s < o.steps; ++s) {
    if (s == o.fail_step && rank == o.kill_rank) {
      std::fprintf(stderr, "[dp_train] rank %d: dying at step %d (drill)\n", rank, s);
      ::raise(SIGKILL);
    }
    if (s == o.fail_step && rank == o.exit_rank) {
      std::fprintf(stderr, "[dp_train] rank %d: leaving early at step %d (drill)\n", rank, s);
      std::exit(0);  // without telling the others: their next collective never completes
    }
    if (s == o.fail_step && rank == o.hang_rank) {
      std::fprintf(stderr, "[dp_train] rank %d: hanging at step %d (drill)\n", rank, s);
      std::this_thread::sleep_for(std::chrono::hours(1));
    }
    std::vector<int64_t> idx;
    for (int64_t i = mine.begin; i < mine.end; ++i)
      idx.push_back(perm[(static_cast<int64_t>(s) * o.global_batch + i) % n]);
    const Feeds feeds = {{x, images.take_rows(idx)}, {y, labels.take_rows(idx)}};
    if (queue) {
      ExecutionDescriptor d;
      d.signal_events = {{steps_done, static_cast<uint64_t>(s) + 1}};
      auto next = step.run_async(*queue, feeds, d);
      write_loss();  // the previous step's, while this one runs
      in_flight = std::move(next);
      if (s == o.checkpoint_step) steps_done.wait(static_cast<uint64_t>(s) + 1);
    } else {
      in_flight = std::async(std::launch::deferred, [&] { return step.run(feeds); });
      write_loss();
    }
    if (s == o.checkpoint_step && !o.checkpoint.empty()) {
      if (comm) dist::save_checkpoint(step, *comm, o.checkpoint);
      else step.save(o.checkpoint);
    }
  }
  write_loss();
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  if (out) std::fclose(out);
  if (rank == 0)
    fmt::print("dp_train: {} steps of global batch {} on {} rank(s) ({}) in {:.1f} ms\n", o.steps,
               o.global_batch, size, o.transport, ms);
  if (comm) comm->barrier();
  dist::unregister_group();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IONBF, 0);
  Options o;
  CLI::App app{"Data-parallel training of the digits convnet"};
  app.add_option("--data", o.data, "Folder with digits_images.npy and digits_labels.npy");
  app.add_option("--transport", o.transport, "none, mpi or nccl");
  app.add_option("--out", o.out, "Rank 0 writes each step's loss here");
  app.add_option("--steps", o.steps);
  app.add_option("--global-batch", o.global_batch);
  app.add_option("--lr", o.lr);
  app.add_option("--bucket-bytes", o.bucket_bytes);
  app.add_option("--checkpoint", o.checkpoint, "Package written by rank 0 at --checkpoint-step");
  app.add_option("--checkpoint-step", o.checkpoint_step);
  app.add_option("--device", o.device, "cpu or cuda:N (default: cuda:LOCAL_RANK for nccl)");
  app.add_flag("--queue", o.queue, "Run the steps with run_async on a queue");
  app.add_flag("--selftest", o.selftest, "Check every collective against references and exit");
  app.add_option("--kill-rank", o.kill_rank);
  app.add_option("--hang-rank", o.hang_rank);
  app.add_option("--exit-rank", o.exit_rank);
  app.add_option("--fail-step", o.fail_step);
  CLI11_PARSE(app, argc, argv);
  try {
    return train(o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
