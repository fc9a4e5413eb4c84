#include "runtime/env.h"

#include <cstdlib>
#include <string>

#include "runtime/log.h"

namespace kiln::env {

namespace {
bool is(Var v, const char* value) {
  const char* s = get(v);
  return s && std::string(s) == value;
}
}  // namespace

const char* name(Var v) {
  static const char* const names[] = {
#define KILN_ENV_VAR(n, doc) #n,
#include "runtime/env_vars.inc"
#undef KILN_ENV_VAR
  };
  return names[static_cast<int>(v)];
}

const char* get(Var v) {
  const char* s = std::getenv(name(v));
  return (s && *s) ? s : nullptr;
}

const char* device() { return get(Var::KILN_DEVICE); }
const char* log_level() { return get(Var::KILN_LOG); }
int threads() {
  const char* v = get(Var::KILN_THREADS);
  return v ? std::atoi(v) : 0;
}

bool validate_on_cpu() {
  static const bool on = is(Var::KILN_VALIDATE, "cpu");
  return on;
}

bool step_times() {
  static const bool on = get(Var::KILN_STEP_TIMES) != nullptr;
  return on;
}

bool step_times_device() {
  static const bool on = is(Var::KILN_STEP_TIMES, "device");
  return on;
}

bool fusion_enabled() {
  static const bool on = !is(Var::KILN_FUSION, "0");
  return on;
}

bool cudnn_runtime_fusion() { return is(Var::KILN_CUDNN_RUNTIME_FUSION, "1"); }

bool gemm_borrow() { return !is(Var::KILN_GEMM_BORROW, "0"); }
bool fuse_groups() { return !is(Var::KILN_FUSE_GROUPS, "0"); }

bool deterministic() { return is(Var::KILN_DETERMINISTIC, "1"); }

bool conditional_nodes() { return !is(Var::KILN_CONDITIONAL_NODES, "0"); }

int loop_unroll() {
  const char* v = get(Var::KILN_LOOP_UNROLL);
  return v ? std::atoi(v) : 0;
}

int capture() {
  if (!get(Var::KILN_CAPTURE)) return -1;
  return is(Var::KILN_CAPTURE, "0") ? 0 : 1;
}

void override_kernel_choices(KernelChoices& c) {
  // "0" turns a choice off, anything else on
  auto flag = [](Var v, bool& field) {
    if (const char* s = get(v)) field = std::string(s) != "0";
  };
  flag(Var::KILN_CHANNELS_LAST, c.channels_last);
  flag(Var::KILN_CUDNN_GRAPH, c.cudnn_graph);
  flag(Var::KILN_QCONV_IGEMM, c.qconv_implicit_gemm);
  flag(Var::KILN_ATTENTION_F32_TILES, c.attention_f32_tiles);
  if (const char* s = get(Var::KILN_PDL)) c.programmatic_launch = std::string(s) == "1";
  if (const char* s = get(Var::KILN_RNN_PERSISTENT)) {
    const std::string p = s;
    c.rnn_persistent_forward = p == "forward" || p == "1";
    c.rnn_persistent_backward = p == "backward" || p == "1";
  }
}

}  // namespace kiln::env

namespace kiln::log {

Level level() {
  const char* v = env::log_level();
  if (!v) return Level::error;
  const std::string s = v;
  if (s == "warn" || s == "warning") return Level::warn;
  if (s == "info") return Level::info;
  if (s == "debug") return Level::debug;
  return Level::error;
}

}  // namespace kiln::log
