VENV ?= .venv
PY := $(VENV)/bin/python
export PYSPARK_PYTHON := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: bootstrap test test-slow demo bench clean

bootstrap:
	@VENV=$(VENV) bash .ci/bootstrap.sh

## make test: the default suite (unit, integration, spark); slow torture/benchmarks excluded
test: bootstrap
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
