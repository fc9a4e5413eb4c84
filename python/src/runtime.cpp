// Executable (run, run_async, packages), Queue, Event and futures of asynchronous runs.
#include <chrono>
#include <future>

#include "common.h"

namespace kiln::py {

namespace {

// A Python callable that kiln threads may call, copy and drop: each takes the GIL.
struct PyCallable {
  std::shared_ptr<nb::object> fn;
  explicit PyCallable(nb::object f)
      : fn(new nb::object(std::move(f)), [](nb::object* p) {
          if (!Py_IsInitialized()) return;
          nb::gil_scoped_acquire gil;
          delete p;
        }) {}
  template <typename... A>
  void operator()(A&&... args) const {
    nb::gil_scoped_acquire gil;
    try {
      (*fn)(std::forward<A>(args)...);
    } catch (nb::python_error& e) {
      e.restore();
      PyErr_Print();
    }
  }
};

// The Python Queue: destroying it waits for its work without holding the GIL (work it runs may
// need the GIL).
struct PyQueue {
  std::unique_ptr<Queue> q;
  explicit PyQueue(Device d) {
    nb::gil_scoped_release release;
    q = std::make_unique<Queue>(d);
  }
  ~PyQueue() {
    nb::gil_scoped_release release;
    q.reset();
  }
};

// The outputs of an asynchronous run.
struct Future {
  std::shared_future<std::vector<Array>> f;
  bool done() const { return f.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }
  std::vector<Array> result() const {
    {
      nb::gil_scoped_release release;
      f.wait();
    }
    return f.get();
  }
};

struct ByName {
  bool named = false;
  Feeds feeds;
  std::map<std::string, Array> by_name;

  std::vector<Array> run(const Executable& e) const {
    std::vector<Array> out = named ? e.run(by_name) : e.run(feeds);
    // a returned feed is a copy: feeds share the caller's memory (numpy arrays, DLPack tensors),
    // which an output must not
    auto shares = [&](const Array& a) {
      for (const auto& [k, f] : feeds)
        if (f.storage() == a.storage()) return true;
      for (const auto& [k, f] : by_name)
        if (f.storage() == a.storage()) return true;
      return false;
    };
    for (Array& a : out)
      if (a.valid() && a.storage() && shares(a)) a = a.copy();
    return out;
  }
};

ByName feeds_of(nb::handle d) {
  ByName r;
  if (d.is_none()) return r;
  nb::dict dict = as_dict(d, "feeds");
  for (auto [k, v] : dict)
    if (nb::isinstance<nb::str>(k)) r.named = true;
  for (auto [k, v] : dict) {
    Array a = to_feed(v);
    if (r.named) {
      const std::string name = nb::isinstance<nb::str>(k)
                                   ? nb::cast<std::string>(k)
                                   : as_tensor(k, "feeds' keys (names or tensors)").name();
      r.by_name.emplace(name, std::move(a));
    } else {
      r.feeds.emplace_back(as_tensor(k, "feeds' keys (names or tensors)"), std::move(a));
    }
  }
  return r;
}

}  // namespace

void bind_runtime(nb::module_& m) {
  nb::enum_<Stage>(m, "Stage")
      .value("scheduled", Stage::scheduled)
      .value("completed", Stage::completed);

  nb::class_<Event>(m, "Event",
                    "A shared 64-bit timeline: queues signal it and wait for values; so can the "
                    "host. Copies share one timeline.")
      .def(nb::init<uint64_t>(), nb::arg("initial_value") = 0)
      .def_prop_ro("value", &Event::value, "The value reached so far.")
      .def("signal", &Event::signal, nb::arg("value"), "Sets the value from the host.")
      .def(
          "wait",
          [](const Event& e, uint64_t value, std::optional<double> timeout) {
            nb::gil_scoped_release release;
            if (!timeout) {
              e.wait(value);
              return true;
            }
            return e.wait_for(value, std::chrono::duration_cast<std::chrono::nanoseconds>(
                                         std::chrono::duration<double>(*timeout)));
          },
          nb::arg("value"), nb::arg("timeout") = nb::none(),
          "Blocks until the value is at least `value` (False on timeout). Raises the error of a "
          "failed run that was to signal it.")
      .def(
          "notify",
          [](const Event& e, uint64_t value, nb::object fn) {
            PyCallable cb(std::move(fn));
            e.notify(value, [cb](std::exception_ptr err) {
              nb::gil_scoped_acquire gil;
              nb::object msg = nb::none();
              if (err) {
                try {
                  std::rethrow_exception(err);
                } catch (const std::exception& ex) {
                  msg = nb::str(ex.what());
                }
              }
              cb(msg);
            });
          },
          nb::arg("value"), nb::arg("fn"),
          "Calls fn(error_message_or_None) on a kiln thread once the value is reached.")
      .def("__eq__", [](const Event& a, const Event& b) { return a == b; });

  nb::class_<PyQueue>(m, "Queue", "An in-order work queue of one device.")
      .def(nb::init<Device>(), nb::arg("device") = Device::cpu())
      .def_prop_ro("device", [](const PyQueue& q) { return q.q->device(); })
      .def(
          "submit",
          [](PyQueue& q, nb::object fn) {
            PyCallable cb(std::move(fn));
            q.q->submit([cb]() { cb(); });
          },
          nb::arg("fn"), "Runs fn() on a kiln thread after the work submitted before it.")
      .def(
          "wait",
          [](PyQueue& q) {
            nb::gil_scoped_release release;
            q.q->wait();
          },
          "Blocks until everything submitted so far has completed.")
      .def_prop_ro(
          "native_handle",
          [](const PyQueue& q) { return reinterpret_cast<uintptr_t>(q.q->native_handle()); },
          "The cudaStream_t of a GPU queue as an int; 0 for a CPU queue.");

  nb::class_<Future>(m, "Future", "The outputs of Executable.run_async.")
      .def("done", &Future::done)
      .def(
          "result",
          [](const Future& f, std::optional<double> timeout) {
            if (timeout) {
              bool ready;
              {
                nb::gil_scoped_release release;
                ready = f.f.wait_for(std::chrono::duration<double>(*timeout)) ==
                        std::future_status::ready;
              }
              if (!ready)
                throw nb::builtin_exception(nb::exception_type::runtime_error,
                                            "[run_async] timed out");
            }
            return f.result();
          },
          nb::arg("timeout") = nb::none(),
          "Waits for the run and returns its outputs, or raises the error it failed with.");

  nb::class_<Executable::IoInfo>(m, "IoInfo")
      .def_ro("name", &Executable::IoInfo::name)
      .def_ro("shape", &Executable::IoInfo::shape)
      .def_ro("dtype", &Executable::IoInfo::dtype)
      .def("__repr__", [](const Executable::IoInfo& i) {
        return "IoInfo('" + i.name + "', " + to_string(i.shape) + ", " + name(i.dtype) + ")";
      });
  nb::class_<Executable::StepInfo>(m, "StepInfo")
      .def_ro("node", &Executable::StepInfo::node)
      .def_ro("op", &Executable::StepInfo::op)
      .def_ro("backend", &Executable::StepInfo::backend)
      .def_ro("fallback_reason", &Executable::StepInfo::fallback_reason);
  nb::class_<PackageInfo>(m, "PackageInfo", "Where a loaded executable came from.")
      .def_ro("path", &PackageInfo::path)
      .def_ro("producer", &PackageInfo::producer)
      .def_ro("kiln_version", &PackageInfo::kiln_version)
      .def_ro("source_hash", &PackageInfo::source_hash)
      .def_ro("compiled_for", &PackageInfo::compiled_for)
      .def_ro("format_version", &PackageInfo::format_version)
      .def_ro("replanned", &PackageInfo::replanned)
      .def_ro("laid_out_weights", &PackageInfo::laid_out_weights,
              "The CPU's laid-out weights the file holds")
      .def_ro("laid_out_taken", &PackageInfo::laid_out_taken,
              "How many of them this load takes instead of laying them out on its first run")
      .def_ro("laid_out_for", &PackageInfo::laid_out_for,
              "The library and instruction set they were laid out for");

  nb::class_<Executable>(m, "Executable",
                         "A compiled, shape-specialized plan for one device (Graph.compile, "
                         "Executable.load).")
      .def(
          "run",
          [](const Executable& e, nb::handle feeds) {
            ByName f = feeds_of(feeds);
            nb::gil_scoped_release release;
            return f.run(e);
          },
          nb::arg("feeds") = nb::none(),
          "Runs with placeholder values ({Tensor or name: array}); returns the targets as "
          "kiln.Arrays. C-contiguous numpy arrays and DLPack tensors (PyTorch, JAX, CuPy) are "
          "read where they are (other numpy values are converted first); a returned feed is a "
          "copy.")
      .def(
          "__call__",
          [](const Executable& e, nb::handle feeds) {
            ByName f = feeds_of(feeds);
            nb::gil_scoped_release release;
            return f.run(e);
          },
          nb::arg("feeds") = nb::none())
      .def(
          "run_async",
          [](const Executable& e, PyQueue& q, nb::handle feeds,
             const std::vector<std::pair<Event, uint64_t>>& wait_events,
             const std::vector<std::tuple<Event, uint64_t, Stage>>& signal_events) {
            ByName f = feeds_of(feeds);
            ExecutionDescriptor d;
            for (auto& [ev, v] : wait_events) d.wait_events.push_back({ev, v});
            for (auto& [ev, v, s] : signal_events) d.signal_events.push_back({ev, v, s});
            nb::gil_scoped_release release;
            auto fut = f.named ? e.run_async(*q.q, f.by_name, std::move(d))
                               : e.run_async(*q.q, f.feeds, std::move(d));
            return Future{fut.share()};
          },
          nb::arg("queue"), nb::arg("feeds") = nb::none(),
          nb::arg("wait_events") = std::vector<std::pair<Event, uint64_t>>{},
          nb::arg("signal_events") = std::vector<std::tuple<Event, uint64_t, Stage>>{},
          "Runs on `queue` after the work submitted to it before, once every (event, value) of "
          "wait_events is reached; signals each (event, value, stage) of signal_events. Returns "
          "a kiln.Future at once. Keep numpy feeds unchanged until the run completes.")
      .def_prop_ro("device", &Executable::device)
      .def_prop_ro("peak_intermediate_bytes", &Executable::peak_intermediate_bytes)
      .def_prop_ro("num_steps", &Executable::num_steps)
      .def_prop_ro("replayed_runs", &Executable::replayed_runs)
      .def_prop_ro("capture_status", &Executable::capture_status)
      .def_prop_ro("is_dynamic", &Executable::is_dynamic,
                   "Whether some input dim is dynamic (a specialization per new feed shape).")
      .def(
          "shape_cache",
          [](const Executable& e) {
            const auto c = e.shape_cache();
            nb::dict d;
            d["hits"] = c.hits;
            d["misses"] = c.misses;
            d["evictions"] = c.evictions;
            d["entries"] = c.entries;
            d["bytes"] = c.bytes;
            d["peak_bytes"] = c.peak_bytes;
            d["max_entries"] = c.max_entries;
            d["max_bytes"] = c.max_bytes;
            d["symbolic"] = c.symbolic;
            d["symbolic_misses"] = c.symbolic_misses;
            d["not_symbolic"] = c.not_symbolic;
            return d;
          },
          "The specialization cache of a dynamic executable: hits, misses, evictions, entries, "
          "bytes, peak_bytes, its bounds, and whether misses specialize a symbolic program "
          "optimized "
          "once (symbolic, symbolic_misses).")
      .def("inputs", &Executable::inputs)
      .def("outputs", &Executable::outputs)
      .def("placement", &Executable::placement)
      .def("report", &Executable::report)
      .def("dump", &Executable::dump)
      .def(
          "save",
          [](const Executable& e, const std::string& path, const std::string& producer,
             const std::string& source_hash, const std::vector<std::string>& output_names,
             bool laid_out_weights) {
            PackageOptions o{producer, source_hash, output_names, laid_out_weights};
            nb::gil_scoped_release release;
            e.save(path, o);
          },
          nb::arg("path"), nb::arg("producer") = "kiln python", nb::arg("source_hash") = "",
          nb::arg("output_names") = std::vector<std::string>{}, nb::arg("laid_out_weights") = false,
          "Writes the executable as a .kiln package (program, plan, constants, variables); with "
          "laid_out_weights, also the weights the CPU laid out in the runs so far (a first run "
          "after loading on the same CPU then skips converting them; the file grows by their "
          "size).")
      .def_static(
          "load",
          [](const std::string& path, std::optional<Device> device, bool verify_weights,
             bool strict) {
            const Device d = device ? *device : default_device();
            nb::gil_scoped_release release;
            return Executable::load(path, d, {verify_weights, strict});
          },
          nb::arg("path"), nb::arg("device") = nb::none(), nb::arg("verify_weights") = true,
          nb::arg("strict") = false,
          "Loads a package for `device` (default: kiln.default_device()) without "
          "compiling; feed it by placeholder name.")
      .def_static(
          "load_bytes",
          [](nb::bytes data, std::optional<Device> device, bool verify_weights, bool strict) {
            const Device d = device ? *device : default_device();
            return Executable::load_bytes(data.c_str(), data.size(), d, {verify_weights, strict});
          },
          nb::arg("data"), nb::arg("device") = nb::none(), nb::arg("verify_weights") = true,
          nb::arg("strict") = false)
      .def_prop_ro("package_info", &Executable::package_info, nb::rv_policy::reference_internal)
      .def("variable_names", &Executable::variable_names)
      .def("read_variable", &Executable::read_variable, nb::arg("name"))
      .def(
          "write_variable",
          [](Executable& e, const std::string& n, nb::handle v) {
            e.write_variable(n, to_array(v));
          },
          nb::arg("name"), nb::arg("value"));
}

}  // namespace kiln::py
