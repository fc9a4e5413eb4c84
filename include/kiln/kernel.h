// What a kernel sees, and how kernels are registered for an op and a backend.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kiln/attrs.h"
#include "kiln/dtype.h"
#include "kiln/kernel_choices.h"
#include "kiln/shape.h"

namespace kiln {

enum class OpId : uint16_t;
class ThreadPool;
struct OpParams;

/// A dense row-major tensor in device memory.
struct TensorView {
  void* data = nullptr;
  Shape shape;
  DType dtype = f32;
  int64_t numel() const { return kiln::numel(shape); }
  int rank() const { return static_cast<int>(shape.size()); }
  template <typename T> T* ptr() const { return static_cast<T*>(data); }
};

/// Where a kernel runs: its device's native stream and a stream-ordered allocator for scratch
/// memory. CPU kernels get none (stream() is nullptr).
struct KernelEnv {
  int device = 0;
  /// cudaStream_t on CUDA.
  void* stream = nullptr;
  /// Device memory usable by work enqueued on `stream`, and its release (stream-ordered: a block
  /// released after enqueueing work is only reused by work enqueued later on the same stream).
  /// Both get `user` first.
  void* (*allocate)(void* user, int device, size_t bytes, void* stream) = nullptr;
  void (*release)(void* user, int device, void* ptr) = nullptr;
  /// This step's error slot in device memory, for kernels registered with `reports_errors`: a
  /// GPU kernel that meets an input the CPU would reject at run time (an index out of range)
  /// records it there instead of throwing; the runtime copies the slots back with the run's
  /// outputs and throws ValueError naming the op, the first bad position and its value.
  /// Words: [0] min over bad positions of (position << 32 | low 32 bits of the value), all ones
  /// when none; [1] the full value when it does not fit 32 bits. nullptr on the CPU.
  int64_t* errors = nullptr;
  /// Host words the kernel's host code fills while encoding, to say what a report means:
  /// [0] ErrorKind, [1] the axis, [2] the size the value must be below.
  int64_t* error_info = nullptr;
  /// CompileOptions::deterministic (or KILN_DETERMINISTIC=1): every choice a kernel makes is a
  /// fixed function of shapes, dtypes and options, and its sums add in a fixed order.
  bool deterministic = false;
  /// What allocate and release work for (a recorded run's scratch pool); passed to both.
  void* user = nullptr;
  /// CompileOptions::kernels, with the environment's overrides (last, so that the fields above
  /// keep their places for op libraries built before it).
  KernelChoices choices;
  /// The run is one shape of a dynamic executable (one of many sizes the same products see):
  /// kernels that choose a plan per problem size take the choice made for a nearby size where it
  /// is valid for this one (cuBLASLt: the heuristic's algorithm at sizes rounded up to a bucket,
  /// checked for the real sizes), so that a new shape's first run does not wait for searches.
  /// False for executables of one shape.
  bool many_shapes = false;
};

/// What an error slot report means. index_tuple: a component of an index tuple (gather_nd,
/// scatter_nd); error_info [1] is the dim the first component indexes, [2] the tuple length.
/// sequence_length: a length (the rnn family's seq_lens) outside [0, error_info[2]].
/// slice_start: assign_slice's start (the value) of a dim (the position) out of range.
/// trip_count: a while_loop recorded on the device whose condition still held after its
/// max_trip_count (the value) iterations.
enum class ErrorKind : int64_t {
  index_on_axis = 0,
  label = 1,
  plane_index = 2,
  index_tuple = 3,
  sequence_length = 4,
  slice_start = 5,
  trip_count = 6
};

/// The runtime's: lends a context the step's views and takes them back (no copies per kernel).
struct KernelContextViews;

class KernelContext {
 public:
  KernelContext(OpId op, const Attrs& attrs, std::vector<TensorView> inputs,
                std::vector<TensorView> outputs, ThreadPool* pool, const KernelEnv* env = nullptr,
                const OpParams* params = nullptr)
      : op_(op),
        attrs_(attrs),
        inputs_(std::move(inputs)),
        outputs_(std::move(outputs)),
        pool_(pool),
        env_(env),
        params_(params) {}
  /// A context on `base`'s stream, thread pool and scratch allocator with other attrs and
  /// inputs, for a kernel that prepares an input and then runs its op's plain form. Its scratch
  /// returns to the allocator when it ends; `attrs` must outlive it.
  KernelContext(const KernelContext& base, const Attrs& attrs, std::vector<TensorView> inputs)
      : op_(base.op_), attrs_(attrs), inputs_(std::move(inputs)), outputs_(base.outputs_),
        pool_(base.pool_), env_(base.env_) {}
  /// The same with other outputs too (a kernel that runs its op on converted copies).
  KernelContext(const KernelContext& base, const Attrs& attrs, std::vector<TensorView> inputs,
                std::vector<TensorView> outputs)
      : op_(base.op_), attrs_(attrs), inputs_(std::move(inputs)), outputs_(std::move(outputs)),
        pool_(base.pool_), env_(base.env_) {}
  ~KernelContext();
  KernelContext(const KernelContext&) = delete;
  KernelContext& operator=(const KernelContext&) = delete;
  OpId op() const { return op_; }
  const char* op_name() const;
  const Attrs& attrs() const { return attrs_; }
  int num_inputs() const { return static_cast<int>(inputs_.size()); }
  int num_outputs() const { return static_cast<int>(outputs_.size()); }
  const TensorView& in(int i) const { return inputs_[i]; }
  const TensorView& out(int i) const { return outputs_[i]; }
  /// Runs body(begin, end) over [0, n) in chunks of at least `grain` on the CPU thread pool.
  void parallel_for(int64_t n, int64_t grain,
                    const std::function<void(int64_t, int64_t)>& body) const;
  /// How many threads parallel_for splits work over (1 without a pool).
  int threads() const;
  /// The native stream GPU kernels enqueue all their work on (cudaStream_t); nullptr on the CPU.
  /// Kernels never synchronize it.
  void* stream() const { return env_ ? env_->stream : nullptr; }
  /// Index of the device the kernel runs on.
  int device() const { return env_ ? env_->device : 0; }
  /// Scratch memory of `bytes` on the kernel's device (256-byte aligned), valid for the work the
  /// kernel enqueues on stream(); it returns to the allocator when the context ends. On the CPU,
  /// host memory valid until the context ends (blocks of 64 KiB and more are then kept for the
  /// next kernel's scratch rather than unmapped).
  void* scratch(size_t bytes);
  /// See KernelEnv::errors (nullptr on the CPU, where kernels throw).
  int64_t* error_slot() const { return env_ ? env_->errors : nullptr; }
  int64_t* error_info() const { return env_ ? env_->error_info : nullptr; }
  /// See KernelEnv::deterministic (false on the CPU, whose kernels always are).
  bool deterministic() const { return env_ && env_->deterministic; }
  /// See KernelEnv::choices (the defaults on the CPU).
  const KernelChoices& choices() const;
  /// See KernelEnv::many_shapes (false on the CPU).
  bool many_shapes() const { return env_ && env_->many_shapes; }
  /// The node's attributes as its op decoded them once (built-in ops that declare a params
  /// struct; src/core/op_params.h), or nullptr: custom ops, and contexts made with other
  /// attributes, read attrs().
  const OpParams* params() const { return params_; }

 private:
  friend struct KernelContextViews;  // (src/runtime/kernel_views.h)
  OpId op_;
  const Attrs& attrs_;
  std::vector<TensorView> inputs_;
  std::vector<TensorView> outputs_;
  ThreadPool* pool_;
  const KernelEnv* env_;
  std::vector<void*> scratch_;
  const OpParams* params_ = nullptr;  // (last: op libraries built before it keep their offsets)
};

using KernelFn = void (*)(KernelContext&);

enum class Backend : uint8_t { cpu, cuda };
inline constexpr int kNumBackends = 2;
const char* backend_name(Backend b);

struct KernelEntry {
  KernelFn fn = nullptr;
  /// dtypes the kernel takes, looked up on input `dtype_input` (-1: output 0).
  DTypeSet dtypes;
  int dtype_input = 0;
  /// When the looked-up dtype is f16/bf16, convert f16/bf16 inputs and outputs to f32 around the
  /// kernel (which then only sees f32; a device kernel's conversions run on its stream, through
  /// the device's cast kernel). Off for kernels that handle half types themselves.
  bool half_via_f32 = true;
  /// The kernel may report rejected inputs through KernelContext::error_slot (GPU kernels).
  bool reports_errors = false;
  /// Half types the kernel takes itself although half_via_f32 is set (the others still go
  /// through f32): the CPU's bf16 products, which oneDNN runs natively.
  DTypeSet half_native{};
  /// Whether this kernel handles `t` (directly or via f32).
  bool handles(DType t) const;
};

/// The memory layout a kernel takes its spatial tensors in, a dispatch key beside the op and the
/// backend. plain: the layout the op documents (NCHW for convolutions and pooling).
/// channels_last: 4-D spatial inputs and outputs are (N, H, W, C), and a conv's weight
/// (O, kh, kw, C/G); only the channels_last pass gives nodes this layout, and only for ops whose
/// record declares it (OpDef::channels_last).
enum class Layout : uint8_t { plain, channels_last };
inline constexpr int kNumLayouts = 2;
const char* layout_name(Layout l);

/// Registers (or replaces) the kernel of `op` on `backend` for nodes of `layout`.
void register_kernel(OpId op, Backend backend, KernelEntry entry);
void register_kernel(OpId op, Backend backend, Layout layout, KernelEntry entry);
/// nullptr when the backend has no kernel for the op in that layout.
const KernelEntry* find_kernel(OpId op, Backend backend, Layout layout = Layout::plain);

}  // namespace kiln
