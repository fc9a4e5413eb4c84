// The safetensors reader against files written here byte by byte as the format defines them
// (include/kiln/safetensors.h), on fresh random data: every dtype, metadata, header padding, and
// every check of a hostile header.
#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/safetensors.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;
using safetensors::File;

struct Tensor_ {
  std::string name, dtype;
  Shape shape;
  std::vector<uint8_t> bytes;
};

// A file: the 8-byte length, the JSON (padded with spaces to a multiple of 8, as the Python
// writer does), the data.
std::vector<uint8_t> file_of(const std::vector<Tensor_>& ts, const std::string& extra = "",
                             bool pad = true) {
  std::string json = "{";
  uint64_t at = 0;
  for (const auto& t : ts) {
    std::string shape;
    for (int64_t d : t.shape) shape += (shape.empty() ? "" : ",") + std::to_string(d);
    json +=
        fmt::format("{}\"{}\":{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{},{}]}}",
                    json.size() > 1 ? "," : "", t.name, t.dtype, shape, at, at + t.bytes.size());
    at += t.bytes.size();
  }
  json += extra + "}";
  while (pad && json.size() % 8) json += ' ';
  std::vector<uint8_t> out(8);
  const uint64_t n = json.size();
  std::memcpy(out.data(), &n, 8);
  out.insert(out.end(), json.begin(), json.end());
  for (const auto& t : ts) out.insert(out.end(), t.bytes.begin(), t.bytes.end());
  return out;
}

Tensor_ tensor_of(const std::string& name, const std::string& dtype, const Array& a) {
  const auto* p = static_cast<const uint8_t*>(a.data());
  return {name, dtype, a.shape(), std::vector<uint8_t>(p, p + a.nbytes())};
}

TEST(Safetensors, ReadsEveryDtypeAndTheMetadata) {
  const std::pair<const char*, DType> kinds[] = {{"F64", f64},
                                                 {"F32", f32},
                                                 {"F16", f16},
                                                 {"BF16", bf16},
                                                 {"I64", i64},
                                                 {"I32", i32},
                                                 {"I16", i16},
                                                 {"I8", i8},
                                                 {"U8", u8},
                                                 // (F8_E4M3 is PyTorch's float8_e4m3fn)
                                                 {"F8_E4M3", f8e4m3fn},
                                                 {"F8_E5M2", f8e5m2},
                                                 {"F8_E4M3FNUZ", f8e4m3fnuz},
                                                 {"F8_E5M2FNUZ", f8e5m2fnuz},
                                                 {"F8_E8M0", f8e8m0fnu}};
  std::vector<Tensor_> ts;
  std::vector<Array> want;
  for (const auto& [name, dt] : kinds) {
    want.push_back(is_floating(dt) ? random_array({3, 5}, dt, -4, 4)
                                   : random_ints({3, 5}, 0, 100, dt));
    ts.push_back(tensor_of(fmt::format("layers.0.{}", name), name, want.back()));
  }
  want.push_back(random_array({7}, boolean));
  ts.push_back(tensor_of("mask", "BOOL", want.back()));
  want.push_back(random_array({}, f32));
  ts.push_back(tensor_of("scalar", "F32", want.back()));
  want.push_back(Array::empty({0, 4}, f32));
  ts.push_back(tensor_of("empty", "F32", want.back()));
  const auto bytes = file_of(ts, ",\"__metadata__\":{\"format\":\"pt\"}");
  const std::string path = ::testing::TempDir() + "kiln_test.safetensors";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  for (const File& f : {File::open(path), File::from_bytes(bytes.data(), bytes.size())}) {
    ASSERT_EQ(f.tensors().size(), ts.size());
    EXPECT_EQ(f.metadata().at("format"), "pt");
    for (size_t k = 0; k < ts.size(); ++k) {
      SCOPED_TRACE(ts[k].name);
      EXPECT_EQ(f.tensors()[k].name, ts[k].name);  // in the order of their data
      const Array got = f.read(ts[k].name);
      EXPECT_EQ(got.dtype(), want[k].dtype());
      expect_equal(got, want[k].shape(), to_f64(want[k]));
    }
    EXPECT_EQ(f.read_all().size(), ts.size());
    EXPECT_TRUE(f.contains("mask"));
    expect_error<ValueError>([&] { f.read("lm_head.weight"); },
                             {"[safetensors]", "no tensor 'lm_head.weight'"});
  }
  std::remove(path.c_str());
}

TEST(Safetensors, RefusesHostileHeaders) {
  const Array a = random_array({2, 3}, f32);
  const Tensor_ t = tensor_of("w", "F32", a);
  auto refused = [](const std::vector<uint8_t>& b, const std::vector<std::string>& parts) {
    expect_error<FormatError>([&] { File::from_bytes(b.data(), b.size(), "x.safetensors"); },
                              parts);
  };
  std::vector<uint8_t> b = file_of({t});
  // lengths
  refused({1, 2, 3}, {"[safetensors] x.safetensors", "8-byte header length"});
  std::vector<uint8_t> big = b;
  const uint64_t huge = uint64_t{1} << 40;
  std::memcpy(big.data(), &huge, 8);
  refused(big, {"a header of 1099511627776 bytes (at most"});
  std::vector<uint8_t> past = b;
  const uint64_t n = b.size();
  std::memcpy(past.data(), &n, 8);
  refused(past, {"bytes in a file of"});
  // JSON and fields
  auto with_json = [&](const std::string& json, size_t data_bytes = 24) {
    std::vector<uint8_t> out(8);
    const uint64_t len = json.size();
    std::memcpy(out.data(), &len, 8);
    out.insert(out.end(), json.begin(), json.end());
    out.resize(out.size() + data_bytes, 0);
    return out;
  };
  const std::string ok = R"("dtype":"F32","shape":[2,3],"data_offsets":[0,24])";
  refused(with_json("{\"w\":{" + ok + "}"), {"not JSON"});
  refused(with_json("[1,2]"), {"not a JSON object"});
  refused(with_json("{\"w\":{" + ok + "},\"w\":{" + ok + "}}"), {"names 'w' twice"});
  refused(with_json(R"({"w":{"dtype":"F32","shape":[2,3]}})"), {"tensor 'w'", "data_offsets"});
  refused(with_json(R"({"w":{"dtype":"F32","shape":[2,-3],"data_offsets":[0,24]}})"),
          {"tensor 'w'", "not an integer in [0, 2^40]"});
  refused(with_json(R"({"w":{"dtype":"F32","shape":[2,3.5],"data_offsets":[0,24]}})"),
          {"tensor 'w'", "not an integer"});
  refused(with_json(R"({"w":{"dtype":"F32","shape":[2,4],"data_offsets":[0,24]}})"),
          {"tensor 'w'", "data_offsets [0, 24) for f32 (2, 4), which takes 32 bytes"});
  refused(with_json(R"({"w":{"dtype":"F33","shape":[2,3],"data_offsets":[0,24]}})"),
          {"tensor 'w'", "unknown dtype 'F33'"});
  refused(with_json("{\"w\":{" + ok + ",\"extra\":1}}"), {"unknown field 'extra'"});
  refused(with_json("{\"w\":{" + ok + "},\"__metadata__\":{\"a\":1}}"), {"__metadata__ 'a'"});
  // the ranges must tile the data section
  refused(with_json("{\"w\":{" + ok + "}}", 32), {"hold 24 bytes of a data section of 32"});
  refused(with_json(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[4],"data_offsets":[4,20]}})",
                    20),
          {"tensor 'b' starts at byte 4", "overlaps"});
  refused(with_json(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})", 16),
          {"tensor 'a' starts at byte 8", "a gap is left"});
  // a dtype of the format that kiln lacks (F4 packs two values a byte)
  expect_error<UnsupportedError>(
      [&] {
        const auto u = with_json(R"({"q":{"dtype":"F4","shape":[4],"data_offsets":[0,2]}})", 2);
        File::from_bytes(u.data(), u.size(), "x.safetensors");
      },
      {"[safetensors] x.safetensors", "tensor 'q' has dtype F4"});
  // a bool that is neither 0 nor 1, found when read
  const auto bad_bool = with_json(R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", 3);
  std::vector<uint8_t> bb = bad_bool;
  bb[bb.size() - 2] = 7;
  const File f = File::from_bytes(bb.data(), bb.size(), "x.safetensors");
  expect_error<FormatError>([&] { f.read("m"); }, {"bool tensor 'm' holds 7 at element 1"});
  // an unpadded header and a header of spaces only around the JSON both read
  const auto unpadded = file_of({t}, "", false);
  expect_equal(File::from_bytes(unpadded.data(), unpadded.size()).read("w"), {2, 3}, to_f64(a));
  // a missing file
  expect_error<IoError>([] { File::open("/nonexistent/x.safetensors"); }, {"[safetensors]"});
}

// A file cut short after it was opened is an IoError when the tensor is read, not a crash.
TEST(Safetensors, FileCutShortAfterOpeningIsAnIoError) {
  const Array a = random_array({64}, f32);
  const auto bytes = file_of({tensor_of("w", "F32", a)});
  const std::string path = ::testing::TempDir() + "kiln_cut.safetensors";
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()),
             static_cast<std::streamsize>(bytes.size()));
  const File f = File::open(path);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), 40);
  expect_error<IoError>([&] { f.read("w"); }, {"[safetensors]", "tensor 'w' could not be read"});
  std::remove(path.c_str());
}

void write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary)
      .write(text.data(), static_cast<std::streamsize>(text.size()));
}
void write(const std::string& path, const std::vector<uint8_t>& b) {
  write(path, std::string(b.begin(), b.end()));
}

// A checkpoint directory of its own (removed at the end of the test).
struct TempDir {
  std::string path;
  explicit TempDir(const std::string& name)
      : path(::testing::TempDir() + "kiln_" + name + "_" + std::to_string(::getpid())) {
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  std::string operator/(const std::string& f) const { return path + "/" + f; }
};

TEST(SafetensorsCheckpoint, ShardsThroughTheIndexAndASingleFile) {
  const Array a = random_array({4, 3}, f32), b = random_array({3}, bf16),
              c = random_array({2, 2}, f16);
  TempDir dir("ckpt");
  write(dir / "model-00001-of-00002.safetensors",
        file_of({tensor_of("a", "F32", a), tensor_of("b", "BF16", b)}));
  write(dir / "model-00002-of-00002.safetensors", file_of({tensor_of("c", "F16", c)}));
  write(dir / "model.safetensors.index.json",
        R"({"metadata":{"total_size":62},"weight_map":{"c":"model-00002-of-00002.safetensors",)"
        R"("a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors"}})");
  const auto ck = safetensors::Checkpoint::open(dir.path);
  EXPECT_EQ(ck.names(), (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(ck.shard_of("c"), "model-00002-of-00002.safetensors");
  EXPECT_EQ(ck.shards().size(), 2u);
  expect_equal(ck.read("a"), {4, 3}, to_f64(a));
  expect_equal(ck.read("b"), {3}, to_f64(b));
  expect_equal(ck.read("c"), {2, 2}, to_f64(c));
  EXPECT_EQ(ck.entry("b").dtype, bf16);
  expect_error<ValueError>(
      [&] { ck.read("lm_head.weight"); },
      {"[safetensors] checkpoint", "no tensor 'lm_head.weight'", "3 tensors in 2 files"});
  // one file, no index
  TempDir one("ckpt_one");
  write(one / "model.safetensors", file_of({tensor_of("a", "F32", a)}));
  const auto single = safetensors::Checkpoint::open(one.path);
  EXPECT_EQ(single.names(), (std::vector<std::string>{"a"}));
  expect_equal(single.read("a"), {4, 3}, to_f64(a));
}

TEST(SafetensorsCheckpoint, RefusesBadIndexesAndDirectories) {
  const Array a = random_array({2}, f32);
  TempDir dir("ckpt_bad");
  write(dir / "s1.safetensors", file_of({tensor_of("a", "F32", a)}));
  auto with_index = [&](const std::string& json) {
    write(dir / "model.safetensors.index.json", json);
    return [&] { safetensors::Checkpoint::open(dir.path); };
  };
  expect_error<FormatError>(with_index(R"({"weight_map":{"a":"../s1.safetensors"}})"),
                            {"weight_map['a'] names '../s1.safetensors'", "not a file of"});
  expect_error<FormatError>(
      with_index(R"({"weight_map":{"a":"s1.safetensors","d":"s1.safetensors"}})"),
      {"places 'd' in s1.safetensors, which does not hold it"});
  expect_error<IoError>(with_index(R"({"weight_map":{"a":"s2.safetensors"}})"),
                        {"[safetensors]", "s2.safetensors"});
  expect_error<FormatError>(with_index(R"({"weight_map":["a"]})"), {"weight_map object"});
  expect_error<FormatError>(with_index("not json"), {"weight_map object"});
  expect_error<FormatError>(with_index(R"({"weight_map":{"a":7}})"), {"weight_map['a']"});
  TempDir empty("ckpt_empty");
  expect_error<IoError>([&] { safetensors::Checkpoint::open(empty.path); },
                        {"holds neither model.safetensors nor model.safetensors.index.json"});
}

}  // namespace
}  // namespace kiln
