// An op's attributes decoded once into the struct its kernels read, instead of looked up by name
// at every launch. An op declares its struct with OpDef::params<P>(): P derives from OpParams and
// has `static P decode(OpId, const Attrs&)`, which throws ValueError for attributes it cannot
// take. Nodes are decoded when built (to validate them) and when an executable is made from its
// program (compile and package load: Node::params); kernels read params_of<P>(ctx).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <typeinfo>

#include "kiln/error.h"
#include "kiln/kernel.h"

namespace kiln {

/// What a kernel keeps with its node between runs (the CPU's constant weights in oneDNN's layout,
/// made from the weight buffer `key`), made and read under `mu`. A params struct holds it by
/// shared_ptr, made by its decode: copies of the node's params share it, and it lives as long as
/// they do (the executable).
struct KernelState {
  std::mutex mu;
  const void* key = nullptr;
  std::shared_ptr<const void> value;
  /// What packages store of `value` (docs/package-format.md, LAID OUT): the key of its layout
  /// (0: nothing to store), its bytes and their size.
  uint64_t layout = 0;
  const void* bytes = nullptr;
  size_t size = 0;
  /// Laid-out bytes a package held for the node (its reader puts them here): taken instead of
  /// laying the weight out again where the kernel asks for the same layout key and size.
  uint64_t stored_layout = 0;
  std::shared_ptr<const void> stored;
  size_t stored_size = 0;
};

struct OpParams {
  virtual ~OpParams() = default;
  /// The state its kernels keep with the node (the CPU's laid-out constant weight), if any.
  virtual KernelState* kernel_state() const { return nullptr; }
};

/// The node's params as P (the struct its op declares, or a base of it). A kernel that reads
/// a struct its node's op does not declare (a kernel called with another op's context) is a kiln
/// bug, caught here: a type_info comparison, a pointer compare when the types are the same.
template <class P> const P& params_as(const OpParams& p) {
  KILN_ASSERT(typeid(p) == typeid(P) || dynamic_cast<const P*>(&p) != nullptr);
  return static_cast<const P&>(p);
}

/// The decoded attributes of the kernel's node, or, where the runtime has none to give (a context
/// a kernel made with other attributes, constant folding), the same decoded from ctx.attrs().
template <class P> P params_of(const KernelContext& ctx) {
  if (const OpParams* p = ctx.params()) return params_as<P>(*p);
  return P::decode(ctx.op(), ctx.attrs());
}
/// The same without a copy: the node's decoded struct, or `spare` decoded from ctx.attrs().
template <class P> const P& params_of(const KernelContext& ctx, P& spare) {
  if (const OpParams* p = ctx.params()) return params_as<P>(*p);
  return spare = P::decode(ctx.op(), ctx.attrs());
}

}  // namespace kiln
