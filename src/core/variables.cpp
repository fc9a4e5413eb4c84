// Graph variables and checkpoints.
//
// Checkpoint file (little endian):
//   "KILNVARS" | u32 version (1) | u32 count | count x record
//   record: u32 name_len | name | u8 dtype | u32 rank | i64 dims[rank] | u64 nbytes | data
// Every length is checked against the file size before it is used.
#include <cstring>
#include <fstream>
#include <map>

#include "core/device_backend.h"
#include "core/errors.h"
#include "core/graph_impl.h"

namespace kiln {

namespace {
constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'V', 'A', 'R', 'S'};
constexpr uint32_t kVersion = 1;

detail::Node& variable_node(detail::GraphImpl& g, const Tensor& t, const char* what) {
  if (t.graph_impl() != &g || t.node_id() < 0 || g.nodes[t.node_id()].op != OpId::Variable)
    fail<ValueError>("[{}] '{}' is not a variable of this graph", what, t.valid() ? t.name() : "");
  return g.nodes[t.node_id()];
}

template <typename T> void put(std::ofstream& f, T v) { f.write(reinterpret_cast<const char*>(&v), sizeof v); }

class Reader {
 public:
  Reader(const std::string& path) : path_(path), f_(path, std::ios::binary) {
    if (!f_) fail<IoError>("[checkpoint] cannot open '{}'", path);
    f_.seekg(0, std::ios::end);
    size_ = static_cast<uint64_t>(f_.tellg());
    f_.seekg(0);
  }
  void read(void* dst, uint64_t n) {
    if (n > size_ - pos_)
      fail<FormatError>("[checkpoint] {}: {} bytes needed at offset {} but the file has {}", path_,
                        n, pos_, size_);
    f_.read(static_cast<char*>(dst), static_cast<std::streamsize>(n));
    if (!f_) fail<IoError>("[checkpoint] {}: read failed at offset {}", path_, pos_);
    pos_ += n;
  }
  template <typename T> T get() {
    T v;
    read(&v, sizeof v);
    return v;
  }
  uint64_t offset() const { return pos_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::ifstream f_;
  uint64_t size_ = 0, pos_ = 0;
};
}  // namespace

Tensor Graph::variable(const Array& initial, const std::string& name) {
  if (!initial.valid()) fail<ValueError>("[variable] empty initial value");
  std::string n = name.empty() ? "variable" + std::to_string(variables().size()) : name;
  for (auto& node : impl_->nodes)
    if (node.op == OpId::Variable && node.name == n)
      fail<ValueError>("[variable] a variable named '{}' exists already", n);
  detail::Node node;
  node.op = OpId::Variable;
  node.outputs = {{initial.shape(), initial.dtype()}};
  node.value = initial.copy();
  node.name = n;
  return Tensor(impl_.get(), impl_->add_inferred(std::move(node)), 0);
}

std::vector<Tensor> Graph::variables() const {
  std::vector<Tensor> r;
  for (size_t i = 0; i < impl_->nodes.size(); ++i)
    if (impl_->nodes[i].op == OpId::Variable) r.emplace_back(impl_.get(), static_cast<int32_t>(i), 0);
  return r;
}

Array Graph::read_variable(const Tensor& v) const {
  const Array& value = variable_node(*impl_, v, "read_variable").value;
  // a host copy wherever the variable lives now
  return value.device().kind == Device::Kind::cpu ? value.copy() : value.to(Device::cpu());
}

void Graph::write_variable(const Tensor& v, const Array& value) {
  detail::Node& n = variable_node(*impl_, v, "write_variable");
  if (value.shape() != n.value.shape())
    fail<ShapeError>("[write_variable] '{}' has shape {}, the value {}", n.name, str(n.value.shape()),
                     str(value.shape()));
  if (value.dtype() != n.value.dtype())
    fail<DTypeError>("[write_variable] '{}' has dtype {}, the value {}", n.name,
                     name(n.value.dtype()), name(value.dtype()));
  // in place: executables compiled earlier keep reading the same storage
  // (moved back to the host first; GPU executables move it up again on their next run)
  move_storage(*n.value.storage(), Device::cpu());
  const Array host = value.to(Device::cpu());
  std::memcpy(n.value.data(), host.data(), value.nbytes());
}

void Graph::save_variables(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail<IoError>("[checkpoint] cannot open '{}' for writing", tmp);
    f.write(kMagic, 8);
    put<uint32_t>(f, kVersion);
    auto vars = variables();
    put<uint32_t>(f, static_cast<uint32_t>(vars.size()));
    for (auto& v : vars) {
      const detail::Node& n = impl_->nodes[v.node_id()];
      put<uint32_t>(f, static_cast<uint32_t>(n.name.size()));
      f.write(n.name.data(), static_cast<std::streamsize>(n.name.size()));
      put<uint8_t>(f, static_cast<uint8_t>(n.value.dtype()));
      put<uint32_t>(f, static_cast<uint32_t>(n.value.rank()));
      for (int64_t d : n.value.shape()) put<int64_t>(f, d);
      put<uint64_t>(f, n.value.nbytes());
      const Array host = n.value.to(Device::cpu());
      f.write(static_cast<const char*>(host.data()), static_cast<std::streamsize>(host.nbytes()));
    }
    if (!f) fail<IoError>("[checkpoint] write to '{}' failed", tmp);
  }
  // replace atomically: a crash mid-write never leaves a truncated checkpoint under `path`
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    fail<IoError>("[checkpoint] cannot rename '{}' to '{}'", tmp, path);
}

void Graph::load_variables(const std::string& path) {
  Reader r(path);
  char magic[8];
  r.read(magic, 8);
  if (std::memcmp(magic, kMagic, 8) != 0) fail<FormatError>("[checkpoint] {}: not a kiln checkpoint", path);
  const uint32_t version = r.get<uint32_t>();
  if (version != kVersion)
    fail<FormatError>("[checkpoint] {}: version {} is not supported (this kiln reads {})", path,
                      version, kVersion);
  const uint32_t count = r.get<uint32_t>();
  std::map<std::string, Array> found;
  for (uint32_t i = 0; i < count; ++i) {
    const uint32_t len = r.get<uint32_t>();
    if (len > 4096) fail<FormatError>("[checkpoint] {}: name length {} at offset {}", path, len, r.offset());
    std::string name(len, '\0');
    r.read(name.data(), len);
    const uint8_t dt = r.get<uint8_t>();
    if (dt >= kNumDTypes) fail<FormatError>("[checkpoint] {}: bad dtype {} for '{}'", path, dt, name);
    const uint32_t rank = r.get<uint32_t>();
    if (rank > 16) fail<FormatError>("[checkpoint] {}: rank {} for '{}'", path, rank, name);
    Shape shape(rank);
    uint64_t n = 1;
    for (auto& d : shape) {
      d = r.get<int64_t>();
      if (d < 0 || (d > 0 && n > (uint64_t{1} << 62) / static_cast<uint64_t>(d)))
        fail<FormatError>("[checkpoint] {}: bad dims for '{}'", path, name);
      n *= static_cast<uint64_t>(d);
    }
    const uint64_t bytes = r.get<uint64_t>();
    if (bytes != n * size_of(static_cast<DType>(dt)))
      fail<FormatError>("[checkpoint] {}: '{}' declares {} bytes for shape {}", path, name, bytes,
                        str(shape));
    Array a = Array::empty(shape, static_cast<DType>(dt));
    r.read(a.data(), bytes);
    found[name] = a;
  }
  // check everything before writing anything: a bad file leaves the variables untouched
  auto vars = variables();
  for (auto& v : vars) {
    const detail::Node& n = impl_->nodes[v.node_id()];
    auto it = found.find(n.name);
    if (it == found.end()) fail<ValueError>("[checkpoint] {}: no value for variable '{}'", path, n.name);
    if (it->second.shape() != n.value.shape() || it->second.dtype() != n.value.dtype())
      fail<ShapeError>("[checkpoint] {}: '{}' is {} {} in the file but {} {} in the graph", path,
                       n.name, name(it->second.dtype()), str(it->second.shape()),
                       name(n.value.dtype()), str(n.value.shape()));
  }
  for (auto& v : vars) write_variable(v, found[impl_->nodes[v.node_id()].name]);
}

}  // namespace kiln
