// Writes packages (format: format.h).
#include <xxhash.h>

#include <bit>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <optional>

#include "backends/cpu/dnnl_util.h"
#include "core/device_backend.h"
#include "core/errors.h"
#include "core/op_registry.h"
#include "core/tuning.h"
#include "io/package/format.h"
#include "io/package/manifest_generated.h"
#include "kiln/version.h"
#include "runtime/executable_impl.h"

namespace kiln::package {

using detail::Node;

// libxxhash built with its x86 dispatcher (Debian's and Ubuntu's) exports XXH3_64bits_dispatch,
// the same hash with AVX2 / AVX-512 chosen at run time: 1.5x (weights from memory) to 2.7x (in
// cache) faster than XXH3_64bits, which is SSE2 there. A weak reference: builds against a library
// without it link, and hash with XXH3_64bits.
#if defined(__ELF__)
extern "C" XXH64_hash_t XXH3_64bits_dispatch(const void* data, size_t size) __attribute__((weak));
#endif

uint64_t xxh3(const void* data, size_t size) {
#if defined(__ELF__)
  if (XXH3_64bits_dispatch) return XXH3_64bits_dispatch(data, size);
#endif
  return XXH3_64bits(data, size);
}

namespace {
template <typename T>
void put(uint8_t* p, T v) {
  static_assert(std::endian::native == std::endian::little, "kiln packages are little endian");
  std::memcpy(p, &v, sizeof v);
}

flatbuffers::Offset<fb::Attr> write_attr(flatbuffers::FlatBufferBuilder& b, const std::string& key,
                                         const AttrValue& v) {
  auto k = b.CreateString(key);
  const auto kind = static_cast<fb::AttrKind>(v.index());
  flatbuffers::Offset<flatbuffers::Vector<int64_t>> ints;
  flatbuffers::Offset<flatbuffers::Vector<double>> floats;
  flatbuffers::Offset<flatbuffers::String> s;
  if (auto* x = std::get_if<std::vector<int64_t>>(&v)) ints = b.CreateVector(*x);
  if (auto* x = std::get_if<std::vector<double>>(&v)) floats = b.CreateVector(*x);
  if (auto* x = std::get_if<std::string>(&v)) s = b.CreateString(*x);
  fb::AttrBuilder a(b);
  a.add_key(k);
  a.add_kind(kind);
  if (auto* x = std::get_if<bool>(&v)) a.add_i(*x ? 1 : 0);
  if (auto* x = std::get_if<int64_t>(&v)) a.add_i(*x);
  if (auto* x = std::get_if<DType>(&v)) a.add_i(static_cast<int64_t>(*x));
  if (auto* x = std::get_if<double>(&v)) a.add_f(*x);
  if (!ints.IsNull()) a.add_ints(ints);
  if (!floats.IsNull()) a.add_floats(floats);
  if (!s.IsNull()) a.add_s(s);
  return a.Finish();
}
}  // namespace

void write(const detail::ExecutableImpl& x, const std::string& path,
           const PackageOptions& options) {
  const auto& nodes = x.program.graph.nodes;
  if (!options.output_names.empty() && options.output_names.size() != x.program.num_returned)
    fail<ValueError>("[package] {} output names given for {} returned values",
                     options.output_names.size(), x.program.num_returned);

  // the bodies of control-flow nodes, children before parents, each once
  std::vector<const Body*> body_order;
  std::map<const Body*, int32_t> body_index;
  std::function<void(const Node&)> collect = [&](const Node& n) {
    for (const auto& body : n.bodies) {
      if (body_index.count(body.get())) continue;
      for (const Node& m : body->graph.nodes) {
        if (m.op == OpId::Variable)
          fail<UnsupportedError>("[package] a body of node '{}' holds a variable", n.name);
        if (m.op == OpId::Constant && m.value.nbytes() > kMaxBodyConstantBytes)
          fail<UnsupportedError>(
              "[package] a body of node '{}' holds a constant of {} bytes; "
              "packages store at most {} per body constant",
              n.name, m.value.nbytes(), kMaxBodyConstantBytes);
        collect(m);
      }
      body_index[body.get()] = static_cast<int32_t>(body_order.size());
      body_order.push_back(body.get());
    }
  };
  for (const Node& n : nodes) collect(n);
  // data sections: constants and variables in program order, on the host
  struct Data {
    Array host;
    uint64_t offset = 0;
    int32_t node = -1;
  };
  std::vector<Data> data;
  std::vector<int32_t> section_of(nodes.size(), -1);
  uint64_t end = kHeaderBytes;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const Node& n = nodes[i];
    if (n.op != OpId::Constant && n.op != OpId::Variable) continue;
    Array host = n.value.device().kind == Device::Kind::cpu ? n.value : n.value.to(Device::cpu());
    const uint64_t off = (end + kSectionAlign - 1) / kSectionAlign * kSectionAlign;
    section_of[i] = static_cast<int32_t>(data.size());
    end = off + host.nbytes();
    data.push_back({std::move(host), off, static_cast<int32_t>(i)});
  }
  // the tuning section of a GPU executable: the choices its runs made so far (none measured here)
  struct TuningData {
    TuningIdentity identity;
    std::vector<uint8_t> blob;
    uint64_t offset = 0;
  };
  std::optional<TuningData> tuning;
  struct KernelData {
    KernelBinary bin;
    uint64_t offset = 0;
  };
  std::vector<KernelData> kernels;
  const bool dynamic = x.dynamic != nullptr;  // no steps: no tuning and no kernels
  if (x.backend && !dynamic) {
    std::vector<KernelCall> calls;
    for (const Step& st : x.steps) {
      if (st.backend == Backend::cpu) continue;
      const Node& n = nodes[st.node];
      KernelCall c{n.op, &n.attrs, {}, n.outputs, layout_of(n.op, n.attrs)};
      for (auto v : n.inputs) c.inputs.push_back(x.program.graph.info(v));
      calls.push_back(std::move(c));
    }
    tuning.emplace();
    tuning->identity = x.backend->tuning_identity(x.device.index);
    tuning->blob = write_tuning(x.backend->export_tuning(x.device.index, calls));
    tuning->offset = (end + kSectionAlign - 1) / kSectionAlign * kSectionAlign;
    end = tuning->offset + tuning->blob.size();
    // the binaries of the kernels kiln generated for the steps (compiled now if they were not)
    for (KernelBinary& k : x.backend->export_kernels(x.device.index, calls)) {
      const uint64_t off = (end + kSectionAlign - 1) / kSectionAlign * kSectionAlign;
      end = off + k.bytes.size();
      kernels.push_back({std::move(k), off});
    }
  }
  // the constant weights the CPU's kernels laid out in the runs so far (none laid out here)
  struct LaidOutData {
    int32_t node = -1;
    uint64_t layout = 0, offset = 0;
    const void* bytes = nullptr;
    size_t size = 0;
    std::shared_ptr<const void> keep;  // the bytes while they are written
  };
  std::vector<LaidOutData> laid_out;
  if (!dynamic && options.laid_out_weights)
    for (const Step& st : x.steps) {
      if (st.backend != Backend::cpu || !nodes[st.node].params) continue;
      KernelState* ks = nodes[st.node].params->kernel_state();
      if (!ks) continue;
      std::lock_guard<std::mutex> lock(ks->mu);
      if (ks->layout == 0 || !ks->bytes || ks->size == 0) continue;
      const uint64_t off = (end + kSectionAlign - 1) / kSectionAlign * kSectionAlign;
      end = off + ks->size;
      laid_out.push_back({st.node, ks->layout, off, ks->bytes, ks->size, ks->value});
    }
  const uint64_t manifest_offset = (end + kManifestAlign - 1) / kManifestAlign * kManifestAlign;

  flatbuffers::FlatBufferBuilder b(1 << 16);
  b.ForceDefaults(true);  // every field present: tools can patch them in place
  std::vector<fb::ValueRef> outputs;
  for (auto v : x.program.outputs) outputs.emplace_back(v.node, v.index);
  std::vector<std::string> names = options.output_names;
  if (names.empty())
    for (size_t k = 0; k < x.program.num_returned; ++k)
      names.push_back(k < x.output_names.size() ? x.output_names[k]
                                                : nodes[x.program.outputs[k].node].name);
  std::vector<fb::Section> sections;
  for (auto& d : data)
    sections.emplace_back(d.offset, d.host.nbytes(), xxh3(d.host.data(), d.host.nbytes()), d.node);
  const CompileOptions& o = x.options;
  {
    // a node; a body's constants (`in_body`) keep their bytes in it
    auto write_node = [&](const Node& n, int32_t section, bool in_body) {
      std::vector<fb::ValueRef> inputs;
      for (auto v : n.inputs) inputs.emplace_back(v.node, v.index);
      std::vector<flatbuffers::Offset<fb::Attr>> attrs;
      for (auto& [k, v] : n.attrs.items()) attrs.push_back(write_attr(b, k, v));
      std::vector<flatbuffers::Offset<fb::TensorInfo>> outs;
      for (auto& t : n.outputs)
        outs.push_back(
            fb::CreateTensorInfo(b, static_cast<uint8_t>(t.dtype), b.CreateVector(t.shape)));
      std::vector<int32_t> bodies;
      for (const auto& body : n.bodies) bodies.push_back(body_index.at(body.get()));
      std::vector<uint8_t> value;
      if (in_body && n.op == OpId::Constant) {
        const Array host = n.value.to(Device::cpu());
        const auto* p = static_cast<const uint8_t*>(host.data());
        value.assign(p, p + host.nbytes());
      }
      return fb::CreateNodeDirect(
          b, static_cast<uint16_t>(n.op), &inputs, &attrs, &outs, n.name.c_str(), n.origin, section,
          bodies.empty() ? nullptr : &bodies, value.empty() ? nullptr : &value);
    };
    std::vector<flatbuffers::Offset<fb::Body>> fbodies;
    for (const Body* body : body_order) {
      std::vector<flatbuffers::Offset<fb::Node>> bn;
      for (const Node& n : body->graph.nodes) bn.push_back(write_node(n, -1, true));
      std::vector<fb::ValueRef> results;
      for (auto v : body->results) results.emplace_back(v.node, v.index);
      fbodies.push_back(fb::CreateBodyDirect(b, &bn, &body->operands, &results));
    }
    std::vector<flatbuffers::Offset<fb::Node>> fn;
    for (size_t i = 0; i < nodes.size(); ++i)
      fn.push_back(write_node(nodes[i], section_of[i], false));
    auto fnames = b.CreateVectorOfStrings(names);
    std::vector<flatbuffers::Offset<fb::NodeSlots>> sl;
    for (auto& row : x.plan.slots) {
      std::vector<fb::Slot> r;
      for (auto& s : row)
        r.emplace_back(s.offset, s.index, s.storage, static_cast<uint8_t>(s.where));
      sl.push_back(fb::CreateNodeSlotsDirect(b, &r));
    }
    std::vector<flatbuffers::Offset<fb::Step>> st;
    for (auto& s : x.steps)
      st.push_back(fb::CreateStepDirect(b, s.node, static_cast<uint8_t>(s.backend),
                                        s.fallback_reason.c_str()));
    auto m = fb::CreateMetadataDirect(
        b, options.producer.c_str(), version(), options.source_hash.c_str(),
        static_cast<uint8_t>(x.device.kind), x.device.index, o.optimize, o.plan_memory, o.in_place,
        o.num_threads, o.autocast ? static_cast<uint8_t>(*o.autocast) : kNoAutocast,
        o.strict_placement, dynamic, o.max_specializations, o.max_specialization_bytes);
    std::vector<flatbuffers::Offset<fb::Tuning>> tu;
    if (tuning)
      tu.push_back(fb::CreateTuningDirect(
          b, static_cast<uint8_t>(Backend::cuda), tuning->identity.device.c_str(),
          tuning->identity.arch.c_str(), tuning->identity.library.c_str(), tuning->offset,
          tuning->blob.size(), xxh3(tuning->blob.data(), tuning->blob.size())));
    std::vector<flatbuffers::Offset<fb::Kernel>> ke;
    for (const KernelData& k : kernels)
      ke.push_back(fb::CreateKernelDirect(b, static_cast<uint8_t>(Backend::cuda),
                                          k.bin.arch.c_str(), k.bin.key, k.offset,
                                          k.bin.bytes.size(),
                                          xxh3(k.bin.bytes.data(), k.bin.bytes.size())));
    std::vector<flatbuffers::Offset<fb::LaidOut>> lo;
    for (const LaidOutData& w : laid_out)
      lo.push_back(fb::CreateLaidOutDirect(b, w.node, cpu::dnnl_util::layout_identity().c_str(),
                                           w.layout, w.offset, w.size, xxh3(w.bytes, w.size)));
    auto root = fb::CreateManifest(
        b, m, b.CreateVector(fn), b.CreateVectorOfStructs(outputs),
        static_cast<uint32_t>(x.program.num_returned), fnames, b.CreateVector(sl),
        x.plan.arena_bytes, x.plan.num_buffers, b.CreateVector(st), b.CreateVector(x.placeholders),
        b.CreateVector(x.variables), b.CreateVectorOfStructs(sections), b.CreateVector(tu),
        b.CreateVector(ke), b.CreateVector(fbodies), b.CreateVector(lo));
    fb::FinishManifestBuffer(b, root);
  }
  const uint8_t* mbytes = b.GetBufferPointer();
  const uint64_t msize = b.GetSize();

  uint8_t head[kHeaderBytes] = {};
  std::memcpy(head + header::magic, kMagic, 8);
  put<uint32_t>(head + header::format_version, kFormatVersion);
  put<uint32_t>(head + header::min_reader_version, !body_order.empty() ? 3 : dynamic ? 2 : 1);
  put<uint64_t>(head + header::file_size, manifest_offset + msize);
  put<uint64_t>(head + header::manifest_offset, manifest_offset);
  put<uint64_t>(head + header::manifest_size, msize);
  put<uint64_t>(head + header::manifest_xxh3, xxh3(mbytes, msize));
  put<uint64_t>(head + header::header_xxh3, xxh3(head, header::header_xxh3));

  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) fail<IoError>("[package] cannot open '{}' for writing", tmp);
    uint64_t pos = 0;
    static const char zeros[kSectionAlign] = {};
    auto write_at = [&](uint64_t off, const void* p, uint64_t n) {
      f.write(zeros, static_cast<std::streamsize>(off - pos));
      f.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
      pos = off + n;
    };
    write_at(0, head, kHeaderBytes);
    for (auto& d : data) write_at(d.offset, d.host.data(), d.host.nbytes());
    if (tuning) write_at(tuning->offset, tuning->blob.data(), tuning->blob.size());
    for (const KernelData& k : kernels) write_at(k.offset, k.bin.bytes.data(), k.bin.bytes.size());
    for (const LaidOutData& w : laid_out) write_at(w.offset, w.bytes, w.size);
    write_at(manifest_offset, mbytes, msize);
    f.close();
    if (!f) {
      std::remove(tmp.c_str());
      fail<IoError>("[package] writing '{}' failed", tmp);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::remove(tmp.c_str());
    fail<IoError>("[package] cannot rename '{}' to '{}'", tmp, path);
  }
}

}  // namespace kiln::package
