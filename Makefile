# Entry points for a fresh machine (README.md). Every target runs scripts/setup.sh first, which
# installs the Debian packages once and then only rebuilds what changed.
SHARED ?= ../shared
BUILD ?= build
export SCD_BUILD_DIR := $(BUILD)
export SCD_SHARED_DIR := $(abspath $(SHARED))

.PHONY: demo story test numeric-kernels build bench bench-peer bench-sweep bench-prefix bench-auto-load bench-batching bench-transport asan fuzz-smoke format clean compose-test k8s-check k8s-test container-tests many-streams soak soak-smoke

# The method's showcase on the hard pair (no shared training between the two models): fit once
# (cached in $(BUILD)/demo; `make clean` or deleting the file refits), evaluate every transfer
# mode, then serve: `scd serve --all-in-one` with the pair, the same prompt through the public API
# in local, raw and scd modes and as a fan-out, each with its TTFT breakdown (scripts/demo_serve.sh).
PRODUCER := $(SHARED)/models/stories260k
CONSUMER := $(SHARED)/models/llama2xs-260k
DEMO_ARTIFACT := $(BUILD)/demo/stories260k-to-llama2xs-260k.scd
DEMO_PROMPT := Once upon a time, there was a little girl named Lily. She loved to play with her ball in the park. One day,

demo: build $(DEMO_ARTIFACT)
	@echo "== fidelity of every transfer mode (consumer $(CONSUMER), TinyStories valid)"
	./$(BUILD)/bin/scd-calib eval --quiet --producer $(PRODUCER) --consumer $(CONSUMER) \
	  --artifact $(DEMO_ARTIFACT)
	@echo
	@echo "== serving: the consumer continues a prompt through the API, own prefill vs transferred caches"
	bash scripts/demo_serve.sh $(BUILD) $(PRODUCER) $(CONSUMER) $(DEMO_ARTIFACT) "$(DEMO_PROMPT)"

$(DEMO_ARTIFACT): | build
	@mkdir -p $(dir $@)
	@echo "== calibrating $(PRODUCER) -> $(CONSUMER) (once; about 2 minutes)"
	./$(BUILD)/bin/scd-calib fit --producer $(PRODUCER) --consumer $(CONSUMER) --out $@ \
	  --rank-k 1 --rank-v 2 --rank-h 16 --patch-budget 3 --aligner-seconds 0

# The runtime alone: stream a story from the base model.
story: build
	./$(BUILD)/bin/scd generate --model $(PRODUCER) \
	  --prompt "Once upon a time" --max-tokens 256 --temperature 0.8 --top-p 0.9 --seed 42 --stats

# Every test (those that judge a real-time bound, label `latency`, alone after the rest); the
# floating-point ones again under other BLAS kernels and ATen's portable code
# (`make numeric-kernels`); the transport tests under AddressSanitizer + LeakSanitizer (`make asan`);
# every parser's libFuzzer target for 30 s (`make fuzz-smoke`); the 3-minute soak under faults
# (`make soak-smoke`).
test: build
	ctest --test-dir $(BUILD) --output-on-failure -j2 -LE latency
	ctest --test-dir $(BUILD) --output-on-failure -L latency
	$(MAKE) numeric-kernels
	$(MAKE) asan
	$(MAKE) fuzz-smoke
	$(MAKE) soak-smoke

numeric-kernels: build
	bash scripts/numeric_kernels.sh $(BUILD)

build:
	bash scripts/setup.sh

bench: build
	./$(BUILD)/bin/scd_model_bench --configs $(SHARED)/configs

# Ahead of llama.cpp on the same machine (issue 48, bench/README.md): this runtime and llama.cpp
# (node-llama-cpp's prebuilt CPU binaries, pinned in bench/peer/package-lock.json) on the same
# models and token ids, f32/bf16/int8 against F32/BF16/Q8_0, 5 interleaved rounds, then the served
# figures; the table, plot and JSON under $(BUILD)/bench-peer (~45 minutes here).
bench-peer: build
	PY=/usr/bin/python3; [ -x $$PY ] || PY=python3; \
	$$PY bench/peer/bench_peer.py --build $(BUILD) --shared $(SHARED) --out $(BUILD)/bench-peer

# The bandwidth sweep (issue 16, bench/README.md): the hard pair with fidelity and the TinyLlama
# shape with dummy weights; results, summaries and plots under $(BUILD)/bench-sweep.
bench-sweep: build $(DEMO_ARTIFACT)
	bash bench/sweep.sh $(BUILD) $(SHARED) $(DEMO_ARTIFACT) $(BUILD)/bench-sweep

# The shared-prefix code cache's scenarios (issue 17, bench/README.md): five daemons on the
# TinyLlama shape, scd-bench serve per scenario, bench/prefix_check.py; under $(BUILD)/bench-prefix.
bench-prefix: build
	bash bench/prefix_cache.sh $(BUILD) $(SHARED) $(BUILD)/bench-prefix

# Where auto pays under load (issue 29, bench/README.md): a producer and two replicas of one
# consumer pinned apart on the TinyLlama shape, shared-prefix prompts under three tenants' salts,
# scd-bench serve --goodput per mode (local, scd, auto). Under $(BUILD)/bench-auto-load.
bench-auto-load: build
	bash bench/auto_load.sh $(BUILD) $(SHARED) $(BUILD)/bench-auto-load

# Continuous batching (issue 28, bench/README.md): scd-bench serve at concurrency 1..16 on
# tinystories-4m, the TinyLlama shape and the hard 4M pair in scd mode; scd-bench mixed (a long
# prompt beside 8 decoders, local and scd). Under $(BUILD)/bench-batching; ~1 hour here.
bench-batching: build
	bash bench/batching.sh $(BUILD) $(SHARED) $(BUILD)/bench-batching

# Issue 30's scale run: many_streams_test at 1,000 concurrent streams (coordinator, producer, two
# consumers as processes; threads per process and resident memory per open stream printed).
many-streams: build
	SCD_STREAMS=1000 $(BUILD)/bin/many_streams_test

# The soak under faults (issue 31, bench/README.md "Soak under faults"): etcd, two coordinators,
# a producer and three consumers as processes under a mixed Poisson load (6 requests/s) while
# nodes are killed, frozen and restarted, the link flaps and etcd restarts; every request
# checked as it ends, every recovery timed, and nothing held nor leaked at the end. soak.json and
# soak.png in $(BUILD)/soak/$(SOAK_TRANSPORT); exit 1 on any failure. Codes travel over gRPC;
# `make soak SOAK_TRANSPORT=ucx`: over UCX. The producer runs in a network namespace of its own
# whose link is also taken down and up (root; SOAK_LINK=shaper: on loopback). soak-smoke: the
# same in 3 minutes on loopback (every fault kind once), part of `make test`.
SOAK_TRANSPORT ?= grpc
SOAK_LINK ?= netns
soak: build
	./$(BUILD)/bin/scd-bench soak --duration 1800 --transport $(SOAK_TRANSPORT) \
	  --link $(SOAK_LINK) --shared-dir $(SHARED) --out $(BUILD)/soak/$(SOAK_TRANSPORT)

soak-smoke: build
	./$(BUILD)/bin/scd-bench soak --smoke --shared-dir $(SHARED) --out $(BUILD)/soak-smoke

# docker-compose.yml with real containers: podman + docker-compose 1.29, a locally made
# debian:bookworm base, the image with the binaries built here (scripts/compose_test.sh).
compose-test: build
	bash scripts/compose_test.sh $(BUILD) $(SHARED)

# deploy/k8s without a cluster: both overlays, with the TLS component and without, rendered,
# schema-validated and cross-checked (scripts/k8s_check.sh, ~25 s).
k8s-check: build
	bash scripts/k8s_check.sh $(BUILD)

# deploy/k8s run for real: k8s-check, then the single-node overlay's pods under podman kube play,
# ready through their gRPC health probes; the openai client, a gRPC fan-out, a consumer pod
# replaced under load; then again with the TLS component (scripts/k8s_test.sh, ~4 minutes with
# the image build).
k8s-test: build
	bash scripts/k8s_test.sh $(BUILD) $(SHARED)

# compose-test and k8s-test on one image (what .ci/run runs).
container-tests: build
	bash scripts/container_tests.sh $(BUILD) $(SHARED)

# Transfer goodput and session cost of every backend against ucx_perftest, same run (bench/README.md).
bench-transport: build
	bash bench/transport.sh $(BUILD)

# The transport tests under AddressSanitizer + LeakSanitizer, in their own build tree.
ASAN_BUILD ?= build-asan
asan:
	SCD_SKIP_BUILD=1 bash scripts/setup.sh
	cmake -S . -B $(ASAN_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSCD_SANITIZE=address \
	  -DSCD_BUILD_BENCH=OFF $(if $(shell command -v ccache),-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
	cmake --build $(ASAN_BUILD) --target scd_transport_tests
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
	  LSAN_OPTIONS=suppressions=$(abspath tests/lsan.supp) \
	  ctest -L 'transport|asan' --output-on-failure -j2

# Each fuzz target for 30 s in build-fuzz/ (clang, libFuzzer + ASan; two at a time); longer runs:
# `bash scripts/fuzz.sh TARGET SECONDS`.
FUZZ_SECONDS ?= 30
fuzz-smoke:
	SCD_SKIP_BUILD=1 bash scripts/setup.sh
	bash scripts/fuzz.sh all $(FUZZ_SECONDS)

format:
	clang-format -i $$(git ls-files '*.h' '*.cc')

clean:
	rm -rf $(BUILD)
