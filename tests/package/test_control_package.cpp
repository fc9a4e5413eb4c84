// Packages of executables with control-flow nodes: their bodies stored in the manifest (format.h,
// BODIES), loaded and run again, static and dynamic; and the reader's checks of bodies.
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "kiln/ops/control.h"
#include "package/package_bytes.h"
#include "support/reference.h"

namespace kiln {
namespace {
using namespace kiln::test;

Executable load(const Bytes& b) {
  return Executable::load_bytes(b.data(), b.size(), default_device(), {});
}

Tensor lt(const Tensor& a, double b) { return less(a, scalar_like(a, b)); }

// A cond, a for_loop with a while_loop inside it (bodies in bodies, constants in bodies) and a
// value captured two levels down.
struct LoopModel {
  Graph g;
  Tensor x, w, pred, y, z;
  explicit LoopModel(const Shape& xs) {
    x = g.placeholder(xs, f32, "x");
    w = g.placeholder({4}, f32, "w");
    pred = g.placeholder({}, boolean, "pred");
    y = cond(
        pred, {x},
        [&](const std::vector<Tensor>& a) { return std::vector<Tensor>{tanh(a[0] * w)}; },
        [](const std::vector<Tensor>& a) { return std::vector<Tensor>{a[0] - 0.5}; })[0];
    z = for_loop(3, {y}, [&](const std::vector<Tensor>& v) {
      return while_loop(
          {v[1]},
          [](const std::vector<Tensor>& u) { return std::vector<Tensor>{lt(sum(u[0]), 5)}; },
          [&](const std::vector<Tensor>& u) { return std::vector<Tensor>{u[0] + abs(w) + 0.25}; },
          {.max_trip_count = 100});
    })[0];
  }
};

TEST(ControlPackage, RoundTripsBodiesAndRunsTheSame) {
  LoopModel m({3, 4});
  auto exe = m.g.compile(default_device(), {}, {m.y, m.z});
  const Bytes bytes = saved_bytes(exe, "control");
  EXPECT_EQ(get<uint32_t>(bytes, package::header::min_reader_version), 3u);
  auto loaded = load(bytes);
  for (bool taken : {true, false}) {
    const Array xv = random_array({3, 4}, f32), wv = random_array({4}, f32);
    const Array pv = Array::scalar(taken);
    const auto want = exe.run({{m.x, xv}, {m.w, wv}, {m.pred, pv}});
    const auto got = loaded.run(std::map<std::string, Array>{{"x", xv}, {"w", wv}, {"pred", pv}});
    for (size_t k = 0; k < want.size(); ++k)
      expect_equal(got[k].to(Device::cpu()), {3, 4}, to_f64(want[k].to(Device::cpu())));
  }
}

TEST(ControlPackage, DynamicExecutableWithBodiesRoundTrips) {
  LoopModel m({-1, 4});
  auto exe = m.g.compile(default_device(), {}, {m.z});
  ASSERT_TRUE(exe.is_dynamic());
  auto loaded = load(saved_bytes(exe, "control_dynamic"));
  ASSERT_TRUE(loaded.is_dynamic());
  for (int64_t rows : {int64_t{2}, int64_t{5}}) {
    const Array xv = random_array({rows, 4}, f32), wv = random_array({4}, f32);
    const Array pv = Array::scalar(rows == 2);
    const Array got =
        loaded.run(std::map<std::string, Array>{{"x", xv}, {"w", wv}, {"pred", pv}})[0];
    expect_equal(got.to(Device::cpu()), {rows, 4},
                 to_f64(exe.run({{m.x, xv}, {m.w, wv}, {m.pred, pv}})[0].to(Device::cpu())));
  }
}

// The first node of the program that `pick` accepts (nullptr: none).
package::fb::Node* program_node(package::fb::Manifest& man,
                                const std::function<bool(const package::fb::Node&)>& pick) {
  auto* nodes = man.mutable_nodes();
  for (uint32_t i = 0; i < nodes->size(); ++i)
    if (pick(*nodes->Get(i))) return nodes->GetMutableObject(i);
  return nullptr;
}
// The first node of a body that `pick` accepts, and the body's index.
std::pair<package::fb::Node*, uint32_t> body_node(
    package::fb::Manifest& man, const std::function<bool(const package::fb::Node&)>& pick) {
  auto* bodies = man.mutable_bodies();
  for (uint32_t k = 0; k < bodies->size(); ++k) {
    auto* nodes = bodies->GetMutableObject(k)->mutable_nodes();
    for (uint32_t i = 0; i < nodes->size(); ++i)
      if (pick(*nodes->Get(i))) return {nodes->GetMutableObject(i), k};
  }
  return {nullptr, 0};
}

// Bodies edited in place (the manifest is a mutable FlatBuffer; checksums recomputed): each edit
// is refused with a FormatError naming the body and what is wrong.
TEST(ControlPackage, ReaderRefusesMalformedBodies) {
  LoopModel m({3, 4});
  auto exe = m.g.compile(Device::cpu(), {}, {m.z});
  const Bytes good = saved_bytes(exe, "control_bad");
  ASSERT_NO_THROW(load(good));
  auto edit = [&](const std::function<bool(package::fb::Manifest&)>& f,
                  const std::vector<std::string>& parts) {
    Bytes b = good;
    ASSERT_TRUE(f(*manifest(b)));
    fix_checksums(b);
    expect_error<FormatError>([&] { load(b); }, parts);
  };
  using Pick = std::function<bool(const package::fb::Node&)>;
  auto has_bodies = [](size_t n) {
    return [n](const package::fb::Node& f) { return f.bodies() && f.bodies()->size() == n; };
  };
  // a body that names itself as its child
  edit(
      [&](package::fb::Manifest& man) {
        auto [n, k] = body_node(man, has_bodies(2));
        if (n) n->mutable_bodies()->Mutate(0, static_cast<int32_t>(k));
        return n != nullptr;
      },
      {"[package]", "manifest body", "is not a body read before it"});
  // a program node naming a body past the table
  edit(
      [&](package::fb::Manifest& man) {
        auto* n = program_node(man, has_bodies(1));
        if (n) n->mutable_bodies()->Mutate(0, 1000);
        return n != nullptr;
      },
      {"[package]", "manifest node", "body 1000 is not a body read before it"});
  // a program node (the cond) taking one body twice
  edit(
      [&](package::fb::Manifest& man) {
        auto* n = program_node(man, has_bodies(2));
        if (n) n->mutable_bodies()->Mutate(1, n->bodies()->Get(0));
        return n != nullptr;
      },
      {"[package]", "manifest node", "belongs to another node"});
  // an operand bound to a node that is not a placeholder
  edit(
      [](package::fb::Manifest& man) {
        auto* body = man.mutable_bodies()->GetMutableObject(0);
        for (uint32_t k = 0; k < body->operands()->size(); ++k)
          if (body->operands()->Get(k) >= 0) {
            body->mutable_operands()->Mutate(k, static_cast<int32_t>(body->nodes()->size() - 1));
            return true;
          }
        return false;
      },
      {"[package]", "manifest body 0", "is not a placeholder of the body"});
  // a result past the body's nodes
  edit(
      [](package::fb::Manifest& man) {
        auto* r = man.mutable_bodies()->GetMutableObject(0)->mutable_results()->GetMutableObject(0);
        r->mutate_node(100000);
        return true;
      },
      {"[package]", "manifest body 0", "is not a value of the body"});
  // a 4-byte f32 body constant declared f64 (8 bytes)
  edit(
      [&](package::fb::Manifest& man) {
        auto [n, k] = body_node(man, Pick([](const package::fb::Node& f) {
                                  return f.value() && f.value()->size() == 4;
                                }));
        if (n) n->mutable_outputs()->GetMutableObject(0)->mutate_dtype(static_cast<uint8_t>(f64));
        return n != nullptr;
      },
      {"[package]", "manifest body", "a body constant of f64"});
}

}  // namespace
}  // namespace kiln
