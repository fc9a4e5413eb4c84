// Shared helpers of the nanobind extension kiln._kiln: conversions between Python objects and
// kiln values, and the bind_* entry points of each source file.
#pragma once

#include <kiln/kiln.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <string>
#include <vector>

namespace kiln::py {

namespace nb = nanobind;

/// A kiln Array from a Python value: a kiln.Array as it is, else a copy of numpy.asarray(value)
/// (bf16 through ml_dtypes.bfloat16); `dtype` converts on the way.
Array to_array(nb::handle value, std::optional<DType> dtype = std::nullopt);
/// A kiln dtype from a numpy dtype (or anything numpy.dtype() takes); DTypeError for the others.
DType dtype_from_numpy(nb::handle np_dtype);
/// The numpy dtype of a kiln dtype (ml_dtypes.bfloat16 for bf16).
nb::object numpy_dtype(DType t);
/// A host copy of `a` as a numpy array that owns its memory.
nb::object to_numpy(const Array& a);
/// An array over a DLPack tensor's memory (no copy).
Array array_from_dlpack(nb::handle tensor);
/// A run's feed: a kiln.Array as it is, a DLPack tensor (PyTorch, JAX, CuPy) without copying,
/// anything else copied through numpy.
Array to_feed(nb::handle value);
/// Shapes given as sequences whose None entries mean -1 (dynamic).
Shape to_shape(nb::handle seq);
/// `s`, unless the product of its dims passes 2^59 (ShapeError).
Shape checked_shape(Shape s);
/// `value` as a dict; raises TypeError naming `what` for anything else.
inline nb::dict as_dict(nb::handle value, const char* what) {
  if (!nb::isinstance<nb::dict>(value))
    throw nb::type_error((std::string(what) + " must be a dict, not " +
                          nb::cast<std::string>(nb::str(value.type().attr("__name__"))))
                             .c_str());
  return nb::borrow<nb::dict>(value);
}
/// `key` as a Tensor; raises TypeError naming `what` for anything else.
inline Tensor as_tensor(nb::handle key, const char* what) {
  if (!nb::isinstance<Tensor>(key))
    throw nb::type_error((std::string(what) + " must be kiln.Tensors, not " +
                          nb::cast<std::string>(nb::str(key.type().attr("__name__"))))
                             .c_str());
  return nb::cast<Tensor>(key);
}
/// A sequence of Tensors; raises TypeError naming `what` for anything else.
inline std::vector<Tensor> as_tensors(nb::handle seq, const char* what) {
  if (!nb::isinstance<nb::sequence>(seq) || nb::isinstance<nb::str>(seq))
    throw nb::type_error((std::string(what) + " must be a sequence of kiln.Tensors").c_str());
  std::vector<Tensor> r;
  for (nb::handle h : seq) r.push_back(as_tensor(h, what));
  return r;
}
/// A Python list of tensors, each keeping `patient` (their graph, or an input tensor) alive.
nb::list tensor_list(const std::vector<Tensor>& ts, nb::handle patient);
/// An imported model's inputs or outputs (onnx::ValueInfo, coreml::ValueInfo) as a list whose
/// items keep the model `self` alive (their tensors point into its graph).
template <typename Info> nb::list value_infos(nb::handle self, const std::vector<Info>& vs) {
  nb::list l;
  for (const auto& v : vs) {
    nb::object o = nb::cast(v);
    nb::setattr(o, "_keep", self);
    l.append(o);
  }
  return l;
}
nb::object tensor_object(const Tensor& t, nb::handle patient);
/// The docstring of the op function `name` (its declaration's comment in include/kiln/ops, from
/// op_docs.inc, which scripts/op_docs.py writes); "" for a name the table lacks.
const char* op_doc(const char* name);

void bind_array(nb::module_& m);
void bind_graph(nb::module_& m);
void bind_ops(nb::module_& m);
void bind_ops_nn(nb::module_& m);
void bind_control(nb::module_& m);
void bind_runtime(nb::module_& m);
void bind_train(nb::module_& m);
void bind_onnx(nb::module_& m);
void bind_coreml(nb::module_& m);
void bind_extensions(nb::module_& m);
void bind_llm(nb::module_& m);
void bind_safetensors(nb::module_& m);
void bind_tokenizer(nb::module_& m);  // after bind_llm (a class of kiln.llm)

}  // namespace kiln::py
