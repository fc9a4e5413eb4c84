// onnx::Session: a model imported and compiled once per distinct set of the run-time values its
// import needs (InputValuesNeeded), kept least recently used first.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <list>
#include <mutex>

#include "core/errors.h"
#include "io/file.h"
#include "kiln/executable.h"
#include "kiln/onnx.h"

namespace kiln::onnx {

namespace {
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

  // The values of the value inputs in `feeds`, as a key: dtype, shape and bytes of each.
  std::string key_of(const std::map<std::string, Array>& host) const {
    std::string key;
    for (const std::string& name : value_inputs) {
      const Array& a = host.at(name);
      key += fmt::format("{}|{}|{}|", name, kiln::name(a.dtype()), str(a.shape()));
      key.append(static_cast<const char*>(a.data()), a.nbytes());
    }
    return key;
  }

  // Imports and compiles with `values` given; on InputValuesNeeded adds the inputs it names to
  // value_inputs and returns null (the caller reads their values and comes back).
  std::shared_ptr<Entry> make(const std::map<std::string, Array>& values, const std::string& key) {
    ImportOptions o = options.import;
    for (const auto& [name, a] : values) {
      o.input_values[name] = a;
      o.input_shapes.erase(name);
    }
    auto model = std::make_shared<Model>();
    try {
      *model = import_bytes(bytes.data(), bytes.size(), o);
    } catch (const InputValuesNeeded& e) {
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
  if (auto e = impl_->make({}, impl_->key_of({}))) {
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
  if (auto e = s.impl_->make({}, s.impl_->key_of({}))) {
    s.impl_->last = e->model;
    s.impl_->entries.push_front(std::move(*e));
  }
  return s;
}

std::vector<Array> Session::run(const std::map<std::string, Array>& feeds) const {
  Impl& m = *impl_;
  std::shared_ptr<const Model> model;
  std::shared_ptr<Executable> exe;
  {
    std::lock_guard<std::mutex> l(m.mu);
    // (each import that needs more values names them; a model has finitely many inputs)
    for (;;) {
      std::map<std::string, Array> values;
      for (const std::string& name : m.value_inputs) {
        auto it = feeds.find(name);
        if (it == feeds.end())
          fail<ValueError>(
              "[onnx] input '{}' has no feed (kiln reads its value to import the "
              "model)",
              name);
        values[name] = it->second.to(Device::cpu());
      }
      const std::string key = m.key_of(values);
      auto it = std::find_if(m.entries.begin(), m.entries.end(),
                             [&](const Entry& e) { return e.key == key; });
      if (it != m.entries.end()) {
        m.entries.splice(m.entries.begin(), m.entries, it);
      } else {
        std::shared_ptr<Entry> e = m.make(values, key);
        if (!e) continue;
        m.entries.push_front(std::move(*e));
        while (m.entries.size() > std::max<size_t>(m.options.max_imports, 1)) m.entries.pop_back();
      }
      model = m.entries.front().model;
      exe = m.entries.front().exe;
      m.last = model;
      break;
    }
  }
  return exe->run(model->feeds(feeds));
}

std::vector<std::string> Session::value_inputs() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->value_inputs;
}
int64_t Session::imports() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->imports;
}
size_t Session::kept() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->entries.size();
}
std::shared_ptr<const Model> Session::model() const {
  std::lock_guard<std::mutex> l(impl_->mu);
  return impl_->last;
}

}  // namespace kiln::onnx
