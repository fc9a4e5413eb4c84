// onnx::Session: a model imported and compiled once per distinct set of the run-time values its
// import needs (InputValuesNeeded: values of inputs, lengths and element shapes of sequence
// inputs), kept least recently used first.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <list>
#include <mutex>
#include <set>

#include "core/errors.h"
#include "io/file.h"
#include "io/onnx/session_split.h"
#include "kiln/executable.h"
#include "kiln/onnx.h"

namespace kiln::onnx {

namespace {
using Shapes = std::map<std::string, std::vector<Shape>>;
using Sequences = std::map<std::string, std::vector<Array>>;

// An import for one set of values, and its executable.
struct Entry {
  std::string key;
  std::shared_ptr<const Model> model;
  std::shared_ptr<Executable> exe;
};
}  // namespace

struct Session::Impl {
  std::vector<uint8_t> bytes;
  Device device;
  SessionOptions options;
  mutable std::mutex mu;
  std::vector<std::string> value_inputs;  // found as imports needed them
  std::list<Entry> entries;               // most recently used first
  std::shared_ptr<const Model> last;
  int64_t imports = 0;
  // set when an import meets a data-dependent node: the model runs in parts from then on
  std::shared_ptr<detail::SplitModel> split;
  bool splits() {
    std::lock_guard<std::mutex> l(mu);
    return split != nullptr;
  }

  std::pair<std::shared_ptr<const Model>, std::shared_ptr<Executable>> select(
      const std::map<std::string, Array>& feeds, const Sequences& sequences,
      const std::set<std::string>& absent);

  // The values of the value inputs in `feeds`, as a key: dtype, shape and bytes of each, and the
  // element shapes of the sequences.
  std::string key_of(const std::map<std::string, Array>& host, const Shapes& sequences) const {
    std::string key;
    for (const std::string& name : value_inputs) {
      if (auto it = sequences.find(name); it != sequences.end()) {
        key += fmt::format("{}|sequence|{}|", name, it->second.size());
        for (const Shape& s : it->second) key += str(s) + "|";
        continue;
      }
      const Array& a = host.at(name);
      key += fmt::format("{}|{}|{}|", name, kiln::name(a.dtype()), str(a.shape()));
      key.append(static_cast<const char*>(a.data()), a.nbytes());
    }
    return key;
  }

  // Imports and compiles with `values` and sequence shapes given; on InputValuesNeeded adds the
  // inputs it names to value_inputs and returns null (the caller reads their values and comes
  // back).
  std::shared_ptr<Entry> make(const std::map<std::string, Array>& values, const Shapes& sequences,
                              const std::set<std::string>& absent, const std::string& key) {
    ImportOptions o = options.import;
    o.absent_inputs.insert(absent.begin(), absent.end());
    for (const auto& [name, a] : values) {
      o.input_values[name] = a;
      o.input_shapes.erase(name);
    }
    for (const auto& [name, shapes] : sequences) o.sequence_inputs[name] = shapes;
    auto model = std::make_shared<Model>();
    try {
      *model = import_bytes(bytes.data(), bytes.size(), o);
    } catch (const InputValuesNeeded& e) {
      if (!e.node.empty() && options.split_at_data_dependent_nodes)
        if ((split = detail::split_model(bytes, e.node, e.output_dims, device, options)))
          return nullptr;
      bool added = false;
      for (const std::string& n : e.inputs)
        if (std::find(value_inputs.begin(), value_inputs.end(), n) == value_inputs.end()) {
          value_inputs.push_back(n);
          added = true;
        }
      if (!added) throw;  // its values were given and did not help
      return nullptr;
    }
    ++imports;
    auto entry = std::make_shared<Entry>();
    entry->key = key;
    entry->exe = std::make_shared<Executable>(model->graph.compile(
        device, model->feed_shapes(), model->output_tensors(), options.compile));
    entry->model = std::move(model);
    return entry;
  }
};

Session::Session(const std::string& path, Device device, SessionOptions options) {
  const io::RegularFile f(path, "[onnx]", "'" + path + "'");
  auto impl = std::make_shared<Impl>();
  impl->bytes.resize(std::max<size_t>(static_cast<size_t>(f.size()), 1));
  if (f.read_at(impl->bytes.data(), f.size(), 0) != f.size())
    fail<IoError>("[onnx] cannot read '{}'", path);
  impl->bytes.resize(static_cast<size_t>(f.size()));
  if (options.import.external_data_dir.empty()) {
    const auto dir = std::filesystem::path(path).parent_path();
    options.import.external_data_dir = dir.empty() ? "." : dir.string();
  }
  impl->device = device;
  impl->options = std::move(options);
  *this = Session(std::move(impl));
  std::lock_guard<std::mutex> l(impl_->mu);
  if (auto e = impl_->make({}, {}, {}, impl_->key_of({}, {}))) {
    impl_->last = e->model;
    impl_->entries.push_front(std::move(*e));
  }
}

Session Session::from_bytes(const void* data, size_t size, Device device, SessionOptions options) {
  auto impl = std::make_shared<Impl>();
  impl->bytes.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + size);
  impl->device = device;
  impl->options = std::move(options);
  Session s(std::move(impl));
  std::lock_guard<std::mutex> l(s.impl_->mu);
  if (auto e = s.impl_->make({}, {}, {}, s.impl_->key_of({}, {}))) {
    s.impl_->last = e->model;
    s.impl_->entries.push_front(std::move(*e));
  }
  return s;
}

// The import and executable for these feeds (made when new).
std::pair<std::shared_ptr<const Model>, std::shared_ptr<Executable>> Session::Impl::select(
    const std::map<std::string, Array>& feeds, const Sequences& sequences,
    const std::set<std::string>& absent) {
  std::lock_guard<std::mutex> l(mu);
  if (split) return {nullptr, nullptr};
  // (each import that needs more values names them; a model has finitely many inputs)
  for (;;) {
    std::map<std::string, Array> values;
    Shapes shapes;
    for (const std::string& name : value_inputs) {
      if (auto it = sequences.find(name); it != sequences.end()) {
        for (const Array& a : it->second) shapes[name].push_back(a.shape());
        shapes[name];  // (an empty sequence too)
        continue;
      }
      auto it = feeds.find(name);
      if (it == feeds.end())
        fail<ValueError>(
            "[onnx] input '{}' has no feed (kiln reads its value to import the "
            "model; a sequence input is fed through Session::run_values)",
            name);
      values[name] = it->second.to(Device::cpu());
    }
    std::string key = key_of(values, shapes);
    for (const std::string& name : absent) key += name + "|none|";
    auto it =
        std::find_if(entries.begin(), entries.end(), [&](const Entry& e) { return e.key == key; });
    if (it != entries.end()) {
      entries.splice(entries.begin(), entries, it);
    } else {
      std::shared_ptr<Entry> e = make(values, shapes, absent, key);
      if (split) return {nullptr, nullptr};
      if (!e) continue;
      entries.push_front(std::move(*e));
      while (entries.size() > std::max<size_t>(options.max_imports, 1)) entries.pop_back();
    }
    last = entries.front().model;
    return {entries.front().model, entries.front().exe};
  }
}

namespace {
std::vector<Array> tensors_of(std::vector<Value> values, const std::vector<std::string>& names) {
  std::vector<Array> r;
  for (size_t k = 0; k < values.size(); ++k) {
    if (values[k].is_sequence || values[k].is_none || values[k].is_string)
      fail<ValueError>("[onnx] output '{}' is {}: Session::run_values runs this model", names[k],
                       values[k].is_sequence ? "a sequence"
                       : values[k].is_string ? "strings"
                                             : "an optional without a value");
    r.push_back(std::move(values[k].tensor));
  }
  return r;
}
}  // namespace

std::vector<Array> Session::run(const std::map<std::string, Array>& feeds) const {
  auto [model, exe] = impl_->select(feeds, {}, {});
  if (!exe) {  // (split at a data-dependent node)
    std::map<std::string, Value> values;
    for (const auto& [name, a] : feeds) values.emplace(name, Value::of(a));
    return tensors_of(detail::run_split(*impl_->split, values),
                      detail::split_output_names(*impl_->split));
  }
  for (const GraphOutput& o : model->graph_outputs)
    if (o.sequence || o.absent)
      fail<ValueError>("[onnx] output '{}' is {}: Session::run_values runs this model", o.name,
                       o.sequence ? "a sequence" : "an optional without a value");
  return exe->run(model->feeds(feeds));
}

std::vector<Value> Session::run_values(const std::map<std::string, Value>& feeds) const {
  if (impl_->splits()) return detail::run_split(*impl_->split, feeds);
  std::map<std::string, Array> tensors;
  Sequences sequences;
  std::set<std::string> absent;
  for (const auto& [name, v] : feeds) {
    if (v.is_none) {
      absent.insert(name);
      continue;
    }
    if (!v.is_sequence) {
      tensors[name] = v.tensor;
      continue;
    }
    sequences[name] = v.sequence;
    for (size_t k = 0; k < v.sequence.size(); ++k)
      tensors[fmt::format("{}[{}]", name, k)] = v.sequence[k];
  }
  auto [model, exe] = impl_->select(tensors, sequences, absent);
  if (!exe) return detail::run_split(*impl_->split, feeds);
  for (const auto& fed : sequences) {
    const std::string& name = fed.first;  // (a structured binding cannot be captured in C++20)
    const bool known = std::any_of(model->inputs.begin(), model->inputs.end(),
                                   [&](const ValueInfo& in) { return in.sequence == name; });
    if (!known && !fed.second.empty())
      fail<ValueError>("[onnx] input '{}' is fed a sequence; the model's input is a tensor", name);
  }
  std::vector<Array> flat = exe->run(model->feeds(tensors));
  std::vector<Value> out;
  for (const GraphOutput& o : model->graph_outputs) {
    if (o.absent) {
      out.push_back(Value::none());
      continue;
    }
    if (!o.sequence) {
      out.push_back(Value::of(std::move(flat[o.first])));
      continue;
    }
    std::vector<Array> items;
    for (size_t k = 0; k < o.count; ++k) items.push_back(std::move(flat[o.first + k]));
    out.push_back(Value::of_sequence(std::move(items)));
  }
  return out;
}

std::vector<std::string> Session::value_inputs() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  if (impl_->split) return detail::split_value_inputs(*impl_->split);
  return impl_->value_inputs;
}
int64_t Session::imports() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->imports + (impl_->split ? detail::split_imports(*impl_->split) : 0);
}
size_t Session::kept() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  if (impl_->split) return detail::split_kept(*impl_->split);
  return impl_->entries.size();
}
std::shared_ptr<const Model> Session::model() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  if (impl_->split) return detail::split_first_model(*impl_->split);
  return impl_->last;
}
std::vector<std::string> Session::output_names() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  if (impl_->split) return detail::split_output_names(*impl_->split);
  std::vector<std::string> r;
  if (impl_->last)
    for (const GraphOutput& o : impl_->last->graph_outputs) r.push_back(o.name);
  return r;
}
bool Session::split() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->split != nullptr;
}

}  // namespace kiln::onnx
