// Control flow (include/kiln/ops/control.h): cond, while_loop and for_loop with Python functions
// as bodies. A body is called once, while the op is built, with its operands as positional
// kiln.Tensors, and returns a Tensor or a sequence of them.
#include "kiln/ops/control.h"

#include "common.h"

namespace kiln::py {

namespace {
// A Python callable as a body; the results come back as a list of Tensors.
BodyFn body(nb::callable f, const char* what) {
  return [f, what](const std::vector<Tensor>& operands) {
    nb::list args = tensor_list(operands, nb::none());
    nb::object r = f(*args);
    if (nb::isinstance<Tensor>(r)) return std::vector<Tensor>{nb::cast<Tensor>(r)};
    return as_tensors(r, what);
  };
}
// Results keep the graph of `patient` (the op's first input) alive.
nb::list results(const std::vector<Tensor>& ts, nb::handle patient) {
  return tensor_list(ts, patient);
}
}  // namespace

void bind_control(nb::module_& m) {
  m.def(
      "cond",
      [](const Tensor& pred, nb::handle operands, nb::callable then_fn, nb::callable else_fn) {
        auto ops = as_tensors(operands, "operands");
        return results(kiln::cond(pred, ops, body(then_fn, "then_fn's results"),
                                  body(else_fn, "else_fn's results")),
                       nb::cast(pred));
      },
      nb::arg("pred"), nb::arg("operands"), nb::arg("then_fn"), nb::arg("else_fn"), op_doc("cond"));
  m.def(
      "while_loop",
      [](nb::handle init, nb::callable cond_fn, nb::callable body_fn, int64_t max_trip_count) {
        auto carried = as_tensors(init, "init");
        WhileLoopOptions o;
        o.max_trip_count = max_trip_count;
        auto out = kiln::while_loop(carried, body(cond_fn, "cond_fn's result"),
                                    body(body_fn, "body_fn's results"), o);
        return results(out, nb::len(init) > 0 ? nb::object(init[0]) : nb::none());
      },
      nb::arg("init"), nb::arg("cond_fn"), nb::arg("body_fn"), nb::arg("max_trip_count") = -1,
      op_doc("while_loop"));
  m.def(
      "for_loop",
      [](nb::handle n, nb::handle init, nb::callable body_fn) {
        auto carried = as_tensors(init, "init");
        const BodyFn f = body(body_fn, "body_fn's results");
        auto out = nb::isinstance<Tensor>(n) ? kiln::for_loop(nb::cast<Tensor>(n), carried, f)
                                             : kiln::for_loop(nb::cast<int64_t>(n), carried, f);
        return results(out, nb::len(init) > 0 ? nb::object(init[0]) : nb::none());
      },
      nb::arg("n"), nb::arg("init"), nb::arg("body_fn"), op_doc("for_loop"));
}

}  // namespace kiln::py
