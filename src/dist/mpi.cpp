// The MPI communicator (library kiln::dist_mpi): CPU processes launched by mpirun.
//
// One worker thread per process issues every MPI call (MPI_THREAD_SERIALIZED is enough) as a
// non-blocking collective and polls it against the communicator's timeout, so a dead or hung peer
// turns into CommError on every waiting thread instead of a hang. Collectives run in the order
// they were started; start() returns at once and wait() blocks until the ticket completes.
// f16 and bf16 (which MPI lacks) reduce through f32 copies. At exit the worker stops and MPI is
// finalized; after a failure the job is aborted (MPI_Abort) so no rank is left hanging.
#include <mpi.h>

#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <limits>
#include <mutex>
#include <thread>

#include "core/errors.h"
#include "dist/host_reduce.h"
#include "kiln/dist.h"

namespace kiln::dist {

namespace {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::all_reduce: return "all_reduce";
    case Collective::broadcast: return "broadcast";
    case Collective::all_gather: return "all_gather";
    case Collective::reduce_scatter: return "reduce_scatter";
  }
  return "collective";
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i8: return MPI_INT8_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::i16: return MPI_INT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    default: return MPI_DATATYPE_NULL;  // f16, bf16, bool: moved as bytes or through f32
  }
}

MPI_Op mpi_op(Reduction r) {
  switch (r) {
    case Reduction::sum: case Reduction::mean: return MPI_SUM;
    case Reduction::prod: return MPI_PROD;
    case Reduction::min: return MPI_MIN;
    case Reduction::max: return MPI_MAX;
  }
  return MPI_SUM;
}

bool is_half(DType t) { return t == f16 || t == bf16; }

void to_f32(DType t, const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    dst[i] = t == f16 ? static_cast<float>(static_cast<const float16_t*>(src)[i])
                      : static_cast<float>(static_cast<const bfloat16_t*>(src)[i]);
}
void from_f32(DType t, const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (t == f16) static_cast<float16_t*>(dst)[i] = float16_t(src[i]);
    else static_cast<bfloat16_t*>(dst)[i] = bfloat16_t(src[i]);
  }
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
        fail<CommError>("[dist] mpi: MPI_Init_thread failed");
      if (provided < MPI_THREAD_SERIALIZED)
        fail<CommError>("[dist] mpi: the MPI library gives thread level {}; kiln needs "
                        "MPI_THREAD_SERIALIZED",
                        provided);
      own_mpi_ = true;
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    worker_ = std::thread([this] { work(); });
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return Device::cpu(); }
  std::string backend() const override { return "mpi"; }

  uint64_t start(const CollectiveArgs& args, void* stream) override {
    if (stream) fail<UnsupportedError>("[dist] the MPI communicator runs on the CPU only");
    if (args.count < 0) fail<ValueError>("[dist] mpi: negative count {}", args.count);
    const bool reduces =
        args.kind == Collective::all_reduce || args.kind == Collective::reduce_scatter;
    if (reduces && args.dtype == boolean)
      fail<DTypeError>("[dist] mpi: bool tensors cannot be reduced");
    if (args.kind == Collective::broadcast && (args.root < 0 || args.root >= size_))
      fail<ValueError>("[dist] mpi: broadcast root {} is not a rank of {}", args.root, size_);
    std::lock_guard<std::mutex> l(mu_);
    if (!broken_.empty()) throw CommError(broken_);
    if (stopping_) fail<CommError>("[dist] mpi: the communicator is shutting down");
    const uint64_t ticket = next_ticket_++;
    queue_.push_back({args, ticket, false});
    cv_.notify_all();
    return ticket;
  }

  void wait(uint64_t ticket, void* stream) override {
    std::unique_lock<std::mutex> l(mu_);
    done_cv_.wait(l, [&] { return completed_ >= ticket || !broken_.empty(); });
    if (completed_ < ticket) throw CommError(broken_);
  }

  void barrier() override {
    uint64_t ticket;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!broken_.empty()) throw CommError(broken_);
      ticket = next_ticket_++;
      queue_.push_back({{}, ticket, true});
      cv_.notify_all();
    }
    wait(ticket, nullptr);
  }

  // At exit: stop the worker, then finalize MPI (or abort the job after a failure, so ranks
  // blocked in a collective with this one do not hang).
  void shutdown() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
      cv_.notify_all();
    }
    if (worker_.joinable()) worker_.join();
    if (!own_mpi_) return;
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (!broken_.empty()) {
      std::fflush(stdout);
      std::fprintf(stderr, "%s\n[dist] mpi: aborting the job\n", broken_.c_str());
      std::fflush(stderr);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Comm_free(&comm_);
    MPI_Finalize();
  }

 private:
  struct Job {
    CollectiveArgs a;
    uint64_t ticket = 0;
    bool barrier = false;
  };

  void work() {
    for (;;) {
      Job job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return !queue_.empty() || stopping_; });
        if (queue_.empty() || !broken_.empty()) return;
        job = queue_.front();
        queue_.pop_front();
      }
      std::string error;
      try {
        run(job);
      } catch (const std::exception& e) {
        error = e.what();
      }
      std::lock_guard<std::mutex> l(mu_);
      if (!error.empty()) {
        broken_ = error;
        queue_.clear();
        done_cv_.notify_all();
        return;
      }
      completed_ = job.ticket;
      done_cv_.notify_all();
    }
  }

  // Issues one non-blocking collective and polls it until it completes or times out.
  void run(const Job& job) {
    const CollectiveArgs& a = job.a;
    MPI_Request req = MPI_REQUEST_NULL;
    const int64_t elem = static_cast<int64_t>(size_of(a.dtype));
    std::vector<float> send32, recv32;  // f16/bf16 reductions
    auto check_count = [&](int64_t n) {
      if (n > std::numeric_limits<int>::max())
        fail<UnsupportedError>("[dist] mpi: {} of {} elements exceeds MPI's int count",
                               collective_name(a.kind), n);
      return static_cast<int>(n);
    };
    const char* what = job.barrier ? "barrier" : collective_name(a.kind);
    int rc = MPI_SUCCESS;
    if (job.barrier) {
      rc = MPI_Ibarrier(comm_, &req);
    } else if (a.count == 0) {
      return;
    } else if (a.kind == Collective::all_reduce) {
      if (is_half(a.dtype)) {
        send32.resize(a.count);
        to_f32(a.dtype, a.send, send32.data(), a.count);
        rc = MPI_Iallreduce(MPI_IN_PLACE, send32.data(), check_count(a.count), MPI_FLOAT,
                            mpi_op(a.op), comm_, &req);
      } else {
        rc = MPI_Iallreduce(a.send == a.recv ? MPI_IN_PLACE : a.send, a.recv,
                            check_count(a.count), mpi_type(a.dtype), mpi_op(a.op), comm_, &req);
      }
    } else if (a.kind == Collective::broadcast) {
      if (a.send != a.recv && rank_ == a.root)
        std::memcpy(a.recv, a.send, static_cast<size_t>(a.count * elem));
      rc = MPI_Ibcast(a.recv, check_count(a.count * elem), MPI_BYTE, a.root, comm_, &req);
    } else if (a.kind == Collective::all_gather) {
      rc = MPI_Iallgather(a.send, check_count(a.count * elem), MPI_BYTE, a.recv,
                          check_count(a.count * elem), MPI_BYTE, comm_, &req);
    } else {  // reduce_scatter
      if (is_half(a.dtype)) {
        send32.resize(a.count * size_);
        recv32.resize(a.count);
        to_f32(a.dtype, a.send, send32.data(), a.count * size_);
        rc = MPI_Ireduce_scatter_block(send32.data(), recv32.data(), check_count(a.count),
                                       MPI_FLOAT, mpi_op(a.op), comm_, &req);
      } else {
        rc = MPI_Ireduce_scatter_block(a.send, a.recv, check_count(a.count), mpi_type(a.dtype),
                                       mpi_op(a.op), comm_, &req);
      }
    }
    if (rc != MPI_SUCCESS) fail<CommError>("[dist] mpi: {} failed to start (error {})", what, rc);
    poll(req, what, a);
    // finish what MPI does not do itself
    const bool reduced = !job.barrier && (a.kind == Collective::all_reduce ||
                                          a.kind == Collective::reduce_scatter);
    if (!reduced) return;
    if (is_half(a.dtype)) {
      std::vector<float>& r = a.kind == Collective::all_reduce ? send32 : recv32;
      if (a.op == Reduction::mean)
        for (float& v : r) v /= static_cast<float>(size_);
      from_f32(a.dtype, r.data(), a.recv, a.count);
    } else if (a.op == Reduction::mean) {
      detail::divide_host(a.dtype, a.recv, a.count, size_);
    }
  }

  void poll(MPI_Request& req, const char* what, const CollectiveArgs& a) {
    const auto t0 = std::chrono::steady_clock::now();
    const auto deadline = t0 + timeout();
    for (;;) {
      int flag = 0;
      if (MPI_Test(&req, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS)
        fail<CommError>("[dist] mpi: {} failed on rank {} of {}", what, rank_, size_);
      if (flag) return;
      const auto now = std::chrono::steady_clock::now();
      if (now > deadline)
        fail<CommError>("[dist] mpi: {} of {} {} elements did not complete within {:.1f} s on rank "
                        "{} of {}: another rank died, hung, or issued different collectives "
                        "(timeout: Communicator::set_timeout or KILN_DIST_TIMEOUT)",
                        what, a.count, name(a.dtype), timeout().count() / 1e3, rank_, size_);
      // MPI moves a large message only while it is tested, a fragment per call: keep testing,
      // yielding the core between tests (a blocking MPI call polls the same way)
      std::this_thread::yield();
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  bool own_mpi_ = false;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  std::deque<Job> queue_;
  uint64_t next_ticket_ = 1, completed_ = 0;
  bool stopping_ = false;
  std::string broken_;
};

MpiCommunicator* g_world = nullptr;
std::shared_ptr<Communicator> g_world_ref;
}  // namespace

std::shared_ptr<Communicator> mpi_world() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_world = new MpiCommunicator();  // lives until exit; shut down by the handler below
    g_world_ref = std::shared_ptr<Communicator>(g_world, [](Communicator*) {});
    std::atexit([] { g_world->shutdown(); });
  });
  return g_world_ref;
}

}  // namespace kiln::dist
