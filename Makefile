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

## make demo: Kafka -> Spark -> ClickHouse, exactly once, with driver crashes, on the embedded stack
demo: bootstrap
	$(PY) -m benchmarks.pipeline $(DEMO_ARGS)

bench: bootstrap
	$(PY) -m benchmarks.http_insert --json benchmarks/results/http_insert.json

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
