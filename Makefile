VENV ?= .venv
PY := $(VENV)/bin/python
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: bootstrap lint test test-unit test-slow demo bench clean

bootstrap:
	@VENV=$(VENV) bash .ci/bootstrap.sh

## make lint: ruff (lint and format check) and mypy (strict on clickhouse_tx); configured in pyproject.toml
lint: bootstrap
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

## make test-unit: the pure tests and the model checker at a smaller bound, no servers (the edit loop)
test-unit: bootstrap
	CLICKHOUSE_TX_MODEL_EXAMPLES=150 $(PY) -m pytest -q tests/unit

## make test: lint, then the default suite (unit, integration, spark, one kill case); the other kill cases,
## chaos and benchmark runs are marked slow
test: lint
	$(PY) -m pytest -q

## make test-slow: the kill, chaos and benchmark runs marked slow; PART=I runs the I-th of SLOW_PARTS parts
## (whole modules, about as many tests each), e.g. make test-slow PART=2
SLOW_PARTS ?= 4
test-slow: bootstrap
	$(PY) -m pytest -q -m slow $(if $(PART),--part $(PART)/$(SLOW_PARTS))

## make test-external: the integration, Spark and kill tests that leave the servers running, against your
## ClickHouse, Keeper and Kafka (CLICKHOUSE_TX_EXTERNAL_URL, _USER, _PASSWORD, _KEEPER, _KAFKA; docs/deployment.md)
## Replicated profile: CLICKHOUSE_TX_EXTERNAL_CLUSTER=<a cluster of your remote_servers> also runs the kill tests of
## modes staging and dedup into ReplicatedMergeTree targets made ON CLUSTER (tests/torture/test_replicated_kill.py)
.PHONY: test-external
test-external: bootstrap
	@test -n "$$CLICKHOUSE_TX_EXTERNAL_URL" || { echo "set CLICKHOUSE_TX_EXTERNAL_URL (docs/deployment.md)"; exit 2; }
	$(PY) -m pytest -q -m "(integration or spark) and (not slow or kill)" tests/integration tests/spark tests/torture $(EXTERNAL_ARGS)

## make test-compat: the integration and Spark tiers (not slow) once per version of COMPAT_VERSIONS (the oldest
## version docs/compatibility.md supports, 22.9, and each LTS since), the stacks
## started with ClickHouse's compatibility setting at that version (docs/server.md); prints each version's wall time
## and fails if any version failed, after running them all. e.g. make test-compat COMPAT_VERSIONS=25.8
COMPAT_VERSIONS ?= 22.9 23.3 23.8 24.3 24.8 25.3 25.8
.PHONY: test-compat
test-compat: bootstrap
	@failed=""; times=""; \
	for v in $(COMPAT_VERSIONS); do \
	  echo "== compatibility $$v"; start=$$(date +%s); \
	  $(PY) -m pytest -q -m 'not slow' --compatibility $$v tests/integration tests/spark || failed="$$failed $$v"; \
	  took=$$(( $$(date +%s) - start )); times="$$times  $$v: $$took s"; \
	  echo "== compatibility $$v: $$took s wall"; \
	done; \
	echo "== wall time per compatibility:$$times"; \
	if [ -n "$$failed" ]; then echo "== failed under compatibility:$$failed"; exit 1; fi

## make demo: Kafka -> Spark -> ClickHouse, exactly once, with driver crashes, on the embedded stack
## DEMO_KAFKA_CLIENT=librdkafka|kafka-python|auto: kafka_py's kafka.client (default: the source's own, auto)
## DEMO_ARGS="...": more options of python -m benchmarks.pipeline (--help)
demo: bootstrap
	$(PY) -m benchmarks.pipeline $(if $(DEMO_KAFKA_CLIENT),--kafka-client $(DEMO_KAFKA_CLIENT)) $(DEMO_ARGS)

## make chaos: seeded fault schedules over the embedded stack (docs/chaos.md); not part of make test.
## CHAOS_SCHEDULES=N (default 100), CHAOS_SEED=S (first seed, default 1): CHAOS_SEED=S CHAOS_SCHEDULES=1 replays one
## CHAOS_LANES=L (default 2): schedules run side by side, each lane on its own stack
CHAOS_SCHEDULES ?= 100
CHAOS_SEED ?= 1
CHAOS_LANES ?= 2
.PHONY: chaos
chaos: bootstrap
	$(PY) -m benchmarks.chaos --schedules $(CHAOS_SCHEDULES) --seed $(CHAOS_SEED) --lanes $(CHAOS_LANES)

bench: bootstrap
	$(PY) -m benchmarks.http_insert --json benchmarks/results/http_insert.json

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
