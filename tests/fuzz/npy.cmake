# The libFuzzer target over the .npy reader; included by tests/fuzz/CMakeLists.txt (KILN_FUZZ=ON,
# clang), which instruments libkiln with -fsanitize=fuzzer-no-link.
add_executable(fuzz_npy_read ${CMAKE_CURRENT_LIST_DIR}/fuzz_npy_read.cpp)
target_link_libraries(fuzz_npy_read PRIVATE kiln)
target_include_directories(fuzz_npy_read PRIVATE ${PROJECT_SOURCE_DIR}/src)  # io/npy/npy.h
target_compile_options(fuzz_npy_read PRIVATE -fsanitize=fuzzer)
target_link_options(fuzz_npy_read PRIVATE -fsanitize=fuzzer)

# Label fuzz: the seeds once, and 60 s of fuzzing (what CI runs). New inputs go to the build
# tree's corpus, never to the seeds in the source tree.
file(MAKE_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR}/npy_corpus)
add_test(NAME Fuzz.NpyReadSeeds
  COMMAND fuzz_npy_read -runs=0 ${CMAKE_CURRENT_BINARY_DIR}/npy_corpus
          ${CMAKE_CURRENT_LIST_DIR}/npy_corpus)
add_test(NAME Fuzz.NpyRead60s
  COMMAND fuzz_npy_read -max_total_time=60 -max_len=65536 -rss_limit_mb=4096
          -artifact_prefix=${CMAKE_CURRENT_BINARY_DIR}/npy- ${CMAKE_CURRENT_BINARY_DIR}/npy_corpus
          ${CMAKE_CURRENT_LIST_DIR}/npy_corpus)
set_tests_properties(Fuzz.NpyReadSeeds Fuzz.NpyRead60s PROPERTIES LABELS fuzz TIMEOUT 300)
