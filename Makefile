# kiln: `make demo` builds and runs the main job; `make test` builds and runs every test.
# Both install what is missing first (scripts/setup.sh).

BUILD       ?= build
# one sanitizer build (clang-14, ASan+UBSan) serves `make test-asan` and `make fuzz`
SAN_BUILD   ?= build-san
TSAN_BUILD  ?= build-tsan
FUZZ_SECONDS ?= 60
CMAKE_FLAGS ?=
JOBS        ?= $(shell nproc)
export CCACHE_BASEDIR := $(CURDIR)

.PHONY: all setup configure build data demo test test-release san-configure test-asan test-tsan test-gpu gpu-bundle wheel check bench docs format clean fuzz

all: build

setup:
	@scripts/setup.sh

configure: setup
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null

build: configure
	@cmake --build $(BUILD) -j $(JOBS)

# The digits dataset that scikit-learn ships, as .npy files for the demo.
data: setup
	@.venv/bin/python scripts/digits.py $(BUILD)/data

demo: build data
	$(BUILD)/kiln demo --data $(BUILD)/data --checkpoint $(BUILD)/demo.ckpt --trace $(BUILD)/demo-trace.json

# Everything: the release build's tests (C++ and Python), the C++ suite under ASan+UBSan, the
# queue and event tests under ThreadSanitizer, and a minute each (FUZZ_SECONDS) of fuzzing the
# ONNX importer, the package loader, the .npy reader, the safetensors reader, the tokenizer.json
# reader and the Core ML importer (`make fuzz`).
test: test-release test-asan test-tsan fuzz

test-release: build data
	@python3 scripts/check_env_vars.py
	@python3 scripts/check_file_sizes.py
	@python3 scripts/op_docs.py --check
	@scripts/check_format.sh
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)
	@if ls tests/python/test_*.py >/dev/null 2>&1; then \
	  KILN_BUILD_DIR=$(abspath $(BUILD)) .venv/bin/python -m pytest -q tests/python; fi
	@if [ -d $(BUILD)/python/kiln ]; then \
	  echo "pip install . (the Python package, into .venv)" && \
	  .venv/bin/python -m pip install -q --no-build-isolation --no-deps --disable-pip-version-check \
	    -C cmake.define.KILN_CUDA=$$(sed -n 's/^KILN_CUDA:BOOL=//p' $(BUILD)/CMakeCache.txt) . && \
	  KILN_TEST_INSTALLED=1 KILN_BUILD_DIR=$(abspath $(BUILD)) \
	  .venv/bin/python -m pytest -q -p no:cacheprovider python/tests && \
	  KILN_CUDA=$$(sed -n 's/^KILN_CUDA:BOOL=//p' $(BUILD)/CMakeCache.txt) scripts/check_wheel.sh; fi

# The sanitizer build: clang-14 at -O1 with ASan+UBSan, the library instrumented for libFuzzer's
# coverage too (fuzzer-no-link: the tests run the callbacks' no-op defaults), so that the ASan
# tests and the fuzzers share one build of the library.
san-configure: setup
	@CC=clang-14 CXX=clang++-14 cmake -S . -B $(SAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_CXX_FLAGS_DEBUG="-g -O1" -DKILN_SANITIZE=address,undefined -DKILN_FUZZ=ON \
	  -DKILN_CUDA=OFF -DKILN_BENCH=OFF >/dev/null

test-asan: san-configure
	@cmake --build $(SAN_BUILD) -j $(JOBS) --target kiln_core_tests kiln_op_tests kiln_autodiff_tests \
	  kiln_cli kiln_onnx_tests kiln_onnx_conformance kiln_package_tests kiln_example_shared_events \
	  kiln_profiler_tests kiln_quant_tests kiln_custom_op_tests
	ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --test-dir $(SAN_BUILD) --output-on-failure -j $(JOBS) -L unit

# Queues, events and asynchronous runs under ThreadSanitizer. Kernels run on the calling thread
# (KILN_THREADS=1): the OpenMP runtime and oneDNN are not instrumented. -O1 with line tables:
# TSan sees every access it would at -O2, and the build takes less time.
test-tsan: setup
	@cmake -S . -B $(TSAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1" -DKILN_SANITIZE=thread \
	  -DKILN_CUDA=OFF -DKILN_BENCH=OFF -DKILN_PYTHON=OFF >/dev/null
	@cmake --build $(TSAN_BUILD) -j $(JOBS) --target kiln_core_tests
	KILN_THREADS=1 OMP_NUM_THREADS=1 TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
	  $(TSAN_BUILD)/tests/kiln_core_tests --gtest_filter='Devices/Async.*:Event.*:QueueTest.*'

# libFuzzer over the ONNX importer, the package loader, the .npy reader, the safetensors reader,
# the tokenizer.json reader and the Core ML importer (the sanitizer build), FUZZ_SECONDS each,
# JOBS at a time (scripts/fuzz.sh; each fuzzer's output in $(SAN_BUILD)/fuzz-logs), from
# the seeds in tests/fuzz/corpus, tests/fuzz/package_corpus, tests/fuzz/npy_corpus,
# tests/fuzz/safetensors_corpus, tests/fuzz/tokenizer_corpus and tests/fuzz/coreml_corpus; new
# inputs go to $(SAN_BUILD)/corpus (package_corpus, npy_corpus, safetensors_corpus,
# tokenizer_corpus, coreml_corpus) and crashes to $(SAN_BUILD)/crash-* (package-crash-*,
# npy-crash-*, safetensors-crash-*, tokenizer-crash-*, coreml-crash-*). CI runs `make fuzz` (60 s).
fuzz: san-configure
	@cmake --build $(SAN_BUILD) -j $(JOBS) --target fuzz_onnx_import fuzz_package_load fuzz_npy_read \
	  fuzz_safetensors_read fuzz_tokenizer fuzz_coreml_import
	@scripts/fuzz.sh $(SAN_BUILD) $(FUZZ_SECONDS) $(JOBS)

# The GPU machine cannot build: `make gpu-bundle` builds the CUDA suites here (the toolkit is
# enough) into build-gpu/bundle.tar.xz; copy the checkout with it and run `make test-gpu` there.
# The Python package as a manylinux wheel in dist/ (scripts/wheel.sh: PYTHON, KILN_CUDA)
wheel: setup
	@scripts/wheel.sh

gpu-bundle: setup
	@scripts/gpu-bundle.sh build-gpu

# PART=1 (functional, kernel coverage, load) or PART=2 (compute-sanitizer); both by default
test-gpu:
	@PART=$(or $(PART),all) scripts/test-gpu.sh build-gpu

# Quick loop while developing: release build and C++ tests only.
check: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

bench: build
	@scripts/bench.sh $(BUILD)

docs: build
	$(BUILD)/kiln ops --markdown > docs/ops.md

format:
	@git ls-files '*.h' '*.cpp' '*.cu' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(SAN_BUILD) $(TSAN_BUILD)
