# Entry points for a fresh machine (README.md). Every target runs scripts/setup.sh first, which
# installs the Debian packages once and then only rebuilds what changed.
SHARED ?= ../shared
BUILD ?= build
export SCD_BUILD_DIR := $(BUILD)
export SCD_SHARED_DIR := $(abspath $(SHARED))

.PHONY: demo test build bench format clean

demo: build
	./$(BUILD)/bin/scd generate --model $(SHARED)/models/stories260k \
	  --prompt "Once upon a time" --max-tokens 256 --temperature 0.8 --top-p 0.9 --seed 42 --stats

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j2

build:
	bash scripts/setup.sh

bench: build
	./$(BUILD)/bin/scd_model_bench --configs $(SHARED)/configs

format:
	clang-format -i $$(git ls-files '*.h' '*.cc')

clean:
	rm -rf $(BUILD)
