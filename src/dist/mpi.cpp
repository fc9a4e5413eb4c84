// The MPI communicator (library kiln::dist_mpi): CPU processes launched by mpirun.
//
// One worker thread per process issues the collectives, as blocking MPI calls (Open MPI's tuned
// algorithms; its non-blocking ones are slower), in the order they were started; start() returns
// at once and wait() blocks until the ticket completes. A waiter that sees the worker stuck in one
// collective for longer than the timeout (a dead or hung peer) closes the communicator: every
// waiting thread gets CommError instead of hanging, and at exit the job is aborted, since the
// worker cannot be called back out of MPI (MPI_THREAD_MULTIPLE, so the abort may run meanwhile).
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

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32: return MPI_FLOAT;
    case DType::f64: return MPI_DOUBLE;
    case DType::i8: return MPI_INT8_T;
    case DType::u8: return MPI_UINT8_T;
    case DType::i16: return MPI_INT16_T;
    case DType::i32: return MPI_INT32_T;
    case DType::i64: return MPI_INT64_T;
    case DType::u16:
      return MPI_UINT16_T;
    case DType::u32:
      return MPI_UINT32_T;
    case DType::u64:
      return MPI_UINT64_T;
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
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS)
        fail<CommError>("[dist] mpi: MPI_Init_thread failed");
      if (provided < MPI_THREAD_MULTIPLE)
        fail<CommError>("[dist] mpi: the MPI library gives thread level {}; kiln needs "
                        "MPI_THREAD_MULTIPLE",
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
    while (completed_ < ticket && broken_.empty()) {
      done_cv_.wait_for(l, std::chrono::milliseconds(50));
      if (completed_ >= ticket || !broken_.empty() || !busy_) continue;
      const auto stuck = std::chrono::steady_clock::now() - busy_since_;
      if (stuck > timeout()) {
        broken_ = fmt::format(
            "[dist] mpi: {} of {} {} elements did not complete within {:.1f} s on rank {} of {}: "
            "another rank died, hung, or issued different collectives (timeout: "
            "Communicator::set_timeout or KILN_DIST_TIMEOUT)",
            busy_what_, busy_count_, name(busy_dtype_), timeout().count() / 1e3, rank_, size_);
        stuck_ = true;
        done_cv_.notify_all();
      }
    }
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
      std::unique_lock<std::mutex> l(mu_);
      stopping_ = true;
      cv_.notify_all();
      // the worker finishes what was started; a collective that no peer completes (a rank
      // that left early or died) must not hang the exit
      const auto deadline = std::chrono::steady_clock::now() + timeout();
      while ((busy_ || !queue_.empty()) && broken_.empty()) {
        if (done_cv_.wait_until(l, deadline) == std::cv_status::timeout &&
            (busy_ || !queue_.empty()) && broken_.empty()) {
          broken_ = fmt::format("[dist] mpi: at exit, {} did not complete within {:.1f} s on rank "
                                "{} of {}: another rank died, hung, or stopped issuing "
                                "collectives",
                                busy_ ? busy_what_ : "a queued collective",
                                timeout().count() / 1e3, rank_, size_);
          stuck_ = busy_;
        }
      }
    }
    if (stuck_) {  // the worker is inside a collective that will never return
      worker_.detach();
    } else if (worker_.joinable()) {
      worker_.join();
    }
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
        busy_ = true;
        busy_since_ = std::chrono::steady_clock::now();
        busy_what_ = job.barrier ? "barrier" : collective_name(job.a.kind);
        busy_count_ = job.a.count;
        busy_dtype_ = job.a.dtype;
      }
      std::string error;
      try {
        run(job);
      } catch (const std::exception& e) {
        error = e.what();
      }
      std::lock_guard<std::mutex> l(mu_);
      busy_ = false;
      if (!broken_.empty()) return;  // a waiter gave up on this collective
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

  // Runs one collective (blocking; the waiters watch the time it takes).
  void run(const Job& job) {
    const CollectiveArgs& a = job.a;
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
      rc = MPI_Barrier(comm_);
    } else if (a.count == 0) {
      return;
    } else if (a.kind == Collective::all_reduce) {
      if (is_half(a.dtype)) {
        send32.resize(a.count);
        to_f32(a.dtype, a.send, send32.data(), a.count);
        rc = MPI_Allreduce(MPI_IN_PLACE, send32.data(), check_count(a.count), MPI_FLOAT,
                           mpi_op(a.op), comm_);
      } else {
        rc = MPI_Allreduce(a.send == a.recv ? MPI_IN_PLACE : a.send, a.recv,
                           check_count(a.count), mpi_type(a.dtype), mpi_op(a.op), comm_);
      }
    } else if (a.kind == Collective::broadcast) {
      if (a.send != a.recv && rank_ == a.root)
        std::memcpy(a.recv, a.send, static_cast<size_t>(a.count * elem));
      rc = MPI_Bcast(a.recv, check_count(a.count * elem), MPI_BYTE, a.root, comm_);
    } else if (a.kind == Collective::all_gather) {
      rc = MPI_Allgather(a.send, check_count(a.count * elem), MPI_BYTE, a.recv,
                         check_count(a.count * elem), MPI_BYTE, comm_);
    } else {  // reduce_scatter
      if (is_half(a.dtype)) {
        send32.resize(a.count * size_);
        recv32.resize(a.count);
        to_f32(a.dtype, a.send, send32.data(), a.count * size_);
        rc = MPI_Reduce_scatter_block(send32.data(), recv32.data(), check_count(a.count),
                                      MPI_FLOAT, mpi_op(a.op), comm_);
      } else {
        rc = MPI_Reduce_scatter_block(a.send, a.recv, check_count(a.count), mpi_type(a.dtype),
                                      mpi_op(a.op), comm_);
      }
    }
    if (rc != MPI_SUCCESS) fail<CommError>("[dist] mpi: {} failed (error {})", what, rc);
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
  // the collective the worker is in, for the waiters' timeout
  bool busy_ = false, stuck_ = false;
  std::chrono::steady_clock::time_point busy_since_;
  const char* busy_what_ = "";
  int64_t busy_count_ = 0;
  DType busy_dtype_ = f32;
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
