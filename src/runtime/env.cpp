#include "runtime/env.h"

#include <cstdlib>
#include <string>

namespace kiln::env {

namespace {
const char* get(const char* k) {
  const char* v = std::getenv(k);
  return (v && *v) ? v : nullptr;
}
}  // namespace

const char* device() { return get("KILN_DEVICE"); }
const char* log_level() { return get("KILN_LOG"); }
int threads() {
  const char* v = get("KILN_THREADS");
  return v ? std::atoi(v) : 0;
}

bool validate_on_cpu() {
  static const bool on = [] {
    const char* v = get("KILN_VALIDATE");
    return v && std::string(v) == "cpu";
  }();
  return on;
}

bool step_times() {
  static const bool on = get("KILN_STEP_TIMES") != nullptr;
  return on;
}

bool step_times_device() {
  static const bool on = [] {
    const char* v = get("KILN_STEP_TIMES");
    return v && std::string(v) == "device";
  }();
  return on;
}

bool fusion_enabled() {
  static const bool on = [] {
    const char* v = get("KILN_FUSION");
    return !(v && std::string(v) == "0");
  }();
  return on;
}

bool channels_last() {
  const char* v = get("KILN_CHANNELS_LAST");
  return !(v && std::string(v) == "0");
}

bool cudnn_graph() {
  const char* v = get("KILN_CUDNN_GRAPH");
  return !(v && std::string(v) == "0");
}

bool cudnn_runtime_fusion() {
  const char* v = get("KILN_CUDNN_RUNTIME_FUSION");
  return v && std::string(v) == "1";
}

bool rnn_persistent(bool backward) {
  const char* v = get("KILN_RNN_PERSISTENT");
  const std::string s = v ? v : "forward";
  if (s == "forward") return !backward;
  if (s == "backward") return backward;
  return s == "1";
}

bool deterministic() {
  const char* v = get("KILN_DETERMINISTIC");
  return v && std::string(v) == "1";
}

int capture() {
  const char* v = get("KILN_CAPTURE");
  if (!v) return -1;
  return std::string(v) == "0" ? 0 : 1;
}

}  // namespace kiln::env
