# pskv — top-level entry points. `make demo` and `make test` work on a fresh Debian
# machine: they install what is missing (scripts/install-deps.sh), build, and run.
BUILD      ?= build
JOBS       ?= $(shell nproc)
# Tests at twice the cores: most of the suite's time is processes waiting (timeouts,
# failure detection, launches), about half of two cores busy at one test per core.
TEST_JOBS  ?= $(shell echo $$(( 2 * $$(nproc) )))
CMAKE_ARGS ?=
PY         := /usr/bin/python3
ifeq ($(CI),true)
  # -g1 (line tables, no variables): ~15 % less compile time than -g and a third of the
  # object size; backtraces keep their file:line.
  CMAKE_ARGS += -DPSKV_WERROR=ON '-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -g1 -DNDEBUG'
endif

.PHONY: all deps deps-demo build demo test sanitize tsan bench bench-cluster fuzz format clean

all: build

# What the demo needs: the compilers and libraries, libtorch, the dataset.
deps-demo:
	@scripts/install-deps.sh --with-torch --with-data

# Everything the tests need besides: ssh, rsync, Open MPI, Slurm, kubectl.
deps:
	@scripts/install-deps.sh --with-torch --with-data --with-launchers

# Configures $(BUILD) once (the same configuration for the demo and the tests), compiling
# through ccache (scripts/ccache-launch.sh) where it is installed.
CONFIGURE = test -f $(BUILD)/build.ninja || \
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_ARGS) \
	  $$(command -v ccache >/dev/null && echo -DCMAKE_CXX_COMPILER_LAUNCHER=$(CURDIR)/scripts/ccache-launch.sh)

build: deps
	$(CONFIGURE)
	cmake --build $(BUILD) -j $(JOBS)

# The main job: LeNet on Fashion-MNIST, 2 workers + 1 server, dist_sync, 3 epochs
# (2 epochs reach 0.888, deterministically; the third gives margin: 0.895, ~2 min).
# Installs and builds only what it runs (no launcher tools, no tests).
demo: deps-demo
	$(CONFIGURE)
	cmake --build $(BUILD) -j $(JOBS) --target train_fmnist pskv-launch pskv-server
	$(BUILD)/pskv-launch -n 2 -s 1 --timeout 900 -- $(BUILD)/train_fmnist --kv-store dist_sync --epochs 3 \
	  --min-accuracy 0.88

# A test that fails beside the others runs once more alone (scripts/run-tests.sh).
test: build
	scripts/run-tests.sh $(BUILD) $(TEST_JOBS)

# ASan + UBSan build of the core tests.
sanitize: deps
	cmake -S . -B $(BUILD)-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	  -DPSKV_SANITIZE=address,undefined,float-cast-overflow -DPSKV_BUILD_TORCH=OFF -DPSKV_BUILD_PYTHON=OFF $(CMAKE_ARGS)
	cmake --build $(BUILD)-asan -j $(JOBS) --target pskv_unit_targets
	cd $(BUILD)-asan && UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ctest --output-on-failure -j $(JOBS) -L unit --timeout 600

# ThreadSanitizer build of the core tests.
tsan: deps
	cmake -S . -B $(BUILD)-tsan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	  -DPSKV_SANITIZE=thread -DPSKV_BUILD_TORCH=OFF -DPSKV_BUILD_PYTHON=OFF $(CMAKE_ARGS)
	cmake --build $(BUILD)-tsan -j $(JOBS) --target pskv_unit_targets
	cd $(BUILD)-tsan && TSAN_OPTIONS="halt_on_error=1 suppressions=$(CURDIR)/tests/tsan.supp" ctest --output-on-failure -j $(JOBS) -L unit --timeout 600

# Figures as JSON lines in bench/results/ and as PNG plots in docs/img/ (README shows them).
bench: build
	mkdir -p bench/results
	$(BUILD)/pskv-bench reduce --json > bench/results/reduce.json
	$(BUILD)/pskv-bench pushpull --json > bench/results/pushpull.json
	PSKV_BUILD_DIR=$(BUILD) /usr/bin/python3 bench/train/run.py --json > bench/results/train.json
	PSKV_BUILD_DIR=$(BUILD) /usr/bin/python3 bench/image_classification_bench.py --out bench/results/image_classification.json
	PSKV_BUILD_DIR=$(BUILD) /usr/bin/python3 bench/embedding_train_bench.py --json > bench/results/embedding_train.json
	/usr/bin/python3 bench/plot.py --out docs/img bench/results/*.json

# Across hosts (root: a cluster of network namespaces, tests/cluster/netns_cluster.py;
# about 25 minutes): push+pull against the parameter-server bound and DDP-gloo.
# Every cluster figure (about 75 minutes): the scaling grid and the servers series, the
# default (learned rate) against the stated rate, unpaced and DDP, and a link's rate
# changed mid-job and a competing flow (docs/performance.md, "Across hosts").
CLUSTER = PSKV_BUILD_DIR=$(BUILD) /usr/bin/python3 bench/cluster/scaling.py
bench-cluster: build
	mkdir -p bench/results
	rm -f bench/results/cluster_scaling.json bench/results/cluster_default.json bench/results/cluster_default_change.json
	$(CLUSTER) --ddp --even-repeat 1 --servers-series 1,2,4 --out bench/results/cluster_scaling.json
	$(CLUSTER) --bench cluster_default --servers 0,2,4 --sizes 4MB,23MB,64MB --rates 100mbit,1gbit --steps 5 \
	  --repeat 1 --unpaced-repeat 1 --paced-repeat 1 --ddp --ddp-at 0 --out bench/results/cluster_default.json
	$(CLUSTER) --bench cluster_default_change --servers 0 --sizes 23MB --rates 100mbit --change 3:0:50mbit,8:0:100mbit --change-steps 12 \
	  --unpaced-repeat 1 --out bench/results/cluster_default_change.json
	$(CLUSTER) --bench cluster_default_change --servers 0 --sizes 23MB --rates 100mbit --compete 3:8:1:0 --change-steps 12 \
	  --unpaced-repeat 1 --out bench/results/cluster_default_change.json
	/usr/bin/python3 bench/plot.py --out docs/img bench/results/*.json

format:
	clang-format -i $$(git ls-files '*.cc' '*.h')

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(BUILD)-tsan

# Runs the libFuzzer target on the decoder for FUZZ_SECONDS (clang needed), then the
# network fuzzer against a live job for FUZZ_SECONDS.
FUZZ_SECONDS ?= 60
fuzz: deps
	scripts/install-deps.sh --with-clang
	cmake -S . -B $(BUILD)-fuzz -G Ninja -DCMAKE_CXX_COMPILER=clang++ -DPSKV_BUILD_FUZZ=ON \
	  -DPSKV_BUILD_TORCH=OFF -DPSKV_BUILD_PYTHON=OFF
	cmake --build $(BUILD)-fuzz --target fuzz_decode
	mkdir -p $(BUILD)-fuzz/corpus && cp fuzz/corpus/* $(BUILD)-fuzz/corpus/
	$(BUILD)-fuzz/fuzz/fuzz_decode -max_total_time=$(FUZZ_SECONDS) -max_len=4096 $(BUILD)-fuzz/corpus
	$(MAKE) build
	PSKV_NET_FUZZ_SECONDS=$(FUZZ_SECONDS) $(BUILD)/tests/pskv_security_tests --gtest_filter='SecurityFuzz.*'

