// kiln packages (.kiln): a compiled Executable, saved so that loading skips compilation.
//
// FORMAT, version 6. Every integer is little endian.
//
//   offset 0     header, 64 bytes
//   offset 64    data sections, each at an offset that is a multiple of 64
//   ...          tuning sections (GPU packages), at a multiple of 64
//   ...          kernel sections (GPU packages with generated kernels), at a multiple of 64
//   ...          laid-out weight sections (CPU packages whose runs laid weights out), at a
//                multiple of 64
//   ...          the manifest (FlatBuffers, schema src/io/package/manifest.fbs), at a multiple of 8
//   file_size    end of file
//
// Header:
//   0   u8[8]  magic "KILNPKG\0"
//   8   u32    format_version       the version that wrote the file (6)
//   12  u32    min_reader_version   the oldest reader version that can read it (1; 2 for
//                                    dynamic packages; 3 with control-flow bodies)
//   16  u64    file_size            bytes of the whole file
//   24  u64    manifest_offset
//   32  u64    manifest_size
//   40  u64    manifest_xxh3        XXH3-64 (seed 0) of the manifest bytes
//   48  u64    header_xxh3          XXH3-64 (seed 0) of header bytes [0, 48)
//   56  u64    reserved, 0
//
// Data sections hold the raw bytes (C order, the dtype's little-endian encoding) of each
// constant and each variable of the program, one section per node. Manifest.sections lists them:
// offset, size, XXH3-64 of the bytes, and the node they belong to. Sections are numbered by their
// position in that list.
//
// The manifest (root table Manifest, file identifier "KLNM") holds:
//   metadata      producer, kiln version, source-model hash, the device kind and index the
//                 package was compiled for, and the CompileOptions used
//   nodes         the optimized program in topological order: stable op id (op_list.inc), inputs
//                 (node, output index) of earlier nodes, attributes (every AttrValue kind), output
//                 dtypes and shapes, name, origin, and the data section of constants and variables
//   outputs       the values the program produces; the first num_returned are returned by runs
//                 (output_names names them), the rest are updates run for their effect
//   slots         the memory plan: one slot per node output (where: none, feed, constant, arena,
//                 output; arena byte offset; index; buffer group), arena_bytes, num_buffers
//   steps         the schedule: node and backend of every kernel, and why a step of a GPU
//                 executable falls back to the CPU. Kernels are code, not data: the reader looks
//                 them up again by (op, backend, dtype).
//   placeholders, variables   program node ids, in program order (for tools; the reader
//                 derives both from the nodes)
//   tuning        (version 2) per backend, at most one each: the backend, the identity its
//                 decisions hold for (device name, architecture "sm_90", library "cudnn 90100"),
//                 and the offset, size (at most 16 MiB) and XXH3-64 of its tuning section
//   kernels       (version 3) the binaries of the kernels kiln generated for the steps
//                 (fused_elementwise on CUDA): backend, architecture ("sm_90"), key (XXH3-64 of
//                 the generated source and architecture), and the offset, size (1 byte to 64 MiB)
//                 and XXH3-64 of the binary's section
//   laid_out      (version 6) the constant weights the CPU's kernels laid out for their
//                 library's primitives: the node, the identity they hold for (library version
//                 and instruction set, "onednn 2.6.3 avx512_core_bf16"), the layout's key, and
//                 the offset, size and XXH3-64 of the section
//
// DYNAMIC (version 4). A dynamic executable (placeholder dims left -1; docs/dynamic-shapes.md)
// is saved as its program before any pass, with metadata.dynamic true and its cache bounds
// (max_specializations, max_specialization_bytes): output shapes hold -1 for dynamic dims, the
// placeholders keep their dim names and ranges (attributes dim_names, dim_min, dim_max), and
// slots, steps, tuning and kernels are empty. The reader checks the program as below (-1 dims
// allowed, except in constants and variables, and dim names and ranges one per dim, each range
// non-empty), and the loaded executable compiles a specialization per feed shape on its runs.
// Such files have min_reader_version 2.
//
// BODIES (version 5). The subgraphs of control-flow nodes (cond's branches, a loop's condition
// and body: src/ops/control.cpp) are Manifest.bodies, each a table of its own nodes (as program
// nodes, in topological order), its operands (per operand of its node, the body node that is
// its placeholder, or -1) and its results. A node lists its bodies by index into that table
// (Node.bodies); a body's nodes list only bodies of smaller index (children before parents, no
// cycles), each body belongs to one node, and bodies nest at most 16 deep. A body's constants hold
// their bytes in the node (Node.value, at most 1 MiB each) rather than in data sections; bodies
// hold no variables. The reader checks every body node as it checks program nodes (each control
// node's inference infers its bodies again, so results of the wrong dtype or shape are refused),
// and that only control-flow ops have bodies, as many as their op takes. Files with bodies have
// min_reader_version 3.
//
// TUNING. A tuning section is a blob (src/core/tuning.h) of the decisions a backend made for the
// executable's steps: for CUDA, the cuDNN algorithm, math type and workspace of each convolution
// problem (src/backends/cuda/tuning.h), which the backend otherwise measures on the first run.
// Saving measures nothing: it stores the decisions of the runs made before it (none when the
// executable never ran; the section is then empty and the loaded executable measures on its
// first run, as a compiled one does).
//
// KERNELS. A kernel section holds a cubin NVRTC built from source kiln generated for a step. A
// reader on a device of the same architecture loads it instead of compiling the source on the
// first run; a key no step asks for is never loaded, a binary of another architecture is
// skipped (the step compiles its source), and a binary the driver rejects is compiled afresh.
// Saving compiles the kernels of steps that never ran.
//
// LAID OUT. A laid-out weight section holds a constant weight (of a conv, fused_conv, matmul,
// linear or fused_matmul node run by the CPU) in the blocked layout its oneDNN primitive chose,
// as the node's kernel converted it on its first run. A CPU reader of the same identity gives it
// to the node: its first run takes these bytes, where it finds the primitive asking for a layout
// of the same key and size, instead of converting the weight again (a view of the bytes read from
// the file, as constants are). Another identity: the section is not used (a message with
// KILN_LOG=info), and the first run converts the weight as a compiled executable does. Other
// devices only check the section. Only a save with PackageOptions::laid_out_weights writes them
// (kiln convert --warm-up): it converts nothing itself but stores the weights the runs before it
// laid out (none when the executable never ran). They halve a first run (ResNet-50 on two Zen 5
// threads: 59 -> 30 ms) and double the file, whose load takes about as long as they save.
//
// READING a file that may come from anyone. The reader
//   1. checks the magic, then min_reader_version against its own version (kReaderVersion),
//      then header_xxh3, the reserved bytes, file_size against the real size, and that the
//      manifest lies inside the file at a multiple of 8;
//   2. always checks manifest_xxh3, then runs the FlatBuffers verifier over the manifest;
//   3. checks every section with overflow-safe arithmetic: inside the file, 64-byte aligned,
//      its size equal to the bytes of its node's dtype and shape; and its XXH3 unless
//      LoadOptions::verify_weights is false; every tuning section likewise, always with its
//      XXH3, and parses its blob with every count bounded by the bytes there are; every kernel
//      section likewise, always with its XXH3 (the driver gets only checked bytes); every
//      laid-out weight section likewise, always with its XXH3, at most one per node, each of a
//      node whose op lays out a weight;
//   4. checks the program before anything uses it: known op ids and dtypes, shapes with
//      non-negative dims and sizes that fit in 64 bits, the number of inputs each op takes, every
//      input naming an output of an earlier node, every output dtype and shape equal to what the
//      op's inference gives for its inputs and attributes, assigns writing only to variables;
//   5. checks the plan and schedule against the program: one slot per node output; every value a
//      step reads or writes, and every returned value, has a slot whose arena range lies inside
//      the arena, whose feed or constant index names a placeholder or a constant/variable at
//      least as large, whose output index names a returned value of the same dtype and shape; a
//      step writes to a feed or constant only as a view of its input; steps are exactly the
//      executed nodes in order, each with a kernel for its dtype on its backend.
// Every failure is a kiln::FormatError "[package] <file>: <section> at offset <n>: <what>".
//
// On a device of a tuning section's backend whose identity equals the stored one, the records
// are checked like the backend's own choices (a CUDA record's algorithm within cuDNN's enum, the
// precision rules of its dtype: a FormatError naming the record otherwise) and seed the
// backend's choices, so the first run measures nothing. Another identity (other GPU,
// architecture or library version) or blob version: the section is not used (a warning with
// KILN_LOG=warn or more; LoadOptions::strict makes it an UnsupportedError). Other devices only
// check the section.
//
// DEVICES. A package compiled for one kind of device (CPU, CUDA) and loaded for another is
// placed and memory-planned again from its stored program (a warning with KILN_LOG=warn or more;
// LoadOptions::strict makes it an UnsupportedError). On the CPU, constants are views of the bytes
// read from the file; on a GPU they are copied to the device. Variables are always copied: a
// loaded executable owns them and updates them in its runs.
//
// FILES. Executable::load reads the whole file into memory (pread, in parallel chunks) and never
// maps it: a CPU executable reads its constants at every run, and no check made at load time could
// keep a mapped file that another process truncates later from killing the process with SIGBUS.
// So a package truncated, rewritten or deleted while it is being loaded gives an IoError (the
// file ended early) or a FormatError (its checksums or checks fail), and once loaded, an
// executable never reads the file again: changing or removing it cannot affect its runs. The
// price is memory: the bytes of a loaded CPU package stay in the process (as they would in a
// mapping's page cache); a GPU load drops them once its constants are on the device.
//
// VERSIONS. A reader reads every file whose min_reader_version is at most kReaderVersion.
// Writers raise format_version for additions older readers may ignore (new manifest fields), and
// min_reader_version only for changes they cannot. Version 2 added the tuning sections and
// version 3 the kernel sections (older readers skip them; their steps compile their source); the
// files have min_reader_version 1. Version 4 added dynamic packages, which older readers cannot
// run: those have min_reader_version 2, static ones still 1. Version 5 added bodies: files with
// any have min_reader_version 3. Version 6 added laid-out weights (older readers skip them; the
// first run lays the weights out). A node of an op that a reader does
// not know fails there ("unknown op id"); a reader reads the older forms of today's ops (a conv
// with a fused relu or residual, fused_conv since) as those ops.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kiln/executable.h"

namespace kiln::package {

inline constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'P', 'K', 'G', '\0'};
inline constexpr uint32_t kFormatVersion = 6;
inline constexpr uint32_t kReaderVersion = 3;  // the newest min_reader_version this reader reads
inline constexpr int kMaxBodyDepth = 16;
inline constexpr size_t kMaxBodyConstantBytes = size_t{1} << 20;
inline constexpr size_t kHeaderBytes = 64;
inline constexpr size_t kSectionAlign = 64;
inline constexpr size_t kManifestAlign = 8;
inline constexpr uint8_t kNoAutocast = 255;

/// Byte offsets of the header fields.
namespace header {
inline constexpr size_t magic = 0, format_version = 8, min_reader_version = 12, file_size = 16,
                        manifest_offset = 24, manifest_size = 32, manifest_xxh3 = 40,
                        header_xxh3 = 48, reserved = 56;
}

/// Read-only bytes of a package: a file read into memory, or a copy of bytes in memory.
struct Bytes {
  const uint8_t* data = nullptr;
  size_t size = 0;
  std::shared_ptr<void> owner;  // keeps `data` alive
  std::string what;             // the file name (or "<memory>") for messages
};

/// Reads a whole regular file into 64-byte aligned memory (never a mapping: FILES above). Throws
/// IoError when it cannot be opened or read, or ends before the size it had when opened.
Bytes read_file(const std::string& path);
/// Copies `size` bytes into 64-byte aligned memory.
Bytes copy_bytes(const void* data, size_t size);

/// Writes `impl` as a package to `path` (through a temporary file renamed into place).
void write(const detail::ExecutableImpl& impl, const std::string& path,
           const PackageOptions& options);
/// Checks and loads a package for `device`.
std::shared_ptr<detail::ExecutableImpl> read(const Bytes& bytes, Device device,
                                             const LoadOptions& options);

/// XXH3-64 with seed 0.
uint64_t xxh3(const void* data, size_t size);

}  // namespace kiln::package
