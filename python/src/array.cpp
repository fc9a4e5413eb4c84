// DType, Device and Array; numpy (copies) and DLPack (no copy) exchange.
#include <Python.h>

#include <cstring>

#include "common.h"

namespace kiln::py {

namespace {

struct NumpyName {
  const char* numpy;
  DType dtype;
};
constexpr NumpyName kNumpyNames[] = {{"float32", f32},
                                     {"float16", f16},
                                     {"bfloat16", bf16},
                                     {"float64", f64},
                                     {"int8", i8},
                                     {"uint8", u8},
                                     {"int16", i16},
                                     {"int32", i32},
                                     {"int64", i64},
                                     {"uint16", u16},
                                     {"uint32", u32},
                                     {"uint64", u64},
                                     {"bool", boolean},
                                     // (ml_dtypes' names, as bfloat16's)
                                     {"float8_e4m3fn", f8e4m3fn},
                                     {"float8_e4m3fnuz", f8e4m3fnuz},
                                     {"float8_e5m2", f8e5m2},
                                     {"float8_e5m2fnuz", f8e5m2fnuz},
                                     {"float8_e8m0fnu", f8e8m0fnu},
                                     {"float4_e2m1fn", f4e2m1fn},
                                     {"int4", i4},
                                     {"uint4", u4},
                                     {"int2", i2},
                                     {"uint2", u2}};

// Whether numpy's dtype for `t` comes from ml_dtypes (numpy has no such type).
bool from_ml_dtypes(DType t) { return t == bf16 || is_narrow(t); }

nb::object numpy() { return nb::module_::import_("numpy"); }

// DLPack type codes of kiln dtypes (nanobind's dlpack::dtype), and back.
nb::dlpack::dtype dl_dtype(DType t) {
  using nb::dlpack::dtype_code;
  auto code = [&]() -> dtype_code {
    switch (t) {
      case f32:
      case f16:
      case f64:
        return dtype_code::Float;
      case bf16:
        return dtype_code::Bfloat;
      case u8:
      case u16:
      case u32:
      case u64:
        return dtype_code::UInt;
      case boolean:
        return dtype_code::Bool;
      default:
        return dtype_code::Int;
    }
  }();
  return {static_cast<uint8_t>(code), static_cast<uint8_t>(size_of(t) * 8), 1};
}

// The kiln dtype of a DLPack dtype; nullopt where kiln has none.
std::optional<DType> kiln_dtype(nb::dlpack::dtype d) {
  using nb::dlpack::dtype_code;
  const auto code = static_cast<dtype_code>(d.code);
  if (d.lanes == 1) {
    if (code == dtype_code::Float && d.bits == 32) return f32;
    if (code == dtype_code::Float && d.bits == 16) return f16;
    if (code == dtype_code::Float && d.bits == 64) return f64;
    if (code == dtype_code::Bfloat && d.bits == 16) return bf16;
    if (code == dtype_code::Int && d.bits == 8) return i8;
    if (code == dtype_code::Int && d.bits == 16) return i16;
    if (code == dtype_code::Int && d.bits == 32) return i32;
    if (code == dtype_code::Int && d.bits == 64) return i64;
    if (code == dtype_code::UInt && d.bits == 8) return u8;
    if (code == dtype_code::UInt && d.bits == 16) return u16;
    if (code == dtype_code::UInt && d.bits == 32) return u32;
    if (code == dtype_code::UInt && d.bits == 64) return u64;
    if (code == dtype_code::Bool && d.bits == 8) return boolean;
  }
  return std::nullopt;
}

DType from_dl_dtype(nb::dlpack::dtype d) {
  if (const std::optional<DType> t = kiln_dtype(d)) return *t;
  throw DTypeError("[from_dlpack] DLPack dtype (code " + std::to_string(d.code) + ", " +
                   std::to_string(d.bits) + " bits, " + std::to_string(d.lanes) +
                   " lanes) has no kiln dtype");
}

// Whether a DLPack tensor is C-contiguous (size-1 dims may carry any stride).
bool c_contiguous(const nb::ndarray<nb::ro>& t) {
  int64_t expect = 1;
  for (int i = static_cast<int>(t.ndim()) - 1; i >= 0; --i) {
    const auto n = static_cast<int64_t>(t.shape(i));
    if (n != 1 && t.stride(i) != expect) return false;
    expect *= n;
  }
  return true;
}

// The DLPack view of an array's memory, owned by a copy of the Array handle.
nb::ndarray<nb::array_api> dl_view(const Array& a) {
  if (is_narrow(a.dtype()))
    throw DTypeError(std::string("[to_dlpack] kiln's DLPack exchange has no code for ") +
                     name(a.dtype()) + "; bitcast to u8 first, or use numpy()");
  auto* keep = new Array(a);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Array*>(p); });
  std::vector<size_t> shape(a.shape().begin(), a.shape().end());
  const Device d = a.device();
  const int dev_type =
      d.kind == Device::Kind::cuda ? nb::device::cuda::value : nb::device::cpu::value;
  return nb::ndarray<nb::array_api>(const_cast<void*>(keep->data()), shape.size(), shape.data(),
                                    owner, nullptr, dl_dtype(a.dtype()), dev_type, d.index);
}

// Wraps memory a DLPack exporter owns; the Storage keeps the exporter's tensor alive.
Array from_dlpack(nb::ndarray<nb::ro> t) {
  Shape shape(t.ndim());
  for (size_t i = 0; i < t.ndim(); ++i) shape[i] = static_cast<int64_t>(t.shape(i));
  const DType dtype = from_dl_dtype(t.dtype());
  if (!c_contiguous(t))
    throw ValueError("[from_dlpack] the tensor of shape " + to_string(shape) +
                     " is not C-contiguous; make it contiguous first (a copy)");
  Device device;
  if (t.device_type() == nb::device::cpu::value) {
    device = Device::cpu();
  } else if (t.device_type() == nb::device::cuda::value) {
    device = Device::cuda(t.device_id());
  } else {
    throw UnsupportedError("[from_dlpack] DLPack device type " + std::to_string(t.device_type()) +
                           " is neither CPU nor CUDA");
  }
  auto* holder = new nb::ndarray<nb::ro>(t);
  auto storage = std::make_shared<Storage>();
  storage->data = const_cast<void*>(t.data());
  storage->bytes = t.nbytes();
  storage->device = device;
  storage->deleter = [holder](void*) {
    if (!Py_IsInitialized()) return;  // the interpreter is gone: nothing left to release
    nb::gil_scoped_acquire gil;
    delete holder;
  };
  if (storage->data == nullptr) storage->deleter = [holder](void*) {};
  return Array::adopt(storage, shape, dtype);
}

}  // namespace

DType dtype_from_numpy(nb::handle np_dtype) {
  nb::object d = numpy().attr("dtype")(np_dtype);
  const std::string name = nb::cast<std::string>(d.attr("name"));
  for (const auto& n : kNumpyNames)
    if (name == n.numpy) return n.dtype;
  throw DTypeError("[Array] numpy dtype " + name + " has no kiln dtype");
}

nb::object numpy_dtype(DType t) {
  for (const auto& n : kNumpyNames) {
    if (n.dtype != t) continue;
    if (from_ml_dtypes(t))
      return numpy().attr("dtype")(nb::module_::import_("ml_dtypes").attr(n.numpy));
    return numpy().attr("dtype")(n.numpy);
  }
  KILN_ASSERT(false);
  return {};
}

Array to_array(nb::handle value, std::optional<DType> dtype) {
  if (nb::isinstance<Array>(value)) {
    const Array& a = nb::cast<const Array&>(value);
    return dtype && *dtype != a.dtype() ? a.astype(*dtype) : a;
  }
  nb::object np = numpy();
  // (asarray, not ascontiguousarray, which makes 0-d arrays 1-d)
  nb::object arr =
      dtype ? np.attr("asarray")(value, numpy_dtype(*dtype)) : np.attr("asarray")(value);
  // kiln's dtypes are little endian: a big-endian array (">f4") is converted, never misread
  if (!nb::cast<bool>(arr.attr("dtype").attr("isnative")))
    arr = arr.attr("astype")(arr.attr("dtype").attr("newbyteorder")("="));
  const DType dt = dtype_from_numpy(arr.attr("dtype"));
  Shape shape = nb::cast<Shape>(arr.attr("shape"));
  arr = np.attr("ascontiguousarray")(arr);
  nb::object bytes = arr.attr("reshape")(-1).attr("view")(np.attr("uint8"));
  auto buf = nb::cast<nb::ndarray<nb::ro, uint8_t, nb::ndim<1>, nb::device::cpu>>(bytes);
  return Array::from_data(buf.data(), shape, dt);
}

nb::object to_numpy(const Array& a) {
  Array h = a.device().kind == Device::Kind::cpu ? a.copy() : a.to(Device::cpu());
  auto* keep = new Array(h);
  nb::capsule owner(keep, [](void* p) noexcept { delete static_cast<Array*>(p); });
  std::vector<size_t> shape(h.shape().begin(), h.shape().end());
  // numpy has no bf16 or 8-bit floats: the bits go out as uint16 or uint8 and are viewed as
  // ml_dtypes' type
  const bool ml = from_ml_dtypes(h.dtype());
  nb::dlpack::dtype dt = h.dtype() == bf16 ? nb::dtype<uint16_t>()
                         : ml              ? nb::dtype<uint8_t>()
                                           : dl_dtype(h.dtype());
  nb::ndarray<nb::numpy> nd(keep->data(), shape.size(), shape.data(), owner, nullptr, dt);
  nb::object out = nb::cast(nd);
  if (ml) out = out.attr("view")(numpy_dtype(h.dtype()));
  return out;
}

Array array_from_dlpack(nb::handle tensor) {
  return from_dlpack(nb::cast<nb::ndarray<nb::ro>>(tensor));
}

namespace {
// A C-contiguous, aligned numpy array in native byte order of a kiln dtype, shared (no copy; its
// Storage keeps the array alive); nullopt for any other, which to_array converts.
std::optional<Array> shared_numpy(nb::handle value) {
  nb::ndarray<nb::ro> t;  // (numpy's are on the CPU)
  if (!nb::try_cast(value, t) || t.device_type() != nb::device::cpu::value) return std::nullopt;
  const std::optional<DType> dtype = kiln_dtype(t.dtype());
  if (!dtype || reinterpret_cast<uintptr_t>(t.data()) % size_of(*dtype) != 0 || !c_contiguous(t))
    return std::nullopt;
  return from_dlpack(t);
}
}  // namespace

Array to_feed(nb::handle value) {
  if (nb::isinstance<Array>(value)) return nb::cast<Array>(value);
  static nb::object* ndarray = new nb::object(numpy().attr("ndarray"));  // (never released)
  if (PyObject_IsInstance(value.ptr(), ndarray->ptr())) {
    if (std::optional<Array> a = shared_numpy(value)) return *a;
    return to_array(value);
  }
  if (nb::hasattr(value, "__dlpack__")) return array_from_dlpack(value);
  return to_array(value);
}

Shape checked_shape(Shape s) {
  // a product of dims past 2^59 elements (2^62 bytes of f64) could never be allocated, and
  // counting its elements would overflow
  constexpr uint64_t kMaxElements = uint64_t{1} << 59;
  uint64_t n = 1;
  for (int64_t d : s) {
    if (d <= 0) continue;
    if (static_cast<uint64_t>(d) > kMaxElements / n)
      throw ShapeError("[shape] " + kiln::to_string(s) + " has more than 2^59 elements");
    n *= static_cast<uint64_t>(d);
  }
  return s;
}

Shape to_shape(nb::handle seq) {
  Shape s;
  for (nb::handle d : seq) s.push_back(d.is_none() ? kDynamic : nb::cast<int64_t>(d));
  return checked_shape(std::move(s));
}

void bind_array(nb::module_& m) {
  nb::enum_<DType>(m, "DType", "Element types of arrays and tensors.")
      .value("f32", f32)
      .value("f16", f16)
      .value("bf16", bf16)
      .value("f64", f64)
      .value("i8", i8)
      .value("u8", u8)
      .value("i16", i16)
      .value("i32", i32)
      .value("i64", i64)
      .value("bool", boolean)
      .value("f8e4m3fn", f8e4m3fn)
      .value("f8e4m3fnuz", f8e4m3fnuz)
      .value("f8e5m2", f8e5m2)
      .value("f8e5m2fnuz", f8e5m2fnuz)
      .value("u16", u16)
      .value("u32", u32)
      .value("u64", u64)
      .value("f8e8m0fnu", f8e8m0fnu)
      .value("f4e2m1fn", f4e2m1fn)
      .value("i4", i4)
      .value("u4", u4)
      .value("i2", i2)
      .value("u2", u2)
      .def_prop_ro(
          "itemsize", [](DType t) { return size_of(t); }, "Bytes per element.")
      .def_prop_ro("is_floating", [](DType t) { return is_floating(t); })
      .def_prop_ro("is_integer", [](DType t) { return is_integer(t); })
      .def_prop_ro(
          "is_float8", [](DType t) { return is_float8(t); },
          "An 8-bit float (a storage type: cast it to compute).")
      .def_prop_ro(
          "is_narrow", [](DType t) { return is_narrow(t); },
          "A narrow storage type (the 8-bit floats, f8e8m0fnu, f4e2m1fn, i4 u4 i2 u2: one byte "
          "an element; cast it to compute).")
      .def_prop_ro(
          "numpy", [](DType t) { return numpy_dtype(t); },
          "The numpy dtype (ml_dtypes' for bf16 and the narrow types).");
  m.def(
      "dtype",
      [](nb::handle d) -> DType {
        if (nb::isinstance<DType>(d)) return nb::cast<DType>(d);
        if (nb::isinstance<nb::str>(d)) {
          const std::string s = nb::cast<std::string>(d);
          for (const auto& n : kNumpyNames)
            if (s == n.numpy) return n.dtype;
          return parse_dtype(s);
        }
        return dtype_from_numpy(d);
      },
      nb::arg("value"),
      "A kiln dtype from a DType, a short name ('f32', 'bf16', 'bool'), a numpy name or a numpy "
      "dtype. Raises DTypeError for anything else.");
  m.def("promote", &promote, nb::arg("a"), nb::arg("b"),
        "The result dtype of a binary op on dtypes a and b.");

  nb::enum_<Device::Kind>(m, "DeviceKind")
      .value("cpu", Device::Kind::cpu)
      .value("cuda", Device::Kind::cuda);
  nb::class_<Device>(m, "Device", "A device: 'cpu' or 'cuda:N'. Strings convert implicitly.")
      .def(nb::init<>())
      .def(
          "__init__", [](Device* d, const std::string& s) { new (d) Device(Device::parse(s)); },
          nb::arg("name"))
      .def_static("cpu", &Device::cpu)
      .def_static("cuda", &Device::cuda, nb::arg("index") = 0)
      .def_ro("kind", &Device::kind)
      .def_ro("index", &Device::index)
      .def("__str__", &Device::str)
      .def("__repr__", [](const Device& d) { return "Device('" + d.str() + "')"; })
      .def("__eq__", [](const Device& a, const Device& b) { return a == b; })
      .def("__hash__", [](const Device& d) { return static_cast<int>(d.kind) * 1024 + d.index; });
  nb::implicitly_convertible<std::string, Device>();
  m.def("default_device", &default_device,
        "KILN_DEVICE if set, else the first CUDA device, else the CPU.");
  m.def("cuda_device_count", &cuda_device_count,
        "Number of CUDA devices visible (0 without CUDA).");

  nb::class_<Array>(m, "Array",
                    "Concrete data on a device. Array(value) copies a numpy array (or anything "
                    "numpy.asarray takes); kiln.from_dlpack shares memory instead.")
      .def(
          "__init__",
          [](Array* a, nb::handle value, std::optional<DType> dtype) {
            new (a) Array(to_array(value, dtype));
          },
          nb::arg("value"), nb::arg("dtype") = nb::none())
      .def_static(
          "empty",
          [](nb::handle shape, DType dtype, Device device) {
            return Array::empty(to_shape(shape), dtype, device);
          },
          nb::arg("shape"), nb::arg("dtype") = f32, nb::arg("device") = Device::cpu(),
          "An uninitialized array.")
      .def_static(
          "zeros",
          [](nb::handle shape, DType dtype) { return Array::zeros(to_shape(shape), dtype); },
          nb::arg("shape"), nb::arg("dtype") = f32, "A host array of zeros.")
      .def_static(
          "from_dlpack", [](nb::ndarray<nb::ro> t) { return from_dlpack(t); }, nb::arg("tensor"),
          "An array over the memory of a DLPack tensor (numpy, PyTorch, JAX, CuPy; CPU or "
          "CUDA), without copying; it keeps the tensor alive.")
      .def_static("load_npy", &Array::load_npy, nb::arg("path"), "Reads a .npy file.")
      .def("save_npy", &Array::save_npy, nb::arg("path"), "Writes a .npy file.")
      .def_prop_ro("shape",
                   [](const Array& a) {
                     nb::list l;
                     for (int64_t d : a.shape()) l.append(d);
                     return nb::tuple(l);
                   })
      .def_prop_ro("dtype", &Array::dtype)
      .def_prop_ro("device", &Array::device)
      .def_prop_ro("ndim", &Array::rank)
      .def_prop_ro("size", &Array::numel, "Number of elements.")
      .def_prop_ro("nbytes", &Array::nbytes)
      .def_prop_ro(
          "data_ptr", [](Array& a) { return reinterpret_cast<uintptr_t>(a.data()); },
          "Address of the first element (host or device).")
      .def("numpy", &to_numpy, "A host copy as a numpy array (bf16 as ml_dtypes.bfloat16).")
      .def(
          "__array__",
          [](const Array& a, nb::handle dtype, nb::handle copy) {
            nb::object out = to_numpy(a);
            return dtype.is_none() ? out : out.attr("astype")(dtype);
          },
          nb::arg("dtype") = nb::none(), nb::arg("copy") = nb::none())
      .def("to", &Array::to, nb::arg("device"), nb::call_guard<nb::gil_scoped_release>(),
           "This array on `device` (itself when already there, else a copy).")
      .def("astype", &Array::astype, nb::arg("dtype"), "A converted copy.")
      .def(
          "reshape",
          [](const Array& a, nb::handle shape) {
            Shape s = to_shape(shape);
            int64_t known = 1, unknown = -1;
            for (size_t i = 0; i < s.size(); ++i) {
              if (s[i] == kDynamic)
                unknown = static_cast<int64_t>(i);
              else
                known *= s[i];
            }
            if (unknown >= 0 && known > 0 && a.numel() % known == 0) s[unknown] = a.numel() / known;
            return a.reshape(s);
          },
          nb::arg("shape"),
          "A view with another shape of the same element count (one dim may be -1).")
      .def("copy", &Array::copy, "A deep copy.")
      .def("take_rows", &Array::take_rows, nb::arg("rows"),
           "A new array of the given rows of the first dim.")
      .def("tolist", [](const Array& a) { return to_numpy(a).attr("tolist")(); })
      .def("item", [](const Array& a) { return to_numpy(a).attr("item")(); })
      .def("__len__",
           [](const Array& a) {
             if (a.rank() == 0) throw nb::type_error("len() of a 0-d kiln.Array");
             return a.shape()[0];
           })
      .def("__repr__",
           [](const Array& a) {
             return "kiln.Array(shape=" + to_string(a.shape()) + ", dtype=" + name(a.dtype()) +
                    ", device=" + a.device().str() + ")";
           })
      .def(
          "__dlpack__",
          [](const Array& a, nb::kwargs kwargs) {
            nb::object view = nb::cast(dl_view(a));
            return view.attr("__dlpack__")(**kwargs);
          },
          "DLPack export (no copy): the consumer shares this array's memory.")
      .def("__dlpack_device__", [](const Array& a) {
        const Device d = a.device();
        return nb::make_tuple(d.kind == Device::Kind::cuda ? 2 : 1, d.index);
      });
  m.def(
      "from_dlpack", [](nb::ndarray<nb::ro> t) { return from_dlpack(t); }, nb::arg("tensor"),
      "A kiln.Array over a DLPack tensor's memory (no copy).");
  m.def(
      "asarray",
      [](nb::handle value, std::optional<DType> dtype) { return to_array(value, dtype); },
      nb::arg("value"), nb::arg("dtype") = nb::none(),
      "A kiln.Array: the array itself, else a copy of numpy.asarray(value).");
}

}  // namespace kiln::py
