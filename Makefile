# Squall: the whole set-up on a fresh Debian/Ubuntu machine is `make demo` or `make test`.
# Ports and the state folder can be moved with SQUALL_KINESIS_PORT, SQUALL_ZK_PORT, SQUALL_DYNAMODB_PORT,
# SQUALL_STATE_DIR.

SQUALL_KINESIS_PORT ?= 4566
SQUALL_ZK_PORT ?= 2181
SQUALL_DYNAMODB_PORT ?= 4569
export SQUALL_KINESIS_PORT SQUALL_ZK_PORT SQUALL_DYNAMODB_PORT
export SQUALL_KINESIS_ENDPOINT ?= http://127.0.0.1:$(SQUALL_KINESIS_PORT)
export SQUALL_ZK ?= 127.0.0.1:$(SQUALL_ZK_PORT)
# DynamoDB (keyed state): dynalite on its own port; with SQUALL_USE_DOCKER=1 LocalStack's Kinesis edge port.
export SQUALL_STATE_ENDPOINT ?= $(if $(filter 1,$(SQUALL_USE_DOCKER)),$(SQUALL_KINESIS_ENDPOINT),http://127.0.0.1:$(SQUALL_DYNAMODB_PORT))
CARGO ?= cargo

.PHONY: all up down lint check build test it chaos soak breaks sim sim-breaks demo bench clean

all: build

up:
	./localstack/up

down:
	./localstack/down

build:
	$(CARGO) build --workspace --all-targets

lint:
	$(CARGO) fmt --all --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# The inner loop, no services: fmt, clippy, the squall crate's unit tests and every test of the
# engine (squall-topology: unit, integration and property tests, all in memory).
check: lint
	$(CARGO) test -p squall --lib
	$(CARGO) test -p squall-topology --lib --tests

# up + fmt + build + every test of the workspace, doctests and clippy + down (down runs even when a step fails); the
# last line names the step that failed (CI shows the tail of the output).
# Test binaries run through scripts/test-lanes: two lanes, each with its own services, of one binary
# at a time on 2 cores and of two on 4+: most integration tests wait on sessions,
# failovers and producers, and their waits overlap. A binary that hangs (SQUALL_TEST_TIMEOUT), or
# leaves a process, a Kinesis stream or a file in its TMPDIR behind, fails by name. Every binary runs even when one fails. Benchmarks are compiled by clippy --all-targets but run
# only by `make bench`.
# The binaries, the examples the tests spawn and the test binaries are built by one cargo command
# (its jobs overlap the tail of one set with the next). The doctests and clippy run beside the
# test lanes at idle CPU priority (test-lanes --beside): the lanes leave ~30 % of 2 cores idle
# while tests wait, and the compiler takes only that. (Clippy beside the *build*, both at normal
# priority, was slower: 4 min 42 s for both against 3 min 42 s one after the other.)
# A fresh clone builds everything once: incremental compilation's bookkeeping is overhead there
# (set CARGO_INCREMENTAL=1 to keep it for repeated runs; `make check` and `make it` keep it).
test: export CARGO_INCREMENTAL ?= 0
test:
	./localstack/up
	@status=0; step=fmt; \
	  $(CARGO) fmt --all --check && \
	  step=build && $(CARGO) build --workspace --bins --examples --lib --tests && \
	  step=tests && rm -f target/test-lanes-verdict && ./scripts/test-lanes \
	    --beside "doctests=$(CARGO) test --workspace --doc" \
	    --beside "clippy=$(CARGO) clippy --workspace --all-targets -- -D warnings" \
	    -- --workspace --lib --tests || status=$$?; \
	  ./localstack/down; \
	  if [ $$status -ne 0 ]; then \
	    if [ $$step = tests ] && [ -f target/test-lanes-verdict ]; then cat target/test-lanes-verdict >&2; fi; \
	    echo "make test: FAILED at step '$$step' (exit $$status); the lines above 'localstack/down' say why" >&2; \
	  else echo "make test: green (fmt, build, tests, doctests, clippy)" >&2; fi; \
	  exit $$status

# One integration test binary with what it spawns built first (`cargo test --test NAME` builds
# the squall binary but not the examples the workers run): make it NAME=chaos [ARGS='some_test --nocapture']
it:
	@test -n "$(NAME)" || { echo "make it: say which test: make it NAME=spout_reshard (the files in tests/)" >&2; exit 2; }
	@test -f tests/$(NAME).rs || { echo "make it: no tests/$(NAME).rs; the tests are: $$(ls tests/*.rs | xargs -n1 basename | sed 's/\.rs$$//' | tr '\n' ' ')" >&2; exit 2; }
	./localstack/up
	$(CARGO) build --bins --examples
	$(CARGO) test --test $(NAME) -- $(ARGS)

# The network fault suite (tests/netfaults.rs, no root: it runs in a user namespace): workers, a 3-node ZooKeeper ensemble
# and kinesis-local each in its own network namespace; partitions, a leader cut from its followers,
# latency and loss, a flapping link, Kinesis unreachable. `make test` runs its short partition test
# only; this runs all of them, one at a time (~6 min), then down (also when a test fails).
chaos:
	./localstack/up
	@status=0; \
	  $(CARGO) build --examples && \
	  $(CARGO) test --test netfaults -- --include-ignored --test-threads=1 --nocapture || status=$$?; \
	  ./localstack/down; \
	  exit $$status

# The long soaks `make test` runs short versions of (#[ignore = "soak: make soak"]): the 9000-record
# chaos run, 50 shards of backlog under the memory bound, an AT_TIMESTAMP a minute ahead of the
# service's clock. Then down (also when a test fails).
soak:
	./localstack/up
	@status=0; \
	  $(CARGO) build --bins --examples && \
	  $(CARGO) test --test chaos --test spout_memory --test spout_clock_skew -- --ignored --test-threads=1 --nocapture || status=$$?; \
	  ./localstack/down; \
	  exit $$status

# Every deliberate break of scripts/breaks/ applied to a scratch copy and run against the test that
# guards it (scripts/break-test --all): green when each break is caught; a break that does not
# build fails it. Builds into target/breaks, in one scratch worktree reset between breaks (the
# first build takes about 6 minutes, then 1-2 minutes a break with its test; 17 breaks: ~30 min).
breaks:
	./localstack/up
	./scripts/break-test --all

# The deterministic simulator (tests/sim, no services): a fleet of workers on simulated time over
# models of ZooKeeper, Kinesis and the state table, faults from a seed. `make sim SEED=N` replays one seed (its trace
# hash, its last events); `make sim` sweeps seeds for BUDGET seconds (default 600) from FIRST (default:
# the clock, new seeds each run) with JOBS at once (default: every core). `make test` runs 150 s of
# it from seed 1. Nightly: `make sim BUDGET=3600`. `make sim-breaks` shows each break of
# scripts/breaks/ the simulator reaches found by a seed that replays (scripts/sim-breaks, ~75 min).
sim:
	@if [ -n "$(SEED)" ]; then \
	  SQUALL_SIM_SEED=$(SEED) $(CARGO) test -p squall-sim --test sim seeds_hold_every_invariant -- --nocapture; \
	else \
	  SQUALL_SIM_BUDGET_S=$(or $(BUDGET),600) SQUALL_SIM_FIRST_SEED=$(or $(FIRST),$$(date +%s)) \
	  SQUALL_SIM_JOBS=$(or $(JOBS),$$(nproc)) $(CARGO) test -p squall-sim --test sim seeds_hold_every_invariant -- --nocapture; \
	fi

sim-breaks:
	./scripts/sim-breaks

demo:
	./localstack/up
	$(CARGO) build --bins --examples
	./scripts/demo.sh

# The engine benchmark (squall-topology), the coordination and Kinesis benchmarks (benches/coord.rs,
# benches/kinesis.rs) against kinesis-local and kinesalite, the KPL benchmark (benches/kpl.rs), polling vs EFO latency (benches/efo.rs), and the exactly-once state benchmark
# (benches/state.rs: kinesalite and dynalite); kinesalite is stopped again even when a step fails.
export SQUALL_KINESALITE_ENDPOINT ?= http://127.0.0.1:$(or $(SQUALL_KINESALITE_PORT),4568)
bench:
	./localstack/up
	./localstack/kinesalite-up
	@status=0; \
	  $(CARGO) build --release --examples && \
	  $(CARGO) bench --workspace || status=$$?; \
	  ./localstack/kinesalite-down; \
	  exit $$status

clean:
	./localstack/down
	$(CARGO) clean
