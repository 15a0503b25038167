VENV ?= .venv
PY := $(VENV)/bin/python
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: bootstrap lint test test-slow demo bench clean

bootstrap:
	@VENV=$(VENV) bash .ci/bootstrap.sh

## make lint: ruff (lint and format check) and mypy (strict on clickhouse_tx); configured in pyproject.toml
lint: bootstrap
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

## make test: lint, then the default suite (unit, integration, spark); slow torture/benchmarks excluded
test: lint
	$(PY) -m pytest -q

## make test-slow: the torture and benchmark runs marked slow
test-slow: bootstrap
	$(PY) -m pytest -q -m slow

## make test-external: the integration, Spark and kill tests that leave the servers running, against your
## ClickHouse, Keeper and Kafka (CLICKHOUSE_TX_EXTERNAL_URL, _USER, _PASSWORD, _KEEPER, _KAFKA; docs/deployment.md)
## Replicated profile: CLICKHOUSE_TX_EXTERNAL_CLUSTER=<a cluster of your remote_servers> also runs the kill tests of
## modes staging and dedup into ReplicatedMergeTree targets made ON CLUSTER (tests/torture/test_replicated_kill.py)
.PHONY: test-external
test-external: bootstrap
	@test -n "$$CLICKHOUSE_TX_EXTERNAL_URL" || { echo "set CLICKHOUSE_TX_EXTERNAL_URL (docs/deployment.md)"; exit 2; }
	$(PY) -m pytest -q -m "(integration or spark) and not slow" tests/integration tests/spark tests/torture $(EXTERNAL_ARGS)

## make demo: Kafka -> Spark -> ClickHouse, exactly once, with driver crashes, on the embedded stack
demo: bootstrap
	$(PY) -m benchmarks.pipeline $(DEMO_ARGS)

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
