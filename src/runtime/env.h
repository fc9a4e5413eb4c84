// Every environment variable kiln reads, in one place.
//   KILN_DEVICE   default device: cpu, cuda, cuda:N
//   KILN_LOG      log level: error (default), warn, info, debug
//   KILN_THREADS  threads of the CPU kernel pool (default: one per core)
//   KILN_TEST_SEED  tests only: replays the random inputs of an earlier test run
#pragma once

namespace kiln::env {

/// KILN_DEVICE or nullptr.
const char* device();
/// KILN_LOG or nullptr.
const char* log_level();
/// KILN_THREADS parsed, or 0.
int threads();

}  // namespace kiln::env
