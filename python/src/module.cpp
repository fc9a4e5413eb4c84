// The extension module kiln._kiln; the kiln package (python/kiln) re-exports it.
#include "common.h"

NB_MODULE(_kiln, m) {
  namespace nb = nanobind;
  using namespace kiln;
  m.doc() = "kiln: build, compile and run machine-learning compute graphs (native module).";
  m.attr("__version__") = kiln::version();

  // kiln::Error and its subclasses; ValueError, ShapeError and DTypeError also derive from
  // Python's ValueError, UnsupportedError from NotImplementedError, IoError from OSError
  // (the types live as long as the process: handles, never released at exit)
  auto sub = [&](const char* name, std::initializer_list<PyObject*> bases) -> nb::handle {
    nb::list b;
    if (nb::hasattr(m, "Error")) b.append(m.attr("Error"));
    for (PyObject* p : bases) b.append(nb::borrow(p));
    nb::object t = nb::module_::import_("builtins").attr("type")(name, nb::tuple(b), nb::dict());
    t.attr("__module__") = "kiln";
    m.attr(name) = t;
    return t.release();
  };
  static nb::handle base_error = sub("Error", {PyExc_RuntimeError});
  static nb::handle shape_error = sub("ShapeError", {PyExc_ValueError});
  static nb::handle dtype_error = sub("DTypeError", {PyExc_TypeError});
  static nb::handle unsupported = sub("UnsupportedError", {PyExc_NotImplementedError});
  static nb::handle io_error = sub("IoError", {PyExc_OSError});
  static nb::handle format_error = sub("FormatError", {});
  static nb::handle oom = sub("OutOfMemory", {PyExc_MemoryError});
  static nb::handle device_error = sub("DeviceError", {});
  static nb::handle value_error = sub("ValueError", {PyExc_ValueError});

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    auto raise = [](nb::handle t, const std::exception& e) { PyErr_SetString(t.ptr(), e.what()); };
    try {
      std::rethrow_exception(p);
    } catch (const ShapeError& e) {
      raise(shape_error, e);
    } catch (const DTypeError& e) {
      raise(dtype_error, e);
    } catch (const UnsupportedError& e) {
      raise(unsupported, e);
    } catch (const IoError& e) {
      raise(io_error, e);
    } catch (const FormatError& e) {
      raise(format_error, e);
    } catch (const OutOfMemory& e) {
      raise(oom, e);
    } catch (const DeviceError& e) {
      raise(device_error, e);
    } catch (const kiln::ValueError& e) {
      raise(value_error, e);
    } catch (const kiln::Error& e) {
      raise(base_error, e);
    }
  });

  kiln::py::bind_array(m);
  kiln::py::bind_graph(m);
  kiln::py::bind_ops(m);
  kiln::py::bind_ops_nn(m);
  kiln::py::bind_control(m);
  kiln::py::bind_runtime(m);
  kiln::py::bind_train(m);
  kiln::py::bind_onnx(m);
  kiln::py::bind_coreml(m);
  kiln::py::bind_extensions(m);
  kiln::py::bind_llm(m);
  kiln::py::bind_safetensors(m);
  kiln::py::bind_tokenizer(m);
}
