// Tensor and Graph: building graphs and compiling them.
#include "common.h"

namespace kiln::py {

namespace {
// A placeholder's shape from ints, None (dynamic) and names (dynamic, named), and its DimSpecs
// with the ranges {name or axis: (min, max)} and buckets {name or axis: [sizes]}.
std::pair<Shape, std::vector<DimSpec>> placeholder_dims(nb::handle shape, nb::handle ranges,
                                                        nb::handle buckets) {
  std::vector<DimSpec> specs;
  Shape s;
  bool named = false;
  if (nb::isinstance<nb::list>(shape) || nb::isinstance<nb::tuple>(shape))
    for (nb::handle d : shape) named = named || nb::isinstance<nb::str>(d);
  if (!named) {
    s = to_shape(shape);
  } else {
    for (nb::handle d : shape) {
      if (nb::isinstance<nb::str>(d)) {
        specs.push_back({static_cast<int>(s.size()), nb::cast<std::string>(d)});
        s.push_back(-1);
      } else {
        const Shape one = to_shape(nb::make_tuple(d));
        s.push_back(one[0]);
      }
    }
  }
  // the spec of a dim given by name or axis (added for an axis without one)
  auto spec_of = [&](nb::handle k, const char* what) -> DimSpec& {
    if (nb::isinstance<nb::str>(k)) {
      const std::string nm = nb::cast<std::string>(k);
      for (DimSpec& d : specs)
        if (d.name == nm) return d;
      throw nb::value_error((std::string(what) + " names '" + nm + "', which no dim has").c_str());
    }
    const int axis = nb::cast<int>(k);
    for (DimSpec& d : specs)
      if (d.axis == axis) return d;
    specs.push_back({axis, ""});
    return specs.back();
  };
  if (!buckets.is_none())
    for (auto [k, v] : as_dict(buckets, "buckets")) {
      if (!nb::isinstance<nb::list>(v) && !nb::isinstance<nb::tuple>(v))
        throw nb::type_error("buckets' values must be lists of sizes");
      std::vector<int64_t> sizes;
      for (nb::handle b : v) sizes.push_back(nb::cast<int64_t>(b));
      spec_of(k, "buckets").buckets = sizes;
    }
  if (ranges.is_none()) return {s, specs};
  for (auto [k, v] : as_dict(ranges, "ranges")) {
    if (!nb::isinstance<nb::tuple>(v) && !nb::isinstance<nb::list>(v))
      throw nb::type_error("ranges' values must be (min, max) pairs");
    nb::sequence pair = nb::borrow<nb::sequence>(v);
    if (nb::len(pair) != 2) throw nb::value_error("ranges' values must be (min, max) pairs");
    const int64_t lo = nb::cast<int64_t>(pair[0]);
    const int64_t hi = pair[1].is_none() ? -1 : nb::cast<int64_t>(pair[1]);
    bool found = false;
    if (nb::isinstance<nb::str>(k)) {
      const std::string nm = nb::cast<std::string>(k);
      for (DimSpec& d : specs)
        if (d.name == nm) {
          d.min = lo, d.max = hi;
          found = true;
        }
      if (!found) throw nb::value_error(("ranges names '" + nm + "', which no dim has").c_str());
    } else {
      const int axis = nb::cast<int>(k);
      for (DimSpec& d : specs)
        if (d.axis == axis) {
          d.min = lo, d.max = hi;
          found = true;
        }
      if (!found) specs.push_back({axis, "", lo, hi});
    }
  }
  return {s, specs};
}
}  // namespace

nb::object tensor_object(const Tensor& t, nb::handle patient) {
  nb::object o = nb::cast(t);
  if (patient.is_valid() && !patient.is_none()) nb::setattr(o, "_keep", patient);
  return o;
}

nb::list tensor_list(const std::vector<Tensor>& ts, nb::handle patient) {
  nb::list l;
  for (const Tensor& t : ts) l.append(tensor_object(t, patient));
  return l;
}

namespace {

// A binary op with a Python number on one side: the number becomes a scalar of the tensor's dtype.
Tensor operand(const Tensor& like, nb::handle v) {
  if (nb::isinstance<Tensor>(v)) return nb::cast<Tensor>(v);
  if (nb::isinstance<nb::bool_>(v)) return scalar_like(like, nb::cast<bool>(v) ? 1 : 0);
  return scalar_like(like, nb::cast<double>(v));
}

template <Tensor (*F)(const Tensor&, const Tensor&)>
void binary(nb::class_<Tensor>& c, const char* name, const char* rname) {
  c.def(
      name, [](const Tensor& a, nb::handle b) { return F(a, operand(a, b)); },
      nb::keep_alive<0, 1>());
  if (rname)
    c.def(
        rname, [](const Tensor& a, nb::handle b) { return F(operand(a, b), a); },
        nb::keep_alive<0, 1>());
}

}  // namespace

void bind_graph(nb::module_& m) {
  nb::class_<Tensor> t(m, "Tensor", nb::dynamic_attr(),
                       "A symbolic value: an output of a graph node, with shape and dtype. "
                       "Operators + - * / ** @ and comparisons build ops; == and hash compare "
                       "identity (tensors are dict keys).");
  t.def_prop_ro(
       "shape",
       [](const Tensor& x) {
         nb::list l;
         for (int64_t d : x.shape()) l.append(d);
         return nb::tuple(l);
       },
       "Dims as a tuple; -1 for a dim known only at compile time.")
      .def_prop_ro("dtype", &Tensor::dtype)
      .def_prop_ro("ndim", &Tensor::rank)
      .def("dim", &Tensor::dim, nb::arg("axis"), "Dim `axis` (negative counts from the end).")
      .def_prop_ro("name", &Tensor::name, "Name of the producing node.")
      .def_prop_ro("op_name", &Tensor::op_name, "Name of the producing op.")
      .def_prop_ro("node_id", &Tensor::node_id)
      .def_prop_ro("output_index", &Tensor::output_index)
      .def("__eq__",
           [](const Tensor& a, nb::handle b) {
             return nb::isinstance<Tensor>(b) && a == nb::cast<const Tensor&>(b);
           })
      .def("__ne__",
           [](const Tensor& a, nb::handle b) {
             return !(nb::isinstance<Tensor>(b) && a == nb::cast<const Tensor&>(b));
           })
      .def("__hash__",
           [](const Tensor& x) {
             return std::hash<const void*>()(x.graph_impl()) ^
                    (static_cast<size_t>(x.node_id()) << 8) ^ static_cast<size_t>(x.output_index());
           })
      .def("__repr__",
           [](const Tensor& x) {
             return "kiln.Tensor(" + x.op_name() + " '" + x.name() +
                    "', shape=" + to_string(x.shape()) + ", dtype=" + name(x.dtype()) + ")";
           })
      .def(
          "__neg__", [](const Tensor& x) { return neg(x); }, nb::keep_alive<0, 1>())
      .def(
          "__matmul__", [](const Tensor& a, const Tensor& b) { return matmul(a, b); },
          nb::keep_alive<0, 1>())
      .def(
          "__getitem__",
          [](const Tensor& x, nb::handle key) {
            // basic indexing: ints, slices and Ellipsis-free tuples of them
            nb::tuple items =
                nb::isinstance<nb::tuple>(key) ? nb::borrow<nb::tuple>(key) : nb::make_tuple(key);
            std::vector<int64_t> starts, stops, steps, axes, squeeze_axes;
            int64_t axis = 0;
            for (nb::handle it : items) {
              if (nb::isinstance<nb::slice>(it)) {
                nb::object s = nb::borrow(it);
                auto get = [&](const char* n, int64_t dflt) {
                  nb::object v = s.attr(n);
                  return v.is_none() ? dflt : nb::cast<int64_t>(v);
                };
                const int64_t step = get("step", 1);
                starts.push_back(get("start", step > 0 ? 0 : -1));
                stops.push_back(get("stop", step > 0 ? INT64_MAX : INT64_MIN));
                steps.push_back(step);
                axes.push_back(axis);
              } else {
                const int64_t i = nb::cast<int64_t>(it);
                const int64_t n = axis < x.rank() ? x.shape()[axis] : -1;
                if ((n >= 0 && (i >= n || i < -n)) || i == INT64_MAX)
                  throw nb::index_error(("[Tensor] index " + std::to_string(i) +
                                         " is out of range for axis " + std::to_string(axis) +
                                         " of shape " + kiln::to_string(x.shape()))
                                            .c_str());
                starts.push_back(i);
                stops.push_back(i == -1 ? INT64_MAX : i + 1);
                steps.push_back(1);
                axes.push_back(axis);
                squeeze_axes.push_back(axis);
              }
              ++axis;
            }
            Tensor r = slice(x, starts, stops, steps, axes);
            return squeeze_axes.empty() ? r : squeeze(r, squeeze_axes);
          },
          nb::keep_alive<0, 1>(), "Basic indexing with ints and slices (a slice op).");
  binary<add>(t, "__add__", "__radd__");
  binary<sub>(t, "__sub__", "__rsub__");
  binary<mul>(t, "__mul__", "__rmul__");
  binary<div>(t, "__truediv__", "__rtruediv__");
  binary<pow>(t, "__pow__", "__rpow__");
  binary<mod>(t, "__mod__", "__rmod__");
  binary<less>(t, "__lt__", nullptr);
  binary<less_equal>(t, "__le__", nullptr);
  binary<greater>(t, "__gt__", nullptr);
  binary<greater_equal>(t, "__ge__", nullptr);

  nb::class_<KernelChoices>(m, "KernelChoices",
                            "Which kernel runs where a backend has two exact ones "
                            "(CompileOptions.kernels; include/kiln/kernel_choices.h). A KILN_* "
                            "environment variable that is set overrides its field.")
      .def(nb::init<>())
      .def_rw("channels_last", &KernelChoices::channels_last)
      .def_rw("cudnn_graph", &KernelChoices::cudnn_graph)
      .def_rw("rnn_persistent_forward", &KernelChoices::rnn_persistent_forward)
      .def_rw("rnn_persistent_backward", &KernelChoices::rnn_persistent_backward)
      .def_rw("qconv_implicit_gemm", &KernelChoices::qconv_implicit_gemm)
      .def_rw("programmatic_launch", &KernelChoices::programmatic_launch)
      .def_rw("attention_f32_tiles", &KernelChoices::attention_f32_tiles);

  nb::class_<CompileOptions>(m, "CompileOptions", "Options of Graph.compile.")
      .def(
          "__init__",
          [](CompileOptions* o, bool optimize, bool plan_memory, bool in_place, int num_threads,
             std::optional<DType> autocast, bool strict_placement, bool capture,
             bool fuse_elementwise, bool allow_tf32) {
            new (o) CompileOptions{optimize, plan_memory,      in_place, num_threads,
                                   autocast, strict_placement, capture,  fuse_elementwise};
            o->allow_tf32 = allow_tf32;
          },
          nb::arg("optimize") = true, nb::arg("plan_memory") = true, nb::arg("in_place") = true,
          nb::arg("num_threads") = 0, nb::arg("autocast") = nb::none(),
          nb::arg("strict_placement") = false, nb::arg("capture") = true,
          nb::arg("fuse_elementwise") = true, nb::arg("allow_tf32") = false)
      .def_rw("allow_tf32", &CompileOptions::allow_tf32)
      .def_rw("optimize", &CompileOptions::optimize)
      .def_rw("plan_memory", &CompileOptions::plan_memory)
      .def_rw("in_place", &CompileOptions::in_place)
      .def_rw("num_threads", &CompileOptions::num_threads)
      .def_rw("autocast", &CompileOptions::autocast)
      .def_rw("strict_placement", &CompileOptions::strict_placement)
      .def_rw("capture", &CompileOptions::capture)
      .def_rw("fuse_elementwise", &CompileOptions::fuse_elementwise)
      .def_rw("fuse_quant", &CompileOptions::fuse_quant)
      .def_rw("deterministic", &CompileOptions::deterministic)
      .def_rw("kernels", &CompileOptions::kernels)
      .def_rw("max_specializations", &CompileOptions::max_specializations,
              "Dynamic executables keep at most this many specializations (0: no limit).")
      .def_rw("max_specialization_bytes", &CompileOptions::max_specialization_bytes,
              "... and at most this many bytes of their memory and own constants (0: no limit).");

  nb::class_<Graph>(m, "Graph",
                    "A DAG of ops. Build it with placeholders, constants, variables and ops, then "
                    "compile it. The graph must outlive its tensors (they keep it alive).")
      .def(nb::init<>())
      .def(
          "placeholder",
          [](Graph& g, nb::handle shape, DType dtype, const std::string& name, nb::handle ranges,
             nb::handle buckets) {
            auto [s, specs] = placeholder_dims(shape, ranges, buckets);
            return g.placeholder(s, dtype, name, specs);
          },
          nb::arg("shape"), nb::arg("dtype") = f32, nb::arg("name") = "",
          nb::arg("ranges") = nb::none(), nb::arg("buckets") = nb::none(), nb::keep_alive<0, 1>(),
          "A graph input. Dims of -1 or None are dynamic, and so are dims given as names "
          "(`[\"batch\", \"seq\"]`): dims that share a name have one size in a run. A feed "
          "shape given to compile fixes dynamic dims; those left dynamic take any size at run "
          "time (the executable specializes itself per shape). `ranges` bounds dynamic dims: "
          "{name or axis: (min, max)}, max None for no bound. `buckets` rounds dynamic dims up: "
          "{name or axis: [sizes]}; a feed runs as the smallest bucket at least its size, padded "
          "with zeros, and outputs whose first dim is that dim come back cut to its size (for "
          "batch dims, along which rows do not mix).")
      .def(
          "constant",
          [](Graph& g, nb::handle value, const std::string& name) {
            return g.constant(to_array(value), name);
          },
          nb::arg("value"), nb::arg("name") = "", nb::keep_alive<0, 1>(),
          "A constant holding `value` (a kiln.Array is shared, anything else copied).")
      .def("scalar", &Graph::scalar, nb::arg("value"), nb::arg("dtype") = f32,
           nb::keep_alive<0, 1>(), "A 0-d constant.")
      .def(
          "variable",
          [](Graph& g, nb::handle initial, const std::string& name) {
            return g.variable(to_array(initial), name);
          },
          nb::arg("initial"), nb::arg("name") = "", nb::keep_alive<0, 1>(),
          "A value that lives across runs, starting as a copy of `initial`.")
      .def(
          "variables",
          [](nb::handle self) { return tensor_list(nb::cast<Graph&>(self).variables(), self); },
          "Every variable, in creation order.")
      .def("read_variable", &Graph::read_variable, nb::arg("variable"),
           "A copy of the variable's current value.")
      .def(
          "write_variable",
          [](Graph& g, const Tensor& v, nb::handle value) { g.write_variable(v, to_array(value)); },
          nb::arg("variable"), nb::arg("value"), "Replaces the variable's value.")
      .def("save_variables", &Graph::save_variables, nb::arg("path"),
           "Writes every variable to a checkpoint file.")
      .def("load_variables", &Graph::load_variables, nb::arg("path"),
           "Restores variables from a checkpoint by name.")
      .def(
          "compile",
          [](const Graph& g, const std::vector<Tensor>& targets, nb::handle feed_shapes,
             const std::vector<Tensor>& updates, std::optional<Device> device,
             std::optional<CompileOptions> options) {
            FeedShapes fs;
            if (!feed_shapes.is_none())
              for (auto [k, v] : as_dict(feed_shapes, "feed_shapes"))
                fs.emplace_back(as_tensor(k, "feed_shapes' keys"), to_shape(v));
            const Device d = device ? *device : default_device();
            const CompileOptions o = options ? *options : CompileOptions{};
            nb::gil_scoped_release release;
            return g.compile(d, fs, targets, Updates(updates), o);
          },
          nb::arg("targets"), nb::arg("feed_shapes") = nb::none(),
          nb::arg("updates") = std::vector<Tensor>{}, nb::arg("device") = nb::none(),
          nb::arg("options") = nb::none(), nb::keep_alive<0, 1>(),
          "Compiles what `targets` and `updates` need for `device` (default: "
          "kiln.default_device()); `feed_shapes` maps placeholders with dynamic dims to "
          "concrete shapes. Each run returns the targets and applies the updates.")
      .def_prop_ro("num_nodes", &Graph::num_nodes)
      .def("dump", &Graph::dump, "A readable listing of the nodes.");
}

}  // namespace kiln::py
