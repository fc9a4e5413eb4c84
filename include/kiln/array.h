// Array: concrete data on a device (host memory for the CPU).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kiln/device.h"
#include "kiln/dtype.h"
#include "kiln/error.h"
#include "kiln/narrow.h"
#include "kiln/shape.h"

namespace kiln {

/// Owned memory of one device; Arrays share it.
struct Storage {
  void* data = nullptr;
  size_t bytes = 0;
  Device device;
  std::function<void(void*)> deleter;
  ~Storage();
};

class Array {
 public:
  Array() = default;
  /// Uninitialized array (64-byte aligned on the host, 256 on a GPU).
  static Array empty(const Shape& shape, DType dtype, Device device = Device::cpu());
  /// An array over existing storage (which must hold nbytes of the shape).
  static Array adopt(std::shared_ptr<Storage> storage, const Shape& shape, DType dtype);
  static Array zeros(const Shape& shape, DType dtype);
  /// Copies `numel(shape)` elements of `dtype` from host memory.
  static Array from_data(const void* data, const Shape& shape, DType dtype);
  /// Wraps host memory without copying; `owner` keeps it alive.
  static Array wrap(void* data, const Shape& shape, DType dtype, std::shared_ptr<void> owner);
  template <typename T>
  static Array from_vector(const std::vector<T>& v, const Shape& shape) {
    if (static_cast<int64_t>(v.size()) != kiln::numel(shape))
      throw ShapeError("[Array] " + std::to_string(v.size()) + " values do not fill shape " +
                       to_string(shape));
    return from_data(v.data(), shape, dtype_of<T>());
  }
  template <typename T>
  static Array scalar(T v) { return from_data(&v, {}, dtype_of<T>()); }

  bool valid() const { return storage_ != nullptr || numel() == 0; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  DType dtype() const { return dtype_; }
  Device device() const;
  int64_t numel() const { return kiln::numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * size_of(dtype_); }
  /// The first element: a host pointer for CPU arrays, a device pointer otherwise.
  void* data();
  const void* data() const;
  /// Typed host access; throws UnsupportedError for arrays on a GPU (copy them with to()).
  template <typename T> T* data() { check_type(dtype_of<T>()); return static_cast<T*>(data()); }
  template <typename T> const T* data() const {
    check_type(dtype_of<T>());
    return static_cast<const T*>(data());
  }
  /// This array on `device`: itself when it is there already, else a copy (complete on return).
  Array to(Device device) const;
  /// All elements converted to T, copied to the host first when the array lives on a GPU.
  template <typename T> std::vector<T> to_vector() const;
  /// A converted copy.
  Array astype(DType t) const;
  /// A view with another shape of the same element count.
  Array reshape(const Shape& shape) const;
  /// A deep copy.
  Array copy() const;
  /// A view of the first `n` entries of the first dim (no copy).
  Array first_rows(int64_t n) const;
  /// A copy in `shape` (the same rank, no dim smaller): this array at the start of every dim,
  /// zeros after it (complete on return).
  Array padded(const Shape& shape) const;
  /// A new array of the rows `rows` of the first dim, in that order (batching on the host).
  /// Throws ValueError for an index out of range.
  Array take_rows(const std::vector<int64_t>& rows) const;
  const std::shared_ptr<Storage>& storage() const { return storage_; }

  /// NumPy .npy files (format 1.0-3.0, little endian, C order).
  static Array load_npy(const std::string& path);
  void save_npy(const std::string& path) const;

 private:
  void check_type(DType t) const;
  std::shared_ptr<Storage> storage_;
  size_t offset_ = 0;
  Shape shape_;
  DType dtype_ = DType::f32;
};

/// Converts `n` elements between dtypes on the host, as cast does (kiln/ops/elementwise.h): float
/// to integer truncates and saturates, integers saturate; to a narrow type (kiln/narrow.h) rounded
/// once from the source's precision (f64) or from f32, with saturation where `saturate` and
/// f8e8m0fnu's rounding `round`.
void convert(const void* src, DType st, void* dst, DType dt, int64_t n, bool saturate = true,
             narrow::Round round = narrow::Round::up);

}  // namespace kiln
