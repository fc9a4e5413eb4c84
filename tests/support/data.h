// The directory of the test data (tests/data): KILN_TEST_DATA_DIR in the environment wins over the
// path compiled in, so that suites run from a build copied elsewhere (the GPU bundle) find it.
#pragma once

#include <cstdlib>
#include <string>

namespace kiln::test {

inline std::string test_data_dir(const char* compiled) {
  const char* env = std::getenv("KILN_TEST_DATA_DIR");
  return env && *env ? std::string(env) : std::string(compiled);
}

}  // namespace kiln::test
