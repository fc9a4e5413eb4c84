// Executable::save / load and the variables of an executable.
#include <algorithm>
#include <cstring>

#include "core/device_backend.h"
#include "core/errors.h"
#include "io/package/format.h"
#include "runtime/executable_impl.h"

namespace kiln {

using detail::Node;

void Executable::save(const std::string& path, const PackageOptions& options) const {
  if (!impl_) fail<ValueError>("[package] empty Executable");
  package::write(*impl_, path, options);
}

Executable Executable::load(const std::string& path, Device device, const LoadOptions& options) {
  // read, not mapped: a file that shrinks or changes later cannot fault a run (format.h, FILES)
  return Executable(package::read(package::read_file(path), device, options));
}

Executable Executable::load_bytes(const void* data, size_t size, Device device,
                                  const LoadOptions& options) {
  return Executable(package::read(package::copy_bytes(data, size), device, options));
}

bool is_package_magic(const void* head, size_t size) {
  const size_t n = std::min(size, sizeof package::kMagic);
  return n >= 4 && std::memcmp(head, package::kMagic, n) == 0;
}

const PackageInfo* Executable::package_info() const {
  return impl_ && impl_->package ? &*impl_->package : nullptr;
}

namespace {
Node& variable_node(detail::ExecutableImpl& x, const std::string& name, const char* what) {
  for (int32_t v : x.variables)
    if (x.program.graph.nodes[v].name == name) return x.program.graph.nodes[v];
  fail<ValueError>("[{}] the executable has no variable named '{}'", what, name);
}
}  // namespace

std::vector<std::string> Executable::variable_names() const {
  std::vector<std::string> r;
  if (impl_)
    for (int32_t v : impl_->variables) r.push_back(impl_->program.graph.nodes[v].name);
  return r;
}

Array Executable::read_variable(const std::string& name) const {
  if (!impl_) fail<ValueError>("[read_variable] empty Executable");
  const Array& value = variable_node(*impl_, name, "read_variable").value;
  return value.device().kind == Device::Kind::cpu ? value.copy() : value.to(Device::cpu());
}

void Executable::write_variable(const std::string& name, const Array& value) {
  if (!impl_) fail<ValueError>("[write_variable] empty Executable");
  Node& n = variable_node(*impl_, name, "write_variable");
  if (value.shape() != n.value.shape())
    fail<ShapeError>("[write_variable] '{}' has shape {}, the value {}", name, str(n.value.shape()),
                     str(value.shape()));
  if (value.dtype() != n.value.dtype())
    fail<DTypeError>("[write_variable] '{}' has dtype {}, the value {}", name,
                     kiln::name(n.value.dtype()), kiln::name(value.dtype()));
  // in place, like Graph::write_variable: every executable sharing it sees the new value
  move_storage(*n.value.storage(), Device::cpu());
  const Array host = value.to(Device::cpu());
  std::memcpy(n.value.data(), host.data(), value.nbytes());
}

}  // namespace kiln
