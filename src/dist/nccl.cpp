// The NCCL communicator (library kiln::dist_nccl): one rank per process and GPU.
//
// Collectives run on the communicator's own stream: start() records an event on the caller's
// stream, makes the NCCL stream wait for it, enqueues the collective and records a done event;
// wait() makes the caller's stream wait for that event (no host synchronization), or blocks the
// host when called without a stream. A watchdog thread checks the done events: a collective that
// exceeds timeout() (a peer died or hung) aborts the communicator, prints why, and ends the
// process with status 1, as a hung GPU stream cannot be cancelled otherwise and later results
// would be wrong (KILN_DIST_ABORT=0 keeps the process: every later call then throws CommError).
//
// Bootstrap: rank 0 makes the NCCL id and hands it to the others through the rendezvous folder
// (KILN_RENDEZVOUS=file:DIR, which `kiln launch` sets); a single rank needs no rendezvous.
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>

#include "core/errors.h"
#include "kiln/dist.h"
#include "runtime/env.h"

namespace kiln::dist {

namespace {

using clock_type = std::chrono::steady_clock;

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    fail<DeviceError>("[dist] nccl: {} failed: {}", what, cudaGetErrorString(e));
}

bool nccl_type(DType t, ncclDataType_t& out) {
  switch (t) {
    case DType::f32: out = ncclFloat32; return true;
    case DType::f16: out = ncclFloat16; return true;
    case DType::bf16: out = ncclBfloat16; return true;
    case DType::f64: out = ncclFloat64; return true;
    case DType::i8: out = ncclInt8; return true;
    case DType::u8: out = ncclUint8; return true;
    case DType::i32: out = ncclInt32; return true;
    case DType::i64: out = ncclInt64; return true;
    case DType::u32:
      out = ncclUint32;
      return true;
    case DType::u64:
      out = ncclUint64;
      return true;
    default:
      return false;  // i16, u16, bool: only moved as bytes
  }
}

ncclRedOp_t nccl_op(Reduction r) {
  switch (r) {
    case Reduction::sum: return ncclSum;
    case Reduction::mean: return ncclAvg;
    case Reduction::prod: return ncclProd;
    case Reduction::min: return ncclMin;
    case Reduction::max: return ncclMax;
  }
  return ncclSum;
}

// rank 0 publishes the id in DIR/NAME; the others wait for it (atomic rename: never half a file)
ncclUniqueId exchange_id(const LaunchInfo& info, const std::string& name,
                         std::chrono::milliseconds timeout) {
  ncclUniqueId id{};
  if (info.size == 1) {
    if (ncclGetUniqueId(&id) != ncclSuccess) fail<CommError>("[dist] nccl: ncclGetUniqueId failed");
    return id;
  }
  if (info.rendezvous.rfind("file:", 0) != 0)
    fail<ValueError>("[dist] nccl: rank {} of {} needs a rendezvous: set KILN_RENDEZVOUS=file:DIR "
                     "(a fresh folder every rank can read), or start the ranks with `kiln launch`",
                     info.rank, info.size);
  const std::filesystem::path dir = info.rendezvous.substr(5);
  const auto path = dir / name;
  if (info.rank == 0) {
    if (ncclGetUniqueId(&id) != ncclSuccess) fail<CommError>("[dist] nccl: ncclGetUniqueId failed");
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    const auto tmp = dir / fmt::format("{}.tmp{}", name, ::getpid());
    {
      std::ofstream f(tmp, std::ios::binary);
      f.write(reinterpret_cast<const char*>(&id), sizeof(id));
      if (!f) fail<IoError>("[dist] nccl: cannot write the rendezvous file {}", tmp.string());
    }
    std::filesystem::rename(tmp, path, ec);
    if (ec) fail<IoError>("[dist] nccl: cannot publish {}: {}", path.string(), ec.message());
    return id;
  }
  const auto deadline = clock_type::now() + timeout;
  for (;;) {
    std::ifstream f(path, std::ios::binary);
    if (f && f.read(reinterpret_cast<char*>(&id), sizeof(id)) && f.gcount() == sizeof(id))
      return id;
    if (clock_type::now() > deadline)
      fail<CommError>("[dist] nccl: rank {} of {} waited {:.1f} s for rank 0 to publish {}; did rank "
                      "0 start?",
                      info.rank, info.size, timeout.count() / 1e3, path.string());
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(Device device, const LaunchInfo& info) : device_(device) {
    if (device.kind != Device::Kind::cuda)
      fail<ValueError>("[dist] nccl_world needs a cuda device, got {}", device.str());
    rank_ = info.rank;
    size_ = info.size;
    cuda_check(cudaSetDevice(device.index), "cudaSetDevice");
    static std::atomic<int> made{0};
    const ncclUniqueId id = exchange_id(info, fmt::format("nccl-{}.id", made++), timeout());
    // A blocking communicator (collectives enqueue without polling), set up on a thread of its
    // own so that a peer that never joins times out instead of blocking this one forever.
    auto init = std::make_shared<InitState>();
    std::thread([init, id, dev = device.index, n = size_, r = rank_] {
      cudaSetDevice(dev);
      ncclComm_t c = nullptr;
      const ncclResult_t res = ncclCommInitRank(&c, n, id, r);
      std::lock_guard<std::mutex> l(init->mu);
      init->comm = c;
      init->result = res;
      init->done = true;
      init->cv.notify_all();
    }).detach();
    {
      std::unique_lock<std::mutex> l(init->mu);
      if (!init->cv.wait_for(l, timeout(), [&] { return init->done; }))
        fail<CommError>("[dist] nccl: setting up the communicator did not complete within {:.1f} s "
                        "on rank {} of {}: another rank died or never joined",
                        timeout().count() / 1e3, rank_, size_);
      if (init->result != ncclSuccess)
        fail<CommError>("[dist] nccl: ncclCommInitRank failed on rank {} of {}: {}", rank_, size_,
                        ncclGetErrorString(init->result));
      comm_ = init->comm;
    }
    cuda_check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaStreamCreateWithFlags(&host_stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    cuda_check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    watchdog_ = std::thread([this] { watch(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
    }
    if (watchdog_.joinable()) watchdog_.join();
    if (broken_.empty()) {
      cudaStreamSynchronize(stream_);
      ncclCommFinalize(comm_);
      int64_t spins = 0;
      ncclResult_t state = ncclInProgress;
      while (ncclCommGetAsyncError(comm_, &state) == ncclSuccess && state == ncclInProgress &&
             ++spins < 100000)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
      ncclCommDestroy(comm_);
    }
    for (auto& [t, f] : inflight_) cudaEventDestroy(f.done);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
    cudaStreamDestroy(host_stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Device device() const override { return device_; }
  std::string backend() const override { return "nccl"; }

  uint64_t start(const CollectiveArgs& a, void* stream) override {
    if (a.count < 0) fail<ValueError>("[dist] nccl: negative count {}", a.count);
    ncclDataType_t t{};
    const bool typed = nccl_type(a.dtype, t);
    const bool reduces = a.kind == Collective::all_reduce || a.kind == Collective::reduce_scatter;
    if (reduces && !typed)
      fail<DTypeError>("[dist] nccl: {} of {} tensors is not supported", collective_name(a.kind),
                       name(a.dtype));
    size_t count = static_cast<size_t>(a.count);
    if (!typed) {  // moved as bytes
      t = ncclUint8;
      count *= size_of(a.dtype);
    }
    if (a.kind == Collective::broadcast && (a.root < 0 || a.root >= size_))
      fail<ValueError>("[dist] nccl: broadcast root {} is not a rank of {}", a.root, size_);
    cuda_check(cudaSetDevice(device_.index), "cudaSetDevice");
    auto s = static_cast<cudaStream_t>(stream ? stream : host_stream_);
    std::lock_guard<std::mutex> l(mu_);  // NCCL calls on one communicator are serialized
    if (!broken_.empty()) throw CommError(broken_);
    cuda_check(cudaEventRecord(ready_, s), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(stream_, ready_, 0), "cudaStreamWaitEvent");
    ncclResult_t r = ncclSuccess;
    switch (a.kind) {
      case Collective::all_reduce:
        r = ncclAllReduce(a.send, a.recv, count, t, nccl_op(a.op), comm_, stream_);
        break;
      case Collective::broadcast:
        r = ncclBroadcast(a.send, a.recv, count, t, a.root, comm_, stream_);
        break;
      case Collective::all_gather:
        r = ncclAllGather(a.send, a.recv, count, t, comm_, stream_);
        break;
      case Collective::reduce_scatter:
        r = ncclReduceScatter(a.send, a.recv, count, t, nccl_op(a.op), comm_, stream_);
        break;
    }
    if (r != ncclSuccess)
      fail<CommError>("[dist] nccl: {} failed on rank {} of {}: {}", collective_name(a.kind), rank_,
                      size_, ncclGetErrorString(r));
    cudaEvent_t done = take_event();
    cuda_check(cudaEventRecord(done, stream_), "cudaEventRecord");
    const uint64_t ticket = next_ticket_++;
    inflight_[ticket] = {done, clock_type::now() + timeout(), collective_name(a.kind)};
    return ticket;
  }

  void wait(uint64_t ticket, void* stream) override {
    cudaEvent_t done;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!broken_.empty()) throw CommError(broken_);
      auto it = inflight_.find(ticket);
      if (it == inflight_.end()) return;  // the watchdog saw it complete
      done = it->second.done;
      if (stream) {
        // captured now: recycling the event afterwards does not affect this wait
        cuda_check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), done, 0),
                   "cudaStreamWaitEvent");
        return;
      }
    }
    for (int spins = 0;; ++spins) {
      {
        std::lock_guard<std::mutex> l(mu_);
        if (!broken_.empty()) throw CommError(broken_);
        auto it = inflight_.find(ticket);
        if (it == inflight_.end()) return;
        const cudaError_t q = cudaEventQuery(it->second.done);
        if (q == cudaSuccess) return;
        if (q != cudaErrorNotReady) cuda_check(q, "cudaEventQuery");
      }
      std::this_thread::sleep_for(std::chrono::microseconds(spins < 100 ? 20 : 200));
    }
  }

  void barrier() override {
    // an all_reduce of one word on the host stream
    void* word = nullptr;
    cuda_check(cudaSetDevice(device_.index), "cudaSetDevice");
    cuda_check(cudaMallocAsync(&word, sizeof(float), host_stream_), "cudaMallocAsync");
    cuda_check(cudaMemsetAsync(word, 0, sizeof(float), host_stream_), "cudaMemsetAsync");
    try {
      wait(start({Collective::all_reduce, word, word, 1, f32, Reduction::sum, 0}, nullptr), nullptr);
    } catch (...) {
      cudaFreeAsync(word, host_stream_);
      throw;
    }
    cuda_check(cudaFreeAsync(word, host_stream_), "cudaFreeAsync");
  }

 private:
  struct InitState {
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    ncclComm_t comm = nullptr;
    ncclResult_t result = ncclSuccess;
  };
  struct InFlight {
    cudaEvent_t done;
    clock_type::time_point deadline;
    const char* what;
  };

  cudaEvent_t take_event() {
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
    cudaEvent_t e;
    cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    return e;
  }

  void watch() {
    cudaSetDevice(device_.index);
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::string fatal;
      {
        std::lock_guard<std::mutex> l(mu_);
        if (stopping_ || !broken_.empty()) return;
        const auto now = clock_type::now();
        for (auto it = inflight_.begin(); it != inflight_.end();) {
          const cudaError_t q = cudaEventQuery(it->second.done);
          if (q == cudaSuccess) {
            free_events_.push_back(it->second.done);
            it = inflight_.erase(it);
            continue;
          }
          if (q != cudaErrorNotReady || now > it->second.deadline) {
            fatal = fmt::format(
                "[dist] nccl: {} (collective {}) did not complete within {:.1f} s on rank {} of "
                "{}: another rank died or hung{}",
                it->second.what, it->first, timeout().count() / 1e3, rank_, size_,
                q == cudaErrorNotReady ? "" : fmt::format(" ({})", cudaGetErrorString(q)));
            break;
          }
          ++it;
        }
        ncclResult_t state = ncclSuccess;
        if (fatal.empty() && ncclCommGetAsyncError(comm_, &state) == ncclSuccess &&
            state != ncclSuccess && state != ncclInProgress)
          fatal = fmt::format("[dist] nccl: the communicator failed on rank {} of {}: {}", rank_,
                              size_, ncclGetErrorString(state));
        if (!fatal.empty()) {
          broken_ = fatal;
          ncclCommAbort(comm_);
        }
      }
      if (!fatal.empty()) {
        std::fflush(stdout);
        std::fprintf(stderr, "%s\n", fatal.c_str());
        const char* keep = env::get(env::Var::KILN_DIST_ABORT);
        if (!(keep && std::string(keep) == "0")) {
          std::fprintf(stderr, "[dist] nccl: ending the process (KILN_DIST_ABORT=0 keeps it)\n");
          std::fflush(stderr);
          std::_Exit(1);
        }
        return;
      }
    }
  }

  Device device_;
  int rank_ = 0, size_ = 1;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr, host_stream_ = nullptr;
  cudaEvent_t ready_ = nullptr;
  std::mutex mu_;
  std::map<uint64_t, InFlight> inflight_;
  std::vector<cudaEvent_t> free_events_;
  uint64_t next_ticket_ = 1;
  bool stopping_ = false;
  std::string broken_;
  std::thread watchdog_;
};

}  // namespace

std::shared_ptr<Communicator> nccl_world(Device device, const LaunchInfo& info) {
  return std::make_shared<NcclCommunicator>(device, info);
}

}  // namespace kiln::dist
