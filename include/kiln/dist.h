// Distributed data-parallel training: communicators, collective ops in graphs, and helpers.
//
// kiln does not bring its own transport. A Communicator is one rank's handle on a group of
// processes (or threads): NCCL for CUDA devices (kiln::dist_nccl, one process per GPU), MPI for
// CPU processes (kiln::dist_mpi, launched by mpirun), and an in-process group of threads for
// tests and single-machine experiments (local_group, in kiln itself).
//
// Collectives enter graphs as ops: all_reduce(x) is a start node and a wait node. The start runs
// as soon as x is computed; the wait runs just before the first reader of the result, so
// communication overlaps the rest of the run (CUDA: NCCL on a side stream ordered by CUDA events;
// CPU: the communicator's own thread). Ops name their group ("world" by default); the group is
// looked up when a run reaches the op, so graphs and packages do not depend on the world size.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/array.h"
#include "kiln/device.h"
#include "kiln/error.h"
#include "kiln/graph.h"

namespace kiln {
class Executable;
}

namespace kiln::dist {

/// A collective that did not complete: a peer rank died, hung, or left the group, or the
/// transport failed. The communicator is unusable afterwards (every later call throws too).
class CommError : public Error { public: using Error::Error; };

enum class Reduction : uint8_t { sum, mean, min, max, prod };
const char* reduction_name(Reduction r);

/// One collective, on raw buffers of the communicator's device. Counts are elements:
/// all_reduce and broadcast: `count` in send and recv; all_gather: `count` per rank in send,
/// size() * count in recv (rank-major); reduce_scatter: size() * count in send, `count` in recv.
enum class Collective : uint8_t { all_reduce, broadcast, all_gather, reduce_scatter };
const char* collective_name(Collective c);
struct CollectiveArgs {
  Collective kind = Collective::all_reduce;
  const void* send = nullptr;
  void* recv = nullptr;  // may equal send for all_reduce and broadcast (in place)
  int64_t count = 0;
  DType dtype = f32;
  Reduction op = Reduction::sum;
  int root = 0;  // broadcast
};

/// One rank of a group. Thread-safe: calls from several threads are serialized in call order,
/// and every rank must issue the same collectives in the same order.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Where this rank's buffers live (cpu, or the rank's cuda:N).
  virtual Device device() const = 0;
  /// "mpi", "nccl", "local".
  virtual std::string backend() const = 0;

  /// Starts a collective after the work already enqueued on `stream` (a cudaStream_t for CUDA
  /// communicators; nullptr = the communicator's own ordering for the host API) and returns a
  /// ticket for wait(). The buffers must stay valid until the wait returns (CPU) or until the
  /// stream passes the wait (CUDA).
  virtual uint64_t start(const CollectiveArgs& args, void* stream) = 0;
  /// Orders `stream` after the collective (CUDA: no host wait); on the CPU (or with a null
  /// stream) blocks the calling thread until it completes. Throws CommError when it failed or
  /// did not complete within timeout().
  virtual void wait(uint64_t ticket, void* stream) = 0;
  /// Blocks until every rank has reached the barrier.
  virtual void barrier() = 0;

  /// How long a blocked collective may take before CommError (default 300 s, or
  /// KILN_DIST_TIMEOUT seconds from the environment).
  std::chrono::milliseconds timeout() const { return timeout_; }
  void set_timeout(std::chrono::milliseconds t) { timeout_ = t; }

  // ---- host API on Arrays of device() (blocking) ----
  /// In place: every rank ends with the reduction over all ranks.
  void all_reduce(Array& a, Reduction op = Reduction::sum);
  /// In place: every rank ends with root's value (shapes and dtypes must agree).
  void broadcast(Array& a, int root = 0);
  /// Concatenates every rank's `a` along a new leading axis: shape (size(), *a.shape()).
  Array all_gather(const Array& a);
  /// Reduces `a` (leading dim divisible by size()) over ranks and returns this rank's slice of
  /// the leading axis.
  Array reduce_scatter(const Array& a, Reduction op = Reduction::sum);

 protected:
  Communicator();
  /// Throws ValueError unless `a` lives on device() and is contiguous.
  void check_array(const Array& a, const char* what) const;

 private:
  std::chrono::milliseconds timeout_;
};

// ---- groups: the name a graph op refers to ----

/// Makes `comm` the group `name` ("world" is the default group of collective ops). Replaces a
/// group of that name. The registry holds a shared reference.
void register_group(std::shared_ptr<Communicator> comm, const std::string& name = "world");
void unregister_group(const std::string& name = "world");
/// The group named `name`; throws ValueError listing the registered names when there is none.
std::shared_ptr<Communicator> group(const std::string& name = "world");
/// Registers a group for the rest of a scope (a thread's rank of a local group, typically).
class ScopedGroup {
 public:
  explicit ScopedGroup(std::shared_ptr<Communicator> comm, std::string name = "world");
  ~ScopedGroup();
  ScopedGroup(const ScopedGroup&) = delete;
  ScopedGroup& operator=(const ScopedGroup&) = delete;

 private:
  std::string name_;
  std::shared_ptr<Communicator> previous_;
};

// ---- communicators ----

/// `size` ranks in this process, one per thread, on the CPU: local_group(n)[r] is rank r.
/// Each rank's collectives must be issued by its own thread. For tests, and for simulating a
/// group on one machine. Group registration is per thread for these (see ScopedGroup).
std::vector<std::shared_ptr<Communicator>> local_group(int size);

/// The launch environment of this process: rank, world size, local rank and the rendezvous,
/// from KILN_RANK / KILN_WORLD_SIZE / KILN_LOCAL_RANK / KILN_RENDEZVOUS (set by `kiln launch`),
/// else from Open MPI's OMPI_COMM_WORLD_* variables, else a single process (rank 0 of 1).
struct LaunchInfo {
  int rank = 0, size = 1, local_rank = 0;
  /// "file:DIR": the ranks meet through files in DIR (a fresh, shared folder). Empty: none.
  std::string rendezvous;
  bool launched = false;  // set by a launcher (kiln launch or mpirun)
};
LaunchInfo launch_info();

/// MPI over the CPU (library kiln::dist_mpi): initializes MPI once per process
/// (MPI_THREAD_MULTIPLE) and wraps MPI_COMM_WORLD. Run the program under `mpirun -np N`.
std::shared_ptr<Communicator> mpi_world();

/// NCCL over CUDA devices (library kiln::dist_nccl), one rank per process: rank `info.rank` of
/// `info.size` on `device`, bootstrapped through info.rendezvous (a single rank needs none).
/// A watchdog aborts the communicator when a collective exceeds timeout(), so a dead peer
/// makes runs throw CommError instead of hanging.
std::shared_ptr<Communicator> nccl_world(Device device, const LaunchInfo& info = launch_info());

// ---- collectives in graphs ----

struct AllReduceOptions {
  Reduction op = Reduction::sum;
  std::string group = "world";
};
/// The reduction of `x` over the group's ranks. In a run the start node runs as soon as `x` is
/// ready and the result is waited for just before its first reader.
Tensor all_reduce(const Tensor& x, const AllReduceOptions& opts = {});

struct GradientReduceOptions {
  /// Gradients are packed into buckets of about this many bytes, one collective each, in reverse
  /// order of `grads` (the last layers' gradients are ready first in a backward pass).
  int64_t bucket_bytes = 25 << 20;
  /// The first bucket (the last layers' gradients) is smaller, so communication starts early.
  int64_t first_bucket_bytes = 1 << 20;
  Reduction op = Reduction::mean;
  std::string group = "world";
};
/// Data-parallel gradients: each of `grads` reduced (mean by default) over the group's ranks,
/// in buckets, so each bucket's collective starts as soon as its gradients are computed and
/// overlaps the rest of the backward pass. Returns one tensor per gradient, same shape.
std::vector<Tensor> all_reduce_gradients(const std::vector<Tensor>& grads,
                                         const GradientReduceOptions& opts = {});

// ---- data-parallel helpers ----

/// Makes every rank's variables equal to rank `root`'s (call once before training).
void broadcast_variables(Executable& exe, Communicator& comm, int root = 0);
/// Same for a graph's variables (before compiling).
void broadcast_variables(Graph& g, Communicator& comm, int root = 0);

/// The slice [begin, end) of `n` items that rank `rank` of `size` reads: contiguous, sizes
/// differ by at most one.
struct Shard {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
Shard shard(int64_t n, int rank, int size);

/// Sample indices of one epoch for one rank: a permutation of [0, n) made from `seed` and
/// `epoch` (the same on every rank), cut into `size` equal parts (the tail that does not divide
/// is dropped so every rank runs the same number of steps); this rank's part.
std::vector<int64_t> sharded_epoch(int64_t n, uint64_t seed, int epoch, int rank, int size);

/// Writes a checkpoint (Executable::save) on rank 0 only, then waits for every rank, so no rank
/// runs ahead of a checkpoint that a restart would read.
void save_checkpoint(const Executable& exe, Communicator& comm, const std::string& path);

}  // namespace kiln::dist
