# The README's two commands: `make demo` and `make test`. Both start from a fresh machine.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

PG_URL ?= $(shell scripts/postgres.sh url)
KAFKA_URL ?= $(shell scripts/kafka.sh url)

.PHONY: install check demo test bench clean pg pg-stop kafka kafka-stop chromium prometheus nginx jvm-archive

$(STAMP): pyproject.toml setup.py src/drainpipe/_fastpath.c $(wildcard src/drainpipe/native/*.c src/drainpipe/native/*.h)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev,spark,grpc,kafka]'
	touch $(STAMP)

# The install also builds Spark's JVM class-data archive (drainpipe/spark/jvm_archive.py) once per machine, Java and
# pyspark version (about 20 s): a local Spark session starts in about half the time. Speed only: without Java it says
# so and goes on.
install: $(STAMP)
	-@$(PY) -c 'from drainpipe.spark.jvm_archive import main; main()' > /dev/null

demo: install
	$(VENV)/bin/drainpipe demo

# The quality gate: lint, format and types (configured in pyproject.toml). `make test` runs it first.
check: install
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/ruff format --check src tests benchmarks
	$(VENV)/bin/mypy

# The suite, then the tests that read the clock (marked `clock`) again with the clock a year ahead and a year behind:
# none may pass only on the day it was written (CONTRIBUTING.md, "Tests and the clock"). Those that must compare with
# a real Prometheus (marked `wall_clock`) are listed there as skipped, with the reason.
TEST_ENV = DRAINPIPE_TEST_PG=$(PG_URL) DRAINPIPE_TEST_KAFKA=$(KAFKA_URL)
# The suite runs on TEST_WORKERS processes (pytest-xdist), a test file per worker at a time (its module fixtures: a
# Spark cluster, a server): most tests wait on processes they start (JVMs, servers, members), so two workers on two
# cores take about two thirds of the time of one. The tests marked `exclusive` stop a service every other test shares
# (PostgreSQL, the broker) or bound latency in milliseconds, so they run alone, after. Each worker has a PostgreSQL
# database of its own (tests/conftest.py). The clock runs are a few long kill tests of one file: spread test by test.
TEST_WORKERS ?= 2

test: check pg kafka chromium prometheus nginx jvm-archive
	$(TEST_ENV) $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile -m "not exclusive"
	$(TEST_ENV) $(PY) -m pytest -q -m exclusive -p no:cacheprovider
	$(TEST_ENV) DRAINPIPE_CLOCK=+365d $(PY) -m pytest -q -n $(TEST_WORKERS) --dist load -m "clock or wall_clock" -p no:cacheprovider
	$(TEST_ENV) DRAINPIPE_CLOCK=-365d $(PY) -m pytest -q -n $(TEST_WORKERS) --dist load -m "clock or wall_clock" -p no:cacheprovider

# A private PostgreSQL (Debian's package, installed if missing) on 127.0.0.1:55432 (or a free port when that one is
# taken), data in .pg/ (tests/postgres).
pg:
	scripts/postgres.sh start

pg-stop:
	scripts/postgres.sh stop

# A private single-node Apache Kafka broker in KRaft mode (its jars fetched from Maven Central by the script) on
# 127.0.0.1:9092 (or a free port when that one is taken), data in .kafka/ (tests/kafka).
kafka:
	scripts/kafka.sh start

kafka-stop:
	scripts/kafka.sh stop

# Headless Chromium + chromedriver from Debian for the dashboard browser test (tests/server).
chromium:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; else \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver; fi

# Prometheus from Debian, which the RED-metrics test starts to scrape `drainpipe serve` (tests/server). Only the
# binary is used: the package's own service is not started.
prometheus:
	@if [ -x /usr/bin/prometheus ]; then :; else \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; fi

# nginx and the wrk load tool from Debian, for the real access-log test (tests/engine/test_real_nginx.py). The test
# starts its own nginx with its own configuration; the package's service is not used.
nginx:
	@if [ -x /usr/sbin/nginx ] && [ -x /usr/bin/wrk ]; then :; else \
		DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nginx-light wrk; fi

# The class-data-sharing archive of Spark's JVM classes (drainpipe/spark/jvm_archive.py; the install builds it too),
# built once per machine (about 20 s): the many Spark JVMs the tests start (drivers, a standalone cluster, a
# Connect server) start in half the time. Speed only: without it the tests run the same, slower.
jvm-archive: install
	$(PY) tests/jvm_archive.py

bench: install
	$(PY) benchmarks/queue_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache build src/*.egg-info
