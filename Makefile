# Pigeon. `make run` starts a node on its embedded defaults; `make test` runs the test suite.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SPARK_STAMP := $(VENV)/.installed-spark
DATA ?= ./data

.PHONY: run cluster regions test lint bench bench-quick soak soak-long sim sim-cluster fuzz chaos package-check clean

$(BIN)/python:
	$(PY) -m venv $(VENV) || python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# the install also builds pigeon.core._compiled, pigeon.node._commit and pigeon.spark._decode (setup.py, Cython)
# in place; every install takes the exact versions of constraints.txt (pyproject.toml has the ranges a user's
# install may choose from)
PIP_INSTALL := $(BIN)/pip install --quiet -c constraints.txt
$(STAMP): pyproject.toml constraints.txt setup.py pigeon/core/_compiled.pyx pigeon/node/_commit.pyx pigeon/spark/_decode.pyx | $(BIN)/python
	$(PIP_INSTALL) -e '.[test]'
	touch $(STAMP)

# the Spark connector's tests need pyspark, pyarrow and deltalake (~550 MB of wheels, ~40 s on a fresh venv)
$(SPARK_STAMP): pyproject.toml constraints.txt | $(STAMP)
	$(PIP_INSTALL) -e '.[test,spark]'
	touch $(SPARK_STAMP)

# The package's bytecode, written ahead: a server start then loads it instead of compiling every module (~0.3 s
# of each start where Python may not write its caches itself, as under PYTHONDONTWRITEBYTECODE)
COMPILE := $(BIN)/python -m compileall -q pigeon

run: $(STAMP)
	$(COMPILE)
	$(BIN)/pigeon serve --host 127.0.0.1 --port 8085 --data-dir $(DATA)

# cluster tests start real etcd members: Debian's etcd-server, installed when missing (needs root, as CI has)
ETCD_BIN := /usr/bin/etcd
$(ETCD_BIN):
	command -v etcd >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends etcd-server; }

# three etcd members and three nodes on loopback in the foreground, one coloured log; Ctrl-C stops everything.
# SECURE=1: TLS and a bearer token for clients (no client certificate), node certificates on a peer port each
cluster: $(STAMP) $(ETCD_BIN)
	$(BIN)/python scripts/cluster.py --dir ./cluster $(if $(SECURE),--secure)

# a deployment of regions (docs/regions.md): a global etcd, an etcd and NODES nodes a region, links between regions
# delayed DELAY_MS each way; Ctrl-C stops everything
REGIONS ?= east,west,north
NODES ?= 1
DELAY_MS ?= 50
regions: $(STAMP) $(ETCD_BIN)
	$(BIN)/python scripts/regions.py --regions $(REGIONS) --nodes $(NODES) --delay-ms $(DELAY_MS) --dir ./regions

# the web console's tests drive Debian's Chromium through its chromedriver (Selenium); nothing is downloaded at test time
CHROMEDRIVER := /usr/bin/chromedriver
$(CHROMEDRIVER):
	command -v chromedriver >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y \
		-qq --no-install-recommends chromium chromium-driver; }

# the alert rules (docs/alerts.yml) are checked and unit-tested with promtool: Debian's prometheus package
PROMTOOL := /usr/bin/promtool
$(PROMTOOL):
	command -v promtool >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
		--no-install-recommends prometheus; }

# the tests in TEST_WORKERS processes (pytest-xdist; the end-to-end tests mostly wait on servers, etcd and Spark):
# a file's tests in one process, the Spark tests all in one (tests/conftest.py); TEST_WORKERS=0 runs them in this one
TEST_WORKERS ?= 2
test: $(STAMP) $(SPARK_STAMP) $(ETCD_BIN) $(CHROMEDRIVER) $(PROMTOOL)
	$(BIN)/lint-imports
	$(COMPILE)
	$(BIN)/python -m pytest -q $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): pyproject.toml constraints.txt | $(BIN)/python
	$(PIP_INSTALL) -e '.[test,bench]'
	touch $(BENCH_STAMP)

# Full comparison with RabbitMQ, NATS JetStream, Redis Streams and Google's emulator (installed from Debian when
# missing); writes bench/results/<date>T<UTC time>-<machine>.json/.md/.png. About half an hour.
bench: $(BENCH_STAMP)
	bash scripts/bench_peers.sh
	$(BIN)/pigeon bench --plan full --peers all --quiet-wait 60 --out bench/results

# Everyday reading (about two minutes): Pigeon and whichever peers are installed, short runs, nothing written.
bench-quick: $(BENCH_STAMP)
	$(BIN)/pigeon bench --plan quick --peers all

# Long soak: a 3-node cluster under steady mixed load for HOURS hours, one node
# restarted every 10 minutes; RSS, fds, threads, etcd keys, ledgers, disk and p99 every minute to bench/results/,
# failing on loss, on more than 10 % growth from the first to the second half, or on a p99 that doubles.
HOURS ?= 2
soak-long: $(STAMP) $(ETCD_BIN)
	$(BIN)/python scripts/soak_long.py --hours $(HOURS)

# Crash soak: kill -9 the server at random moments for many rounds (PIGEON_CRASH_SEED replays one run). Each
# round may take up to 30 s on a loaded machine: the suite's 300 s per test would end a 100-round soak midway.
soak: $(STAMP)
	rounds=$${PIGEON_CRASH_ROUNDS:-100}; PIGEON_CRASH_ROUNDS=$$rounds $(BIN)/python -m pytest -q -s \
		--timeout $$((60 + 30 * rounds)) tests/e2e/test_crash.py

# The deterministic simulator over many seeds (make test runs 300): SEEDS=N STEPS=M; a failure prints its seed,
# `python -m pigeon.testing.simulator --seed N` replays it.
SEEDS ?= 10000
STEPS ?= 150
sim: $(STAMP)
	$(BIN)/python -m pigeon.testing.simulator --seeds $(SEEDS) --steps $(STEPS)

# The cluster simulator over many seeds (make test runs 40): three nodes of the real node code on virtual time,
# crashes, cuts and metadata outages by seed (odd seeds with spread topics: each shard a bundle of its own).
# SEEDS=N CLUSTER_STEPS=M; a failure prints its seed and the command that replays it.
CLUSTER_STEPS ?= 100
sim-cluster: $(STAMP)
	PYTHONHASHSEED=0 $(BIN)/python -m pigeon.testing.simcluster_main --seeds $(SEEDS) --steps $(CLUSTER_STEPS)

# Hostile input, long: every gRPC method with FUZZ_EXAMPLES random, garbled and mutated requests (make test runs
# 12 each); prints the calls made and the status codes seen per method. Then the REST API from its OpenAPI
# document with schemathesis, REST_FUZZ_EXAMPLES random examples per operation (make test: 5, derandomized).
FUZZ_EXAMPLES ?= 2000
REST_FUZZ_EXAMPLES ?= 300
fuzz: $(STAMP)
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_REPORT=1 $(BIN)/python -m pytest -q -s --timeout 1800 tests/e2e/test_fuzz.py
	REST_FUZZ_EXAMPLES=$(REST_FUZZ_EXAMPLES) FUZZ_REPORT=1 $(BIN)/python -m pytest -q -s --timeout 3600 \
		tests/e2e/test_rest_fuzz.py

# Fault scenarios against a real 3-node cluster under load (kill -9 of an owner and of a storage member, SIGSTOP
# past the session, drain and join under load, etcd stopped), each ending in a full history check; prints a
# table. CHAOS_SEEDS=N seeds each, CHAOS_SCENARIOS=a,b to choose. About 1 minute per run. Then CHAOS_ROUNDS rounds
# of random faults, one every ~20 s, over a three-member etcd with StreamingPull subscribers (about 20 minutes for
# 50): the history check, and the time from each kill to the first publish through a survivor (at most 3 s). Then
# two regions under load, one cut off for 60 s, then the global store stopped for 60 s (about 5 minutes).
CHAOS_SEEDS ?= 3
CHAOS_SCENARIOS ?= kill-owner,kill-new-owner,kill-replica,pause-owner,drain-owner,add-node,stop-etcd,cut-owner,cut-owner-peers
CHAOS_ROUNDS ?= 50
CHAOS_ROUNDS_SEED ?= 1
chaos: $(STAMP) $(ETCD_BIN)
	$(BIN)/python scripts/chaos.py --scenarios $(CHAOS_SCENARIOS) --seeds $(CHAOS_SEEDS)
	$(BIN)/python scripts/fault_rounds.py --rounds $(CHAOS_ROUNDS) --seed $(CHAOS_ROUNDS_SEED)
	$(BIN)/python scripts/regions_chaos.py --seeds 1

# The package as a user installs it, without make (a few minutes: each fresh virtualenv downloads the
# dependencies): a wheel built from the work tree (Cython parts included) on Python 3.11 and each newer CPython
# found (PIGEON_PACKAGE_PYTHONS=path,path to choose), installed into a fresh virtualenv in /tmp, then
# `pigeon --version` and `pigeon serve` answering /healthz; and the Spark executor's install (the wheel without
# the server's dependencies) importing the connector.
package-check: $(STAMP)
	PIGEON_PACKAGE_CHECK=1 $(BIN)/python -m pytest -q -s -p no:cacheprovider tests/e2e/test_package.py

# The container image (Containerfile) with podman, or docker (CONTAINER_ENGINE=docker); not part of `make test`
# (minutes, and an engine that may need root). IMAGE_BASE: a local base where no registry is reachable, e.g. one
# made by debootstrap (docs/operations.md, "Containers"); IMAGE_BUILD_FLAGS: more, e.g. --secret id=pip-ca,src=…
# for a TLS-intercepting proxy. image-test runs it (examples/testcontainers_example.py): the official client
# publishes and pulls through PUBSUB_EMULATOR_HOST, /readyz and the HEALTHCHECK answer, SIGTERM stops it cleanly.
.PHONY: image image-test
CONTAINER_ENGINE ?= $(shell command -v podman >/dev/null 2>&1 && echo podman || echo docker)
IMAGE ?= pigeon:$(shell sed -n 's/^__version__ = "\(.*\)"/\1/p' pigeon/version.py)
IMAGE_BASE ?=
IMAGE_BUILD_FLAGS ?=
image:
	$(CONTAINER_ENGINE) build $(if $(filter podman,$(CONTAINER_ENGINE)),--format docker) \
		$(if $(IMAGE_BASE),--build-arg BASE=$(IMAGE_BASE)) $(IMAGE_BUILD_FLAGS) -t $(IMAGE) -f Containerfile .

image-test: image $(STAMP)
	PIGEON_IMAGE=$(IMAGE) CONTAINER_ENGINE=$(CONTAINER_ENGINE) $(BIN)/python examples/testcontainers_example.py

clean:
	rm -rf $(VENV) $(DATA) .pytest_cache
