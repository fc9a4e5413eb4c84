// Collectives (all_reduce, collective_wait), their scheduling, and data-parallel training, on
// in-process groups whose ranks are threads (dist::local_group). MPI and NCCL run the same ops in
// tests/dist/.
#include <algorithm>
#include <cmath>
#include <exception>
#include <thread>

#include "kiln/dist.h"
#include "support/reference.h"

namespace kiln {
namespace {

using dist::Reduction;

// Runs f(rank, comm) on `n` threads, each with its rank registered as the "world" group.
template <typename F> void on_ranks(int n, F f, std::chrono::milliseconds timeout = {}) {
  auto comms = dist::local_group(n);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r)
    threads.emplace_back([&, r] {
      try {
        if (timeout.count()) comms[r]->set_timeout(timeout);
        dist::ScopedGroup scoped(comms[r]);
        f(r, *comms[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

double reduce_ref(Reduction op, const std::vector<double>& v, bool integer) {
  double acc = v[0];
  for (size_t i = 1; i < v.size(); ++i) {
    switch (op) {
      case Reduction::sum: case Reduction::mean: acc += v[i]; break;
      case Reduction::prod: acc *= v[i]; break;
      case Reduction::min: acc = std::min(acc, v[i]); break;
      case Reduction::max: acc = std::max(acc, v[i]); break;
    }
  }
  if (op == Reduction::mean) {
    acc /= static_cast<double>(v.size());
    if (integer) acc = std::trunc(acc);
  }
  return acc;
}

TEST(AllReduce, MatchesFloat64ReferenceForEveryReductionAndDtype) {
  constexpr int kRanks = 3;
  const Shape shape{5, 7};
  for (DType t : {f32, f64, f16, bf16, i8, u8, i16, u16, i32, u32, i64, u64})
    for (Reduction op : {Reduction::sum, Reduction::mean, Reduction::min, Reduction::max,
                         Reduction::prod}) {
      SCOPED_TRACE(std::string(name(t)) + " " + dist::reduction_name(op));
      const bool integer = !is_floating(t);
      // small values keep products and sums inside every dtype
      std::vector<Array> inputs;
      for (int r = 0; r < kRanks; ++r)
        inputs.push_back(op == Reduction::prod ? test::random_array(shape, t, 1, 3)
                         : integer             ? test::random_array(shape, t, 0, 20)
                                               : test::random_array(shape, t, -2, 2));
      std::vector<Array> results(kRanks);
      on_ranks(kRanks, [&](int r, dist::Communicator&) {
        Graph g;
        Tensor x = g.placeholder(shape, t, "x");
        Tensor y = dist::all_reduce(x, {.op = op});
        results[r] = g.compile(Device::cpu(), {}, {y}).run({{x, inputs[r]}})[0];
      });
      std::vector<std::vector<double>> in64;
      for (auto& a : inputs) in64.push_back(test::to_f64(a));
      std::vector<double> want(in64[0].size());
      for (size_t i = 0; i < want.size(); ++i) {
        std::vector<double> v;
        for (auto& a : in64) v.push_back(a[i]);
        want[i] = reduce_ref(op, v, integer);
      }
      for (int r = 0; r < kRanks; ++r) {
        if (integer) test::expect_equal(results[r], shape, want);
        else test::expect_close(results[r], shape, want, test::tolerance(t), test::tolerance(t));
        // every rank holds the same bits
        EXPECT_EQ(std::memcmp(results[r].data(), results[0].data(), results[0].nbytes()), 0);
      }
    }
}

TEST(AllReduce, WithoutAGroupASingleProcessIsAGroupOfOne) {
  Graph g;
  Tensor x = g.placeholder({4, 33}, f32, "x");
  Tensor y = dist::all_reduce(x * 2.0, {.op = Reduction::mean});
  Array a = test::random_array({4, 33}, f32);
  Array got = g.compile(Device::cpu(), {}, {y}).run({{x, a}})[0];
  std::vector<double> want = test::to_f64(a);
  for (double& v : want) v *= 2;
  test::expect_close(got, {4, 33}, want, 0, 0);
}

TEST(AllReduce, GradientIsTheReducedCotangent) {
  // rank r: L_r = sum(all_reduce(x_r) * w_r); d(sum over ranks of L)/dx_r = sum over q of w_q
  constexpr int kRanks = 2;
  std::vector<Array> xs, ws;
  for (int r = 0; r < kRanks; ++r) {
    xs.push_back(test::random_array({3, 4}, f64));
    ws.push_back(test::random_array({3, 4}, f64));
  }
  std::vector<Array> grads(kRanks);
  on_ranks(kRanks, [&](int r, dist::Communicator&) {
    Graph g;
    Tensor x = g.placeholder({3, 4}, f64, "x");
    Tensor w = g.constant(ws[r]);
    Tensor loss = sum(dist::all_reduce(x) * w);
    grads[r] = g.compile(Device::cpu(), {}, gradients(loss, {x})).run({{x, xs[r]}})[0];
  });
  std::vector<double> want(12, 0);
  for (auto& w : ws) {
    auto v = test::to_f64(w);
    for (size_t i = 0; i < 12; ++i) want[i] += v[i];
  }
  for (auto& gr : grads) test::expect_close(gr, {3, 4}, want, 1e-12, 1e-12);
}

TEST(AllReduce, MinAndMaxHaveNoGradient) {
  Graph g;
  Tensor x = g.placeholder({3}, f32, "x");
  Tensor y = sum(dist::all_reduce(x, {.op = Reduction::max}));
  test::expect_error<UnsupportedError>([&] { gradients(y, {x}); }, {"all_reduce", "max"});
}

TEST(AllReduce, BadArgumentsAreErrors) {
  Graph g;
  Tensor b = g.placeholder({3}, boolean, "b");
  test::expect_error<DTypeError>([&] { dist::all_reduce(b); }, {"all_reduce", "bool"});
  Tensor x = g.placeholder({3}, f32, "x");
  test::expect_error<ValueError>([&] { dist::all_reduce(x, {.group = ""}); }, {"group"});
  test::expect_error<ValueError>([&] { dist::group("no-such-group"); },
                                 {"no-such-group", "registered"});
}

TEST(AllReduce, ARankThatNeverJoinsTimesOutOnEveryRank) {
  auto comms = dist::local_group(2);
  comms[0]->set_timeout(std::chrono::milliseconds(200));
  Array a = Array::from_vector<float>({1, 2, 3}, {3});
  const auto t0 = std::chrono::steady_clock::now();
  test::expect_error<dist::CommError>([&] { comms[0]->all_reduce(a); },
                                      {"did not complete within 200 ms", "rank(s) 1 never joined"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5));
  // the group is closed for the other rank too, instead of leaving it to hang
  test::expect_error<dist::CommError>([&] { comms[1]->all_reduce(a); }, {"never joined"});
}

TEST(AllReduce, RanksThatDisagreeFailLoudly) {
  EXPECT_THROW(on_ranks(2,
                        [](int r, dist::Communicator& c) {
                          Array a = Array::zeros({r == 0 ? 3 : 4}, f32);
                          c.all_reduce(a);
                        }),
               dist::CommError);
}

// ---- scheduling ----

// A three-layer perceptron's loss and its variables.
struct Mlp {
  Tensor x, y, loss;
  std::vector<Tensor> params;
  Mlp(Graph& g, int64_t batch, uint64_t seed) {
    std::mt19937_64 rng(seed);
    auto init = [&](const Shape& s) {
      Array a = Array::empty(s, f32);
      std::normal_distribution<float> d(0, 0.3f);
      for (int64_t i = 0; i < a.numel(); ++i) a.data<float>()[i] = d(rng);
      return a;
    };
    const int64_t dims[] = {12, 32, 24, 5};
    for (int l = 0; l < 3; ++l) {
      params.push_back(g.variable(init({dims[l + 1], dims[l]}), "w" + std::to_string(l)));
      params.push_back(g.variable(init({dims[l + 1]}), "b" + std::to_string(l)));
    }
    x = g.placeholder({batch, 12}, f32, "x");
    y = g.placeholder({batch}, i64, "y");
    Tensor h = x;
    for (int l = 0; l < 3; ++l) {
      h = linear(h, params[2 * l], params[2 * l + 1]);
      if (l < 2) h = tanh(h);
    }
    loss = softmax_cross_entropy(h, y);
  }
};

std::vector<std::string> step_ops(const Executable& e) {
  std::vector<std::string> ops;
  for (auto& s : e.placement()) ops.push_back(s.op);
  return ops;
}

TEST(CollectiveWait, StartsRunDuringTheBackwardPassAndWaitsAtTheEnd) {
  Graph g;
  Mlp m(g, 8, 1);
  // one bucket per gradient: each can start as soon as its layer's backward is done
  auto grads = dist::all_reduce_gradients(gradients(m.loss, m.params), {.bucket_bytes = 1, .first_bucket_bytes = 1});
  Executable e = g.compile(Device::cpu(), {}, {m.loss}, optim::sgd(g, m.params, grads, {.lr = 0.1}));
  const auto ops = step_ops(e);
  auto first = [&](const std::string& op) {
    return std::find(ops.begin(), ops.end(), op) - ops.begin();
  };
  auto last = [&](const std::string& op) {
    return ops.rend() - std::find(ops.rbegin(), ops.rend(), op) - 1;
  };
  ASSERT_EQ(std::count(ops.begin(), ops.end(), "all_reduce"), 6);
  ASSERT_EQ(std::count(ops.begin(), ops.end(), "collective_wait"), 6);
  // the last layer's gradients start before the first layer's backward matmuls
  EXPECT_LT(first("all_reduce"), last("matmul"));
  // every wait after every start, and every update after every wait
  EXPECT_LT(last("all_reduce"), first("collective_wait"));
  EXPECT_LT(last("collective_wait"), first("assign"));
}

TEST(CollectiveWait, BucketsPackGradientsOfOneDtype) {
  constexpr int kRanks = 2;
  std::vector<Array> xs, ys;
  for (int r = 0; r < kRanks; ++r) {
    xs.push_back(test::random_array({8, 12}, f32));
    ys.push_back(test::random_ints({8}, 0, 4));
  }
  std::vector<std::vector<Array>> local(kRanks), reduced(kRanks);
  size_t starts = 0;
  on_ranks(kRanks, [&](int r, dist::Communicator&) {
    Graph g;
    Mlp m(g, 8, 5);
    auto grads = gradients(m.loss, m.params);
    auto red = dist::all_reduce_gradients(grads);  // 25 MB buckets: all six in one
    std::vector<Tensor> outs = grads;
    outs.insert(outs.end(), red.begin(), red.end());
    Executable e = g.compile(Device::cpu(), {}, outs);
    auto got = e.run({{m.x, xs[r]}, {m.y, ys[r]}});
    local[r].assign(got.begin(), got.begin() + 6);
    reduced[r].assign(got.begin() + 6, got.end());
    if (r == 0) {
      const auto ops = step_ops(e);
      starts = static_cast<size_t>(std::count(ops.begin(), ops.end(), "all_reduce"));
    }
  });
  EXPECT_EQ(starts, 1u);
  for (size_t i = 0; i < 6; ++i) {
    auto a = test::to_f64(local[0][i]), b = test::to_f64(local[1][i]);
    std::vector<double> want(a.size());
    for (size_t k = 0; k < a.size(); ++k) want[k] = (a[k] + b[k]) / 2;
    for (int r = 0; r < kRanks; ++r)
      test::expect_close(reduced[r][i], local[0][i].shape(), want, 1e-6, 1e-7);
  }
}

// ---- data-parallel training ----

TEST(DataParallel, TwoRanksTrainLikeOneProcessWithTheCombinedBatch) {
  constexpr int kRanks = 2, kSteps = 12, kBatch = 16;
  std::vector<Array> xs, ys;
  for (int s = 0; s < kSteps; ++s) {
    xs.push_back(test::random_array({kBatch, 12}, f32));
    ys.push_back(test::random_ints({kBatch}, 0, 4));
  }
  auto rows = [](const Array& a, int64_t begin, int64_t end) {
    std::vector<int64_t> idx;
    for (int64_t i = begin; i < end; ++i) idx.push_back(i);
    return a.take_rows(idx);
  };
  // one process, the whole batch
  std::vector<double> want_losses;
  std::vector<Array> want_vars;
  {
    Graph g;
    Mlp m(g, kBatch, 42);
    Executable e = g.compile(Device::cpu(), {}, {m.loss},
                             optim::sgd(g, m.params, gradients(m.loss, m.params),
                                        {.lr = 0.2, .momentum = 0.9}));
    for (int s = 0; s < kSteps; ++s)
      want_losses.push_back(e.run({{m.x, xs[s]}, {m.y, ys[s]}})[0].to_vector<double>()[0]);
    for (auto& v : m.params) want_vars.push_back(g.read_variable(v));
  }
  // two ranks, half the batch each, starting from different weights that rank 0's replace
  std::vector<std::vector<double>> losses(kRanks);
  std::vector<std::vector<Array>> vars(kRanks);
  on_ranks(kRanks, [&](int r, dist::Communicator& comm) {
    Graph g;
    Mlp m(g, kBatch / kRanks, r == 0 ? 42 : 1000 + r);
    auto grads = dist::all_reduce_gradients(gradients(m.loss, m.params), {.bucket_bytes = 2048});
    Tensor global_loss = dist::all_reduce(m.loss, {.op = Reduction::mean});
    Executable e = g.compile(Device::cpu(), {}, {global_loss},
                             optim::sgd(g, m.params, grads, {.lr = 0.2, .momentum = 0.9}));
    dist::broadcast_variables(e, comm);
    const dist::Shard sh = dist::shard(kBatch, r, kRanks);
    for (int s = 0; s < kSteps; ++s) {
      auto out = e.run({{m.x, rows(xs[s], sh.begin, sh.end)}, {m.y, rows(ys[s], sh.begin, sh.end)}});
      losses[r].push_back(out[0].to_vector<double>()[0]);
    }
    for (auto& v : m.params) vars[r].push_back(g.read_variable(v));
  });
  for (int r = 0; r < kRanks; ++r) {
    for (int s = 0; s < kSteps; ++s)
      EXPECT_NEAR(losses[r][s], want_losses[s], 1e-5 * (1 + std::abs(want_losses[s])))
          << "rank " << r << " step " << s;
    for (size_t i = 0; i < want_vars.size(); ++i) {
      // the ranks stay identical bit for bit; the single process agrees to rounding
      ASSERT_EQ(std::memcmp(vars[r][i].data(), vars[0][i].data(), vars[0][i].nbytes()), 0);
      test::expect_close(vars[r][i], want_vars[i].shape(), test::to_f64(want_vars[i]), 1e-4, 1e-5);
    }
  }
}

// ---- host collectives and helpers ----

TEST(DistHost, BroadcastAllGatherReduceScatterAndBarrier) {
  constexpr int kRanks = 4;
  std::vector<Array> in;
  for (int r = 0; r < kRanks; ++r) in.push_back(test::random_array({8, 3}, f32));
  std::vector<Array> bcast(kRanks), gathered(kRanks), scattered(kRanks);
  on_ranks(kRanks, [&](int r, dist::Communicator& c) {
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), kRanks);
    bcast[r] = in[r].copy();
    c.broadcast(bcast[r], 2);
    gathered[r] = c.all_gather(in[r]);
    scattered[r] = c.reduce_scatter(in[r]);
    c.barrier();
  });
  for (int r = 0; r < kRanks; ++r) {
    test::expect_close(bcast[r], {8, 3}, test::to_f64(in[2]), 0, 0);
    std::vector<double> cat;
    for (auto& a : in) {
      auto v = test::to_f64(a);
      cat.insert(cat.end(), v.begin(), v.end());
    }
    test::expect_close(gathered[r], {kRanks, 8, 3}, cat, 0, 0);
    std::vector<double> want(6, 0);
    for (auto& a : in) {
      auto v = test::to_f64(a);
      for (int k = 0; k < 6; ++k) want[k] += v[r * 6 + k];
    }
    test::expect_close(scattered[r], {2, 3}, want, 1e-6, 1e-6);
  }
  auto one = dist::local_group(1);
  test::expect_error<ShapeError>([&] { dist::local_group(3)[0]->reduce_scatter(in[0]); },
                                 {"reduce_scatter", "divide"});
  test::expect_error<ValueError>([&] { one[0]->broadcast(in[0], 1); }, {"root 1"});
}

TEST(DistHost, ShardsCoverEveryItemOnce) {
  for (int64_t n : {0, 1, 7, 64, 1001})
    for (int size : {1, 2, 3, 8}) {
      int64_t next = 0;
      for (int r = 0; r < size; ++r) {
        const auto s = dist::shard(n, r, size);
        EXPECT_EQ(s.begin, next);
        EXPECT_LE(s.size(), n / size + 1);
        EXPECT_GE(s.size(), n / size);
        next = s.end;
      }
      EXPECT_EQ(next, n);
    }
  // an epoch: disjoint equal parts of one permutation, the same on every rank
  std::vector<int64_t> seen;
  for (int r = 0; r < 3; ++r) {
    auto part = dist::sharded_epoch(100, 9, 4, r, 3);
    EXPECT_EQ(part.size(), 33u);
    EXPECT_EQ(part, dist::sharded_epoch(100, 9, 4, r, 3));
    seen.insert(seen.end(), part.begin(), part.end());
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_TRUE(std::adjacent_find(seen.begin(), seen.end()) == seen.end());
  EXPECT_NE(dist::sharded_epoch(100, 9, 4, 0, 3), dist::sharded_epoch(100, 9, 5, 0, 3));
  test::expect_error<ValueError>([] { dist::shard(5, 3, 3); }, {"rank 3 of 3"});
}

}  // namespace
}  // namespace kiln
