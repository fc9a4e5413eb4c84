// The communicator interface's host API, the group registry, the in-process group, and the
// data-parallel helpers (include/kiln/dist.h). MPI and NCCL communicators live in their own
// libraries (src/dist/mpi.cpp, src/dist/nccl.cpp) so kiln itself needs neither.
#include <fmt/format.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <numeric>
#include <random>

#include "core/errors.h"
#include "dist/host_reduce.h"
#include "kiln/dist.h"
#include "kiln/executable.h"
#include "kiln/ops/transform.h"
#include "runtime/env.h"

namespace kiln::dist {

// ---- host reductions ----

namespace detail {
namespace {
template <typename T> using Acc = std::conditional_t<
    std::is_same_v<T, float16_t> || std::is_same_v<T, bfloat16_t>, float, T>;

template <typename T>
void reduce_typed(Reduction op, const std::vector<const void*>& srcs, void* dst, int64_t count) {
  using A = Acc<T>;
  auto at = [&](size_t r, int64_t i) { return static_cast<A>(static_cast<const T*>(srcs[r])[i]); };
  T* out = static_cast<T*>(dst);
  const auto n = static_cast<A>(srcs.size());
  for (int64_t i = 0; i < count; ++i) {
    A acc = at(0, i);
    for (size_t r = 1; r < srcs.size(); ++r) {
      const A v = at(r, i);
      switch (op) {
        case Reduction::sum: case Reduction::mean: acc = static_cast<A>(acc + v); break;
        case Reduction::prod:  // (integers wrap: their product in 64-bit unsigned arithmetic)
          if constexpr (std::is_integral_v<A>)
            acc = static_cast<A>(static_cast<uint64_t>(acc) * static_cast<uint64_t>(v));
          else acc = static_cast<A>(acc * v);
          break;
        case Reduction::min: acc = v < acc ? v : acc; break;
        case Reduction::max: acc = v > acc ? v : acc; break;
      }
    }
    if (op == Reduction::mean) acc = static_cast<A>(acc / n);
    out[i] = static_cast<T>(acc);
  }
}

template <typename F> void dispatch_all(DType t, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f16: f(float16_t{}); return;
    case DType::bf16: f(bfloat16_t{}); return;
    case DType::f64: f(double{}); return;
    case DType::i8: f(int8_t{}); return;
    case DType::u8: f(uint8_t{}); return;
    case DType::i16: f(int16_t{}); return;
    case DType::i32: f(int32_t{}); return;
    case DType::i64: f(int64_t{}); return;
    case DType::u16:
      f(uint16_t{});
      return;
    case DType::u32:
      f(uint32_t{});
      return;
    case DType::u64:
      f(uint64_t{});
      return;
    default:
      break;
  }
  fail<DTypeError>("[dist] {} tensors cannot be reduced", name(t));
}
}  // namespace

void reduce_host(DType t, Reduction op, const std::vector<const void*>& srcs, void* dst,
                 int64_t count) {
  KILN_ASSERT(!srcs.empty());
  dispatch_all(t, [&](auto tag) { reduce_typed<decltype(tag)>(op, srcs, dst, count); });
}

void divide_host(DType t, void* buf, int64_t count, int n) {
  dispatch_all(t, [&](auto tag) {
    using T = decltype(tag);
    using A = Acc<T>;
    T* p = static_cast<T*>(buf);
    for (int64_t i = 0; i < count; ++i)
      p[i] = static_cast<T>(static_cast<A>(static_cast<A>(p[i]) / static_cast<A>(n)));
  });
}
}  // namespace detail

// ---- launch environment ----

namespace {
int env_int(env::Var var, int dflt) {
  const char* v = env::get(var);
  if (!v) return dflt;
  const char* name = env::name(var);
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*end != '\0' || x < 0 || x > (1 << 20))
    fail<ValueError>("[dist] environment variable {}='{}' is not a valid count", name, v);
  return static_cast<int>(x);
}
}  // namespace

LaunchInfo launch_info() {
  LaunchInfo info;
  using env::Var;
  if (env::get(Var::KILN_WORLD_SIZE)) {
    info.size = env_int(Var::KILN_WORLD_SIZE, 1);
    info.rank = env_int(Var::KILN_RANK, 0);
    info.local_rank = env_int(Var::KILN_LOCAL_RANK, info.rank);
    info.launched = true;
  } else if (env::get(Var::OMPI_COMM_WORLD_SIZE)) {
    info.size = env_int(Var::OMPI_COMM_WORLD_SIZE, 1);
    info.rank = env_int(Var::OMPI_COMM_WORLD_RANK, 0);
    info.local_rank = env_int(Var::OMPI_COMM_WORLD_LOCAL_RANK, 0);
    info.launched = true;
  }
  if (info.launched)
    if (const char* r = env::get(Var::KILN_RENDEZVOUS)) info.rendezvous = r;
  if (info.size < 1 || info.rank >= info.size)
    fail<ValueError>("[dist] rank {} of a world of {} is not a valid launch", info.rank, info.size);
  return info;
}

// ---- the communicator's host API ----

namespace {
std::chrono::milliseconds default_timeout() {
  double seconds = 300;
  if (const char* v = env::get(env::Var::KILN_DIST_TIMEOUT)) {
    char* end = nullptr;
    seconds = std::strtod(v, &end);
    if (*end != '\0' || !(seconds > 0))
      fail<ValueError>("[dist] KILN_DIST_TIMEOUT='{}' is not a positive number of seconds", v);
  }
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}
}  // namespace

Communicator::Communicator() : timeout_(default_timeout()) {}

void Communicator::check_array(const Array& a, const char* what) const {
  if (!a.valid()) fail<ValueError>("[dist] {}: empty Array", what);
  if (a.device() != device())
    fail<ValueError>("[dist] {}: the array lives on {}, the communicator's buffers on {}", what,
                     a.device().str(), device().str());
}

void Communicator::all_reduce(Array& a, Reduction op) {
  check_array(a, "all_reduce");
  wait(start({Collective::all_reduce, a.data(), a.data(), a.numel(), a.dtype(), op, 0}, nullptr),
       nullptr);
}

void Communicator::broadcast(Array& a, int root) {
  check_array(a, "broadcast");
  if (root < 0 || root >= size())
    fail<ValueError>("[dist] broadcast: root {} is not a rank of a group of {}", root, size());
  wait(start({Collective::broadcast, a.data(), a.data(), a.numel(), a.dtype(), Reduction::sum,
              root},
             nullptr),
       nullptr);
}

Array Communicator::all_gather(const Array& a) {
  check_array(a, "all_gather");
  Shape s = a.shape();
  s.insert(s.begin(), size());
  Array out = Array::empty(s, a.dtype(), device());
  wait(start({Collective::all_gather, a.data(), out.data(), a.numel(), a.dtype(), Reduction::sum, 0},
             nullptr),
       nullptr);
  return out;
}

Array Communicator::reduce_scatter(const Array& a, Reduction op) {
  check_array(a, "reduce_scatter");
  if (a.rank() == 0 || a.shape()[0] % size() != 0)
    fail<ShapeError>("[dist] reduce_scatter: the leading dim of {} must divide by the group size {}",
                     str(a.shape()), size());
  Shape s = a.shape();
  s[0] /= size();
  Array out = Array::empty(s, a.dtype(), device());
  wait(start({Collective::reduce_scatter, a.data(), out.data(), out.numel(), a.dtype(), op, 0},
             nullptr),
       nullptr);
  return out;
}

// ---- groups ----

namespace {
std::mutex& registry_mu() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, std::shared_ptr<Communicator>>& registry() {
  static std::map<std::string, std::shared_ptr<Communicator>> r;
  return r;
}
thread_local std::map<std::string, std::shared_ptr<Communicator>> t_scoped;
}  // namespace

void register_group(std::shared_ptr<Communicator> comm, const std::string& name) {
  if (!comm) fail<ValueError>("[dist] register_group: null communicator");
  if (name.empty()) fail<ValueError>("[dist] register_group: empty group name");
  std::lock_guard<std::mutex> l(registry_mu());
  registry()[name] = std::move(comm);
}

void unregister_group(const std::string& name) {
  std::lock_guard<std::mutex> l(registry_mu());
  registry().erase(name);
}

namespace {
std::shared_ptr<Communicator> find_group(const std::string& name) {
  if (auto it = t_scoped.find(name); it != t_scoped.end() && it->second) return it->second;
  std::lock_guard<std::mutex> l(registry_mu());
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second;
}
std::string group_names() {
  std::string r;
  std::lock_guard<std::mutex> l(registry_mu());
  for (auto& [k, v] : registry()) r += (r.empty() ? "" : ", ") + k;
  for (auto& [k, v] : t_scoped)
    if (v) r += (r.empty() ? "" : ", ") + k;
  return r.empty() ? "none" : r;
}
}  // namespace

std::shared_ptr<Communicator> group(const std::string& name) {
  if (auto c = find_group(name)) return c;
  fail<ValueError>("[dist] no communicator group '{}' is registered (registered: {})", name,
                   group_names());
}

ScopedGroup::ScopedGroup(std::shared_ptr<Communicator> comm, std::string name)
    : name_(std::move(name)) {
  if (!comm) fail<ValueError>("[dist] ScopedGroup: null communicator");
  auto& slot = t_scoped[name_];
  previous_ = slot;
  slot = std::move(comm);
}

ScopedGroup::~ScopedGroup() {
  if (previous_) t_scoped[name_] = previous_;
  else t_scoped.erase(name_);
}

namespace detail {
std::shared_ptr<Communicator> group_for_run(const std::string& name, const char* op) {
  if (auto c = find_group(name)) return c;
  static const LaunchInfo info = launch_info();
  if (info.size > 1)
    fail<ValueError>("[{}] this process is rank {} of {}, but no communicator group '{}' is "
                     "registered: call kiln::dist::register_group(kiln::dist::mpi_world()) (CPU) "
                     "or register_group(kiln::dist::nccl_world(device)) (CUDA) before running",
                     op, info.rank, info.size, name);
  return nullptr;
}
}  // namespace detail

// ---- the in-process group ----

namespace {
struct LocalState {
  explicit LocalState(int n) : size(n), next(n, 0) {}
  struct Round {
    std::vector<CollectiveArgs> args;
    std::vector<char> present;
    int arrived = 0, left = 0;
    bool done = false;
    std::string error;
  };
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint64_t> next;  // each rank's next round
  std::map<uint64_t, Round> rounds;
  std::string broken;  // why the group stopped working

  // Runs round `r` once every rank has joined (under mu).
  void perform(Round& r) {
    const CollectiveArgs& a0 = r.args[0];
    for (int i = 1; i < size; ++i) {
      const CollectiveArgs& a = r.args[i];
      if (a.kind != a0.kind || a.count != a0.count || a.dtype != a0.dtype || a.op != a0.op ||
          a.root != a0.root) {
        r.error = fmt::format("[dist] local group: rank {} and rank 0 issued different collectives "
                              "(count {} vs {}, dtype {} vs {})",
                              i, a.count, a0.count, name(a.dtype), name(a0.dtype));
        return;
      }
    }
    const size_t elem = size_of(a0.dtype), bytes = static_cast<size_t>(a0.count) * elem;
    std::vector<const void*> sends;
    for (auto& a : r.args) sends.push_back(a.send);
    std::vector<char> tmp;
    try {
      switch (a0.kind) {
        case Collective::all_reduce:
          tmp.resize(bytes);
          if (a0.count) detail::reduce_host(a0.dtype, a0.op, sends, tmp.data(), a0.count);
          for (auto& a : r.args)
            if (bytes) std::memcpy(a.recv, tmp.data(), bytes);
          break;
        case Collective::broadcast:
          tmp.assign(static_cast<const char*>(r.args[a0.root].send),
                     static_cast<const char*>(r.args[a0.root].send) + bytes);
          for (auto& a : r.args)
            if (bytes) std::memcpy(a.recv, tmp.data(), bytes);
          break;
        case Collective::all_gather:
          tmp.resize(bytes * size);
          for (int i = 0; i < size; ++i)
            if (bytes) std::memcpy(tmp.data() + i * bytes, r.args[i].send, bytes);
          for (auto& a : r.args)
            if (bytes) std::memcpy(a.recv, tmp.data(), bytes * size);
          break;
        case Collective::reduce_scatter:
          tmp.resize(bytes * size);
          if (a0.count) detail::reduce_host(a0.dtype, a0.op, sends, tmp.data(), a0.count * size);
          for (int i = 0; i < size; ++i)
            if (bytes) std::memcpy(r.args[i].recv, tmp.data() + i * bytes, bytes);
          break;
      }
    } catch (const std::exception& e) {
      r.error = e.what();
    }
  }
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalState> st, int rank) : st_(std::move(st)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return st_->size; }
  Device device() const override { return Device::cpu(); }
  std::string backend() const override { return "local"; }

  uint64_t start(const CollectiveArgs& args, void* stream) override {
    if (stream) fail<UnsupportedError>("[dist] the local group runs on the CPU only");
    if (args.count < 0) fail<ValueError>("[dist] negative count {}", args.count);
    std::unique_lock<std::mutex> l(st_->mu);
    if (!st_->broken.empty()) throw CommError(st_->broken);
    const uint64_t seq = st_->next[rank_]++;
    auto& r = st_->rounds[seq];
    if (r.args.empty()) {
      r.args.resize(st_->size);
      r.present.assign(st_->size, 0);
    }
    r.args[rank_] = args;
    r.present[rank_] = 1;
    if (++r.arrived == st_->size) {
      st_->perform(r);
      r.done = true;
      st_->cv.notify_all();
    } else {
      const auto deadline = std::chrono::steady_clock::now() + timeout();
      while (!r.done && st_->broken.empty())
        if (st_->cv.wait_until(l, deadline) == std::cv_status::timeout && !r.done) {
          std::string missing;
          for (int i = 0; i < st_->size; ++i)
            if (!r.present[i]) missing += (missing.empty() ? "" : ", ") + std::to_string(i);
          st_->broken = fmt::format(
              "[dist] local group: collective {} did not complete within {} ms on rank {} of {}: "
              "rank(s) {} never joined it",
              seq, timeout().count(), rank_, st_->size, missing);
          st_->cv.notify_all();
        }
      if (!r.done) throw CommError(st_->broken);
    }
    std::string error = r.error;
    if (++r.left == st_->size) st_->rounds.erase(seq);
    if (!error.empty()) throw CommError(error);
    return seq;
  }
  void wait(uint64_t, void*) override {
    std::lock_guard<std::mutex> l(st_->mu);
    // start() completed the collective; only a later failure of the group is news here
    (void)l;
  }
  void barrier() override {
    wait(start({Collective::all_reduce, nullptr, nullptr, 0, f32, Reduction::sum, 0}, nullptr),
         nullptr);
  }

 private:
  std::shared_ptr<LocalState> st_;
  int rank_;
};
}  // namespace

std::vector<std::shared_ptr<Communicator>> local_group(int size) {
  if (size < 1 || size > 4096) fail<ValueError>("[dist] local_group: size {} out of range", size);
  auto st = std::make_shared<LocalState>(size);
  std::vector<std::shared_ptr<Communicator>> r;
  for (int i = 0; i < size; ++i) r.push_back(std::make_shared<LocalCommunicator>(st, i));
  return r;
}

// ---- gradients in buckets ----

std::vector<Tensor> all_reduce_gradients(const std::vector<Tensor>& grads,
                                         const GradientReduceOptions& opts) {
  if (opts.bucket_bytes <= 0 || opts.first_bucket_bytes <= 0)
    fail<ValueError>("[all_reduce_gradients] bucket sizes must be positive, got {} and {}",
                     opts.first_bucket_bytes, opts.bucket_bytes);
  const AllReduceOptions ar{opts.op, opts.group};
  std::vector<Tensor> out(grads.size());
  std::vector<size_t> bucket;
  int64_t bucket_bytes = 0;
  int64_t limit = opts.first_bucket_bytes;
  auto flush = [&] {
    if (bucket.size() == 1) {
      out[bucket[0]] = all_reduce(grads[bucket[0]], ar);
    } else if (!bucket.empty()) {
      std::vector<Tensor> flat;
      std::vector<int64_t> sizes;
      for (size_t i : bucket) {
        flat.push_back(reshape(grads[i], {-1}));
        sizes.push_back(numel(grads[i].shape()));
      }
      const std::vector<Tensor> parts = split(all_reduce(concat(flat, 0), ar), sizes, 0);
      for (size_t k = 0; k < bucket.size(); ++k)
        out[bucket[k]] = reshape(parts[k], grads[bucket[k]].shape());
    }
    if (!bucket.empty()) limit = opts.bucket_bytes;
    bucket.clear();
    bucket_bytes = 0;
  };
  // the last gradients of the list are the first a backward pass finishes
  for (size_t j = grads.size(); j-- > 0;) {
    const Tensor& g = grads[j];
    if (!g.valid()) continue;
    const Shape s = g.shape();
    const bool packable = std::all_of(s.begin(), s.end(), [](int64_t d) { return d >= 0; });
    if (!packable) {  // dynamic shape: reduced on its own
      flush();
      out[j] = all_reduce(g, ar);
      continue;
    }
    const int64_t bytes = numel(s) * static_cast<int64_t>(size_of(g.dtype()));
    if (!bucket.empty() &&
        (grads[bucket[0]].dtype() != g.dtype() || bucket_bytes + bytes > limit))
      flush();
    bucket.push_back(j);
    bucket_bytes += bytes;
  }
  flush();
  return out;
}

// ---- data-parallel helpers ----

namespace {
// Every rank must hold the same variables: compares (count, hash of names, shapes and dtypes)
// with the root's before moving any data.
void check_same_variables(Communicator& comm, const std::vector<std::string>& names,
                          const std::vector<Array>& values, int root) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t x) { h = (h ^ x) * 1099511628211ull; };
  for (size_t i = 0; i < names.size(); ++i) {
    for (char c : names[i]) mix(static_cast<unsigned char>(c));
    for (int64_t d : values[i].shape()) mix(static_cast<uint64_t>(d));
    mix(static_cast<uint64_t>(values[i].dtype()));
  }
  const int64_t mine[2] = {static_cast<int64_t>(names.size()), static_cast<int64_t>(h >> 1)};
  Array sig = Array::from_data(mine, {2}, i64);
  if (comm.device() != Device::cpu()) sig = sig.to(comm.device());
  comm.broadcast(sig, root);
  const auto theirs = sig.to(Device::cpu()).to_vector<int64_t>();
  if (theirs[0] != mine[0] || theirs[1] != mine[1])
    fail<ValueError>("[dist] broadcast_variables: rank {} holds {} variables that differ from rank "
                     "{}'s {} (names, shapes or dtypes): every rank must build the same model",
                     comm.rank(), mine[0], root, theirs[0]);
}

template <typename Read, typename Write>
void broadcast_all(Communicator& comm, const std::vector<std::string>& names, Read read,
                   Write write, int root) {
  if (root < 0 || root >= comm.size())
    fail<ValueError>("[dist] broadcast_variables: root {} is not a rank of a group of {}", root,
                     comm.size());
  std::vector<Array> values;
  for (size_t i = 0; i < names.size(); ++i) values.push_back(read(i));
  check_same_variables(comm, names, values, root);
  for (size_t i = 0; i < names.size(); ++i) {
    Array a = comm.device() == Device::cpu() ? values[i] : values[i].to(comm.device());
    comm.broadcast(a, root);
    write(i, a);
  }
}
}  // namespace

void broadcast_variables(Executable& exe, Communicator& comm, int root) {
  const std::vector<std::string> names = exe.variable_names();
  broadcast_all(
      comm, names, [&](size_t i) { return exe.read_variable(names[i]); },
      [&](size_t i, const Array& a) { exe.write_variable(names[i], a); }, root);
}

void broadcast_variables(Graph& g, Communicator& comm, int root) {
  const std::vector<Tensor> vars = g.variables();
  std::vector<std::string> names;
  for (const Tensor& v : vars) names.push_back(v.name());
  broadcast_all(
      comm, names, [&](size_t i) { return g.read_variable(vars[i]); },
      [&](size_t i, const Array& a) { g.write_variable(vars[i], a.to(Device::cpu())); }, root);
}

Shard shard(int64_t n, int rank, int size) {
  if (n < 0 || size < 1 || rank < 0 || rank >= size)
    fail<ValueError>("[dist] shard: rank {} of {} over {} items", rank, size, n);
  const int64_t base = n / size, rem = n % size;
  Shard s;
  s.begin = rank * base + std::min<int64_t>(rank, rem);
  s.end = s.begin + base + (rank < rem ? 1 : 0);
  return s;
}

std::vector<int64_t> sharded_epoch(int64_t n, uint64_t seed, int epoch, int rank, int size) {
  if (n < 0 || size < 1 || rank < 0 || rank >= size)
    fail<ValueError>("[dist] sharded_epoch: rank {} of {} over {} items", rank, size, n);
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), 0);
  // a Fisher-Yates shuffle of our own (std::shuffle's is not specified): the same on every rank
  std::mt19937_64 rng(seed ^ (0x9e3779b97f4a7c15ull * static_cast<uint64_t>(epoch + 1)));
  for (int64_t i = n - 1; i > 0; --i)
    std::swap(perm[i], perm[rng() % static_cast<uint64_t>(i + 1)]);
  const int64_t per = n / size;
  return {perm.begin() + rank * per, perm.begin() + (rank + 1) * per};
}

void save_checkpoint(const Executable& exe, Communicator& comm, const std::string& path) {
  std::string error;
  if (comm.rank() == 0) {
    try {
      exe.save(path);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  // every rank learns whether rank 0 succeeded, then leaves together
  const int64_t ok_value = error.empty() ? 1 : 0;
  Array ok = Array::from_data(&ok_value, {1}, i64);
  if (comm.device() != Device::cpu()) ok = ok.to(comm.device());
  comm.all_reduce(ok, Reduction::min);
  if (!error.empty()) throw IoError(error);
  if (ok.to(Device::cpu()).to_vector<int64_t>()[0] != 1)
    fail<IoError>("[dist] save_checkpoint: rank 0 could not write {}", path);
}

}  // namespace kiln::dist
