# Everything a fresh machine needs is installed by these targets: `make demo`, `make test`.
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
# Re-install when the dependency list changes.
STAMP := $(VENV)/.installed-$(shell cksum pyproject.toml | cut -d' ' -f1)
ZK_SERVER := /usr/share/java/zookeeper.jar
PROMTOOL := /usr/local/bin/promtool
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: setup demo demo-store demo-cluster bench-cluster test test-fast lint typecheck unit bench-store bench-broker bench-producer bench-spark bench-microbatch bench-soak chaos bench-commit clean dist wheel-smoke layout protocol-doc

setup: $(STAMP) $(ZK_SERVER) $(PROMTOOL) jars

# Everything: the base, the Spark side, the notebook's and the test tools (a broker host
# alone needs only the wheel, without extras; extras in pyproject.toml).
$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark,notebook]'
	@rm -f $(VENV)/.installed-*
	@touch $@

# ZooKeeper server for the integration tests, from Debian's packages.
$(ZK_SERVER):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq zookeeper >/dev/null

# promtool, which checks the metrics endpoint's names (tests/broker/test_metrics_endpoint.py),
# taken alone from Debian's prometheus package: installing the package would bring the
# Prometheus server too (96 MB installed) with an init script that starts it.
$(PROMTOOL):
	$(SUDO) apt-get update -qq
	tmp=$$(mktemp -d) && chmod 755 $$tmp && cd $$tmp && apt-get download -qq prometheus && \
	  dpkg-deb --fsys-tarfile prometheus_*.deb | tar -xO ./usr/bin/promtool >promtool && \
	  chmod 755 promtool && $(SUDO) mv promtool $@ && rm -rf $$tmp
	$@ --version

# Delta Lake's jars for Spark, fetched with Maven from Maven Central into jars/ (passed with
# spark.jars by spark_sink.session.local_session: nothing is downloaded at run time). The
# version matches the delta-spark Python package; a new version gets a new stamp.
DELTA_VERSION := 4.4.0
JARS_STAMP := jars/.fetched-delta-$(DELTA_VERSION)
MVN := /usr/bin/mvn
.PHONY: jars
jars: $(JARS_STAMP)

$(JARS_STAMP): | $(MVN)
	DELTA_VERSION=$(DELTA_VERSION) bash scripts/fetch_jars.sh jars

# Kafka's broker and Spark's Kafka sink for bench-peers, and Kafka's command-line tools
# (kafka-tools) for the tests, with Maven from Maven Central into jars/kafka-broker/ and
# jars/spark-kafka/: sub-folders, so no other Spark session gets them.
# SPARK_KAFKA_VERSION is the installed pyspark's; a new version pair gets a new stamp.
KAFKA_VERSION := 4.1.2
SPARK_KAFKA_VERSION := 4.2.0
KAFKA_JARS_STAMP := jars/.fetched-kafka-$(KAFKA_VERSION)-tools-spark-kafka-$(SPARK_KAFKA_VERSION)
.PHONY: kafka-jars bench-peers
kafka-jars: $(KAFKA_JARS_STAMP)

$(KAFKA_JARS_STAMP): | $(MVN)
	KAFKA_VERSION=$(KAFKA_VERSION) SPARK_VERSION=$(SPARK_KAFKA_VERSION) bash scripts/fetch_kafka_jars.sh jars

$(MVN):
	$(SUDO) apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq maven >/dev/null

# The main job: a Spark stream written exactly once through injected failures.
demo: setup
	$(PY) -m jobs.streaming_demo

# The log store on its own: lost acks, retries, zombies, a torn tail.
demo-store: setup
	$(PY) -m jobs.store_demo

# The streaming demo on a cluster: ZooKeeper, 3 brokers, a Spark standalone master and 2
# workers and the driver, each on a host of its own (network namespaces: root needed),
# with an executor killed, a worker host and the driver cut off; removed at the end.
demo-cluster: setup
	$(PY) -m tests.cluster.demo $(DEMO_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: setup
	$(VENV)/bin/mypy

# The test command (CI runs exactly this): lint, types, then the whole suite. The Kafka
# jars are fetched too: tests/bench runs every bench-* target at its smoke size;
# tests/packaging builds the wheel and runs the wheel smoke (make wheel-smoke). Most
# tests wait more than they compute, so they run on TEST_WORKERS pytest-xdist workers
# (--heaviest-first: a unit per file, per test in a few heavy files, heaviest first;
# tests/harness/work_units.py); the `serial` ones, whose deadlines a busy machine could
# stretch, run alone afterwards. Both phases always run; either failing fails it.
TEST_WORKERS ?= 2
# Bytecode caches on for the tests, whatever the environment says (container images often
# set PYTHONDONTWRITEBYTECODE=1): otherwise every Python process of the suite (each broker,
# idemlog run, Spark worker, driver child, pytest worker) compiles the project's modules
# from source again, ~0.3 s of CPU per process. They go to __pycache__/ (ignored by git;
# the wheel takes .py files only).
test test-fast: export PYTHONDONTWRITEBYTECODE :=
test: lint typecheck kafka-jars
	status=0; \
	$(VENV)/bin/pytest -q --durations=15 -n $(TEST_WORKERS) --heaviest-first -m "not serial" || status=$$?; \
	$(VENV)/bin/pytest -q --durations=5 -m serial || status=$$?; \
	exit $$status

# The wheel and the sdist in dist/ (`pip install dist/idemlog-<v>-py3-none-any.whl[spark]`):
# only broker_core and spark_sink, with py.typed, LICENSE and the `idemlog` script. A pure
# Python build: it needs the venv with the build front end only, not `setup`'s ZooKeeper,
# Maven jars or the project's own dependencies (build fetches setuptools for its isolated
# build environment).
BUILD_STAMP := $(VENV)/.build-frontend
$(BUILD_STAMP):
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet 'build>=1.2'
	@touch $@

dist: $(BUILD_STAMP)
	rm -rf dist
	$(PY) -m build --outdir dist .

# The wheel installed with [spark] into a fresh virtualenv outside the checkout, then used:
# --version, a broker start/stop, produce/consume, one Spark write (scripts/wheel_smoke.py).
# `make test` runs it too (tests/packaging/test_wheel.py).
wheel-smoke: setup
	$(PY) scripts/wheel_smoke.py

# The house as it stands: each folder's modules and lines, the largest modules, the modules
# most often changed (scripts/layout.py; docs/architecture.md says where a change goes).
layout:
	@$(PYTHON) scripts/layout.py $(LAYOUT_ARGS)

# docs/protocol.md's tables of the DoAction bodies, from the request classes' WIRE
# (scripts/protocol_doc.py; tests/unit/test_protocol_table.py fails while the page is stale).
protocol-doc:
	@$(PY) scripts/protocol_doc.py

# The fast tier (docs/contributing.md): the unit and store tests without Spark, ZooKeeper or
# slow ones, in well under two minutes; lint and types are `make lint typecheck`.
FAST_TIER := tests/unit tests/store -m "not spark and not zookeeper and not slow"
test-fast: setup
	$(VENV)/bin/pytest -q --durations=10 $(FAST_TIER)

# Every bench-* target takes BENCH_ARGS: the module's own options (`--help` lists them),
# e.g. `make bench-store BENCH_ARGS="--gb 0.1"`; tests/bench runs each at a smoke size.
BENCH_ARGS ?=
DEMO_ARGS ?=

bench-store: setup
	$(PY) -m benchmarks.bench_store $(BENCH_ARGS)

bench-broker: setup
	$(PY) -m benchmarks.bench_broker $(BENCH_ARGS)

# 20M rows through the producer vs the same batches over a bare Flight client (ROWS=...).
ROWS ?= 20000000
bench-producer: setup
	$(PY) -m benchmarks.bench_producer --rows $(ROWS) $(BENCH_ARGS)

# A Spark task's side of the batch write without Spark: idemlog's task and the broker
# against the discard writer's work, CPU s per 10M rows (BENCH_ARGS=--rows N ...).
.PHONY: bench-task-write
bench-task-write: setup
	$(PY) -m benchmarks.bench_task_write $(BENCH_ARGS)

# format("idemlog") in Spark vs a discard-only Python writer, noop and parquet (ROWS=...).
bench-spark: setup
	$(PY) -m benchmarks.bench_spark --rows $(ROWS) $(BENCH_ARGS)

# Where a streaming micro-batch's time goes, idemlog's parts against the discard writer's.
bench-microbatch: setup
	$(PY) -m benchmarks.bench_microbatch $(BENCH_ARGS)

# Spark's Python workers from spark_sink.worker_daemon against pyspark.daemon: small reads
# and writes, wall and CPU per run.
.PHONY: bench-workers
bench-workers: setup
	$(PY) -m benchmarks.bench_workers $(BENCH_ARGS)

# What one sink commit costs (commit_sink_batch p50/p95) for tasks x partitions.
bench-commit: setup
	$(PY) -m benchmarks.bench_commit $(BENCH_ARGS)

# The batch write with the brokers' early writeback (flush.writeback.bytes) on and off,
# interleaved in one session, with the discard writer beside them.
.PHONY: bench-writeback
bench-writeback: setup
	$(PY) -m benchmarks.bench_writeback $(BENCH_ARGS)

# idemlog vs Spark's Kafka and Delta sinks and Kafka's own producer, on a real local Kafka.
bench-peers: setup kafka-jars
	$(PY) -m benchmarks.bench_peers $(BENCH_ARGS)

# What one default metrics document costs with 10 and with ~300,000 idempotent producers
# (the producers made within --create-seconds, 120 by default).
.PHONY: bench-metrics
bench-metrics: setup
	$(PY) -m benchmarks.bench_metrics $(BENCH_ARGS)

# Kafka's record batch v2 (broker_core/kafka) encoded from and decoded into Arrow columns:
# records/s and CPU seconds for 1M 100-byte values, kafka-python's per-record code beside.
.PHONY: bench-kafka-records
bench-kafka-records: setup
	$(PY) -m benchmarks.bench_kafka_records $(BENCH_ARGS)

# Kafka's own client against idemlog's Kafka listener and a real Kafka broker: an
# idempotent producer and a consumer, records/s and broker CPU, interleaved rounds.
.PHONY: bench-kafka
bench-kafka: setup kafka-jars
	$(PY) -m benchmarks.bench_kafka $(BENCH_ARGS)

# A compressed month of a stream: is the coordinator's state bounded by what is alive?
bench-soak: setup
	$(PY) -m benchmarks.bench_soak $(BENCH_ARGS)

# A campaign of seeded fault schedules outside the suite; ends with `chaos seeds=N failed=F ...`.
SEEDS ?= 10
chaos: setup
	$(PY) -m tests.chaos --seeds $(SEEDS) $(CHAOS_ARGS)

# The same batch write on the cluster (tests/cluster/stack.py) with 1 and with 2 workers.
bench-cluster: setup
	$(PY) -m tests.bench.bench_cluster $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
