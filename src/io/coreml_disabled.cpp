// Core ML import in a build without it (KILN_COREML=OFF: cmake/coreml.cmake): every entry point
// of include/kiln/coreml.h says so.
#ifndef KILN_HAS_COREML
#include "core/errors.h"
#include "kiln/coreml.h"

namespace kiln::coreml {

namespace {
[[noreturn]] void unavailable() {
  fail<UnsupportedError>(
      "[coreml] this kiln was built without Core ML import (configured with -DKILN_COREML=OFF)");
}
}  // namespace

Model import(const std::string&, const ImportOptions&) { unavailable(); }
Model import_bytes(const void*, size_t, const ImportOptions&) { unavailable(); }
bool available() { return false; }
std::vector<std::string> supported_ops() { return {}; }
std::vector<std::string> supported_layers() { return {}; }
std::vector<Tensor> Model::output_tensors() const { unavailable(); }
Feeds Model::feeds(const std::map<std::string, Array>&) const { unavailable(); }
FeedShapes Model::feed_shapes(const std::map<std::string, Shape>&) const { unavailable(); }

}  // namespace kiln::coreml
#endif
