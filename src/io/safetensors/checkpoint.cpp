// Hugging Face checkpoint directories: model.safetensors, or the shards of
// model.safetensors.index.json (include/kiln/safetensors.h, Checkpoint).
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/errors.h"
#include "kiln/safetensors.h"

namespace kiln::safetensors {

namespace fs = std::filesystem;

struct Checkpoint::Impl {
  std::string dir;
  std::vector<std::string> shard_names;
  std::vector<File> shards;
  std::map<std::string, size_t> shard_of;  // tensor -> index into shards
};

namespace {
constexpr uintmax_t kMaxIndexBytes = uintmax_t{64} << 20;

// A shard name of the index: a plain file name (the index cannot reach outside the directory).
bool plain_name(const std::string& s) {
  return !s.empty() && s.find('/') == std::string::npos && s.find('\\') == std::string::npos &&
         s != "." && s != ".." && s.find('\0') == std::string::npos;
}
}  // namespace

Checkpoint Checkpoint::open(const std::string& dir) {
  auto impl = std::make_shared<Impl>();
  impl->dir = dir;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  std::error_code ec;
  if (fs::is_regular_file(index, ec)) {
    const uintmax_t size = fs::file_size(index, ec);
    if (ec || size > kMaxIndexBytes)
      fail<FormatError>("[safetensors] {}: the index is not a file of at most {} bytes",
                        index.string(), kMaxIndexBytes);
    std::ifstream in(index, std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) fail<IoError>("[safetensors] cannot read {}", index.string());
    const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("weight_map") ||
        !j["weight_map"].is_object())
      fail<FormatError>("[safetensors] {}: not a JSON object with a weight_map object",
                        index.string());
    std::map<std::string, size_t> opened;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string())
        fail<FormatError>("[safetensors] {}: weight_map['{}'] is not a file name", index.string(),
                          it.key());
      const std::string shard = it.value().get<std::string>();
      if (!plain_name(shard))
        fail<FormatError>(
            "[safetensors] {}: weight_map['{}'] names '{}', which is not a file of "
            "the checkpoint's directory",
            index.string(), it.key(), shard);
      auto at = opened.find(shard);
      if (at == opened.end()) {
        impl->shards.push_back(File::open((fs::path(dir) / shard).string()));
        impl->shard_names.push_back(shard);
        at = opened.emplace(shard, impl->shards.size() - 1).first;
      }
      if (!impl->shards[at->second].contains(it.key()))
        fail<FormatError>("[safetensors] {}: the index places '{}' in {}, which does not hold it",
                          index.string(), it.key(), shard);
      impl->shard_of[it.key()] = at->second;
    }
  } else if (fs::is_regular_file(single, ec)) {
    impl->shards.push_back(File::open(single.string()));
    impl->shard_names.push_back("model.safetensors");
    for (const Entry& e : impl->shards[0].tensors()) impl->shard_of[e.name] = 0;
  } else {
    fail<IoError>(
        "[safetensors] {} holds neither model.safetensors nor "
        "model.safetensors.index.json",
        dir);
  }
  Checkpoint c;
  c.impl_ = std::move(impl);
  return c;
}

std::vector<std::string> Checkpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, k] : impl_->shard_of) out.push_back(name);
  return out;
}

bool Checkpoint::contains(const std::string& name) const { return impl_->shard_of.count(name) > 0; }

const Entry& Checkpoint::entry(const std::string& name) const {
  const auto it = impl_->shard_of.find(name);
  if (it == impl_->shard_of.end())
    fail<ValueError>("[safetensors] checkpoint {}: no tensor '{}' ({} tensors in {} files)",
                     impl_->dir, name, impl_->shard_of.size(), impl_->shards.size());
  return impl_->shards[it->second].entry(name);
}

const std::string& Checkpoint::shard_of(const std::string& name) const {
  entry(name);  // (throws for an unknown name)
  return impl_->shard_names[impl_->shard_of.at(name)];
}

Array Checkpoint::read(const std::string& name, Device device) const {
  entry(name);
  return impl_->shards[impl_->shard_of.at(name)].read(name, device);
}

std::vector<std::string> Checkpoint::shards() const { return impl_->shard_names; }

}  // namespace kiln::safetensors
