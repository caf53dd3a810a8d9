# rlock — shortcuts only. `make help` lists them; CI runs `make test`, the same as a person.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV      := .venv
PY        := $(VENV)/bin/python
PYTEST    := $(VENV)/bin/pytest
MODULE    := $(CURDIR)/target/debug/librlock.so
MODULE_RELEASE := $(CURDIR)/target/release/librlock.so
REDIS_SERVER ?= $(shell command -v redis-server 2>/dev/null || echo /usr/bin/redis-server)
export RLOCK_MODULE ?= $(MODULE)
export REDIS_SERVER

.PHONY: help deps venv build release run test test-unit test-py test-long test-client lint bench bench-instr bench-quick clean

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

deps: ## Install what a fresh Debian machine lacks (redis-server, libclang-dev, python3-venv; apt-get when root)
	@./scripts/deps.sh --venv

$(VENV)/.ok: tests/requirements.txt
	@./scripts/deps.sh --venv
	python3 -m venv $(VENV) || { echo "python3 -m venv failed: install python3-venv (apt-get install python3-venv)"; exit 1; }
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -r tests/requirements.txt
	@touch $@

venv: $(VENV)/.ok ## Make the Python virtualenv for the integration tests

build: ## Build the module (target/debug/librlock.so)
	@./scripts/deps.sh
	cargo build -p rlock

release: ## Build the optimised module (target/release/librlock.so)
	@./scripts/deps.sh
	cargo build --release -p rlock

run: build ## Build, then start redis-server with the module on redis.conf.example (foreground)
	$(REDIS_SERVER) redis.conf.example

test: build venv test-unit test-py test-client bench-quick ## Every test: Rust unit + client tests, Python integration tests, benchmark smoke run

test-unit: ## Rust unit tests of the pure lock core
	cargo test -p rlock

test-py: build venv ## Python integration tests against a real module-loaded redis-server
	$(PYTEST) -q tests

test-long: build venv ## Long runs: 1 000 000 leak-check cycles, 500 model examples, 30 000 fuzz calls
	RLOCK_LEAK_CYCLES=1000000 RLOCK_MODEL_EXAMPLES=500 RLOCK_FUZZ_CALLS=30000 \
		$(PYTEST) -q tests/test_leak.py tests/test_model.py tests/test_fuzz.py

test-client: build ## Rust client crate tests (blocking and async) against a real module-loaded redis-server
	cargo test -p rlock-client --all-features
	cargo build -p rlock-client --all-targets

lint: ## rustfmt check and clippy with warnings as errors
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy -p rlock-client --all-targets --all-features -- -D warnings

bench: ## Benchmarks side by side (rlock vs Redisson scripts vs SET NX); writes BENCHMARK.md
	@./scripts/deps.sh
	cargo build --release -p rlock
	cargo run --release -q -p rlock-bench -- --module $(MODULE_RELEASE) --report BENCHMARK.md --chart bench/contention.svg --notes bench/analysis.md

bench-instr: ## Instructions per call under callgrind (tax on other commands; RLOCK vs Redisson vs SET NX PX); writes BENCHMARK.md
	@./scripts/deps.sh --valgrind
	cargo build --release -p rlock
	python3 bench/instr.py --module $(MODULE_RELEASE) --server $(REDIS_SERVER) $(if $(VALKEY_SERVER),--server $(VALKEY_SERVER)) --report BENCHMARK.md

bench-quick: ## A seconds-long smoke run of the benchmark code (used by make test)
	cargo build -p rlock
	cargo test -q -p rlock-bench
	cargo run -q -p rlock-bench -- --quick --module $(RLOCK_MODULE)

clean: ## Remove build output and the virtualenv
	cargo clean
	rm -rf $(VENV)
