# The libFuzzer target over the package loader; included by tests/fuzz/CMakeLists.txt (KILN_FUZZ=ON,
# clang), which instruments libkiln with -fsanitize=fuzzer-no-link.
add_executable(fuzz_package_load ${CMAKE_CURRENT_LIST_DIR}/fuzz_package_load.cpp)
target_link_libraries(fuzz_package_load PRIVATE kiln)
# the format's constants and checksum (src/io/package/format.h)
target_include_directories(fuzz_package_load PRIVATE ${PROJECT_SOURCE_DIR}/src)
target_compile_options(fuzz_package_load PRIVATE -fsanitize=fuzzer)
target_link_options(fuzz_package_load PRIVATE -fsanitize=fuzzer)

# Label fuzz: the seeds once, and 60 s of fuzzing (what CI runs). New inputs go to the build
# tree's corpus, never to the seeds in the source tree.
file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/package_corpus)
add_test(NAME Fuzz.PackageLoadSeeds
  COMMAND fuzz_package_load -runs=0 ${CMAKE_CURRENT_BINARY_DIR}/package_corpus
          ${CMAKE_CURRENT_LIST_DIR}/package_corpus)
add_test(NAME Fuzz.PackageLoad60s
  COMMAND fuzz_package_load -max_total_time=60 -max_len=65536 -rss_limit_mb=4096
          -artifact_prefix=${CMAKE_CURRENT_BINARY_DIR}/package- ${CMAKE_CURRENT_BINARY_DIR}/package_corpus
          ${CMAKE_CURRENT_LIST_DIR}/package_corpus)
set_tests_properties(Fuzz.PackageLoadSeeds Fuzz.PackageLoad60s PROPERTIES LABELS fuzz TIMEOUT 300)
