# pskv — top-level entry points. `make demo` and `make test` work on a fresh Debian
# machine: they install what is missing (scripts/install-deps.sh), build, and run.
BUILD      ?= build
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=
PY         := /usr/bin/python3
ifeq ($(CI),true)
  CMAKE_ARGS += -DPSKV_WERROR=ON
endif

.PHONY: all deps build demo test test-unit sanitize tsan bench format clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD)/build.ninja: | deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS)

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/kvstore_demo

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 300

# ASan + UBSan build of the core tests.
sanitize: deps
	cmake -S . -B $(BUILD)-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	  -DPSKV_SANITIZE=address,undefined -DPSKV_BUILD_TORCH=OFF -DPSKV_BUILD_PYTHON=OFF $(CMAKE_ARGS)
	cmake --build $(BUILD)-asan -j $(JOBS) --target pskv_unit_tests
	cd $(BUILD)-asan && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) -L unit --timeout 600

# ThreadSanitizer build of the core tests.
tsan: deps
	cmake -S . -B $(BUILD)-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	  -DPSKV_SANITIZE=thread -DPSKV_BUILD_TORCH=OFF -DPSKV_BUILD_PYTHON=OFF $(CMAKE_ARGS)
	cmake --build $(BUILD)-tsan -j $(JOBS) --target pskv_unit_tests
	cd $(BUILD)-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j $(JOBS) -L unit --timeout 600

bench: build
	$(BUILD)/pskv-bench reduce

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan
