"""CPU-seconds a fresh Spark Python worker of the pipeline spends importing, piece by piece.

``python -m benchmarks.worker_imports`` starts, per kind of worker and per round, a fresh
interpreter as Spark starts its daemons (``PYTHONPATH`` = pyspark's ``pyspark.zip`` and
py4j first, then this checkout), imports what ``pyspark.daemon`` imports before it forks
(a fork inherits that), then the chain a fork of that kind imports, one piece after the
other, and reads ``time.process_time`` around each piece (CPU-seconds, not wall time, so
the figure holds on a shared machine). Per piece, the median of ``--rounds``.

The chains (:data:`CHAINS`) are what the workers of a ``kafka_py`` (librdkafka) →
``format("clickhouse_tx")`` run of :mod:`benchmarks.pipeline` hold in ``sys.modules``:
an executor's worker (the source's read and the sink's write: each worker serves both;
pandas comes from Spark's write function, whose ``pa.array`` imports it), the driver's
``write_into_data_source`` worker (``streamWriter``) and its streaming sink runner (the
commit). The executor's last piece, kafka-python, is imported only by a worker that reads
through it (``kafka.client=kafka-python``); before ``ConsumerPool.checkout`` imported it
for either client, every executor's worker paid it. A worker pays its chain once, when
it starts: Spark reuses workers across micro-batches (``spark.python.worker.reuse``)
until they idle for a minute (docs/performance.md, "Python workers: per process, not
per micro-batch").

Two settings of bytecode: ``none`` (as this environment runs with
``PYTHONDONTWRITEBYTECODE=1`` and a checkout without ``__pycache__``: the project's modules
compiled at every import, as pyspark's always are from ``pyspark.zip``) and ``cached``
(``PYTHONPYCACHEPREFIX`` in a temporary directory, warmed by one import first: a pip
install's ``.pyc``). Writes ``benchmarks/results/worker_imports.json`` (``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.results_file import machine, write_result

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent

#: What ``pyspark.daemon`` imported before it forks (a fork starts with these).
DAEMON = ("pyspark.daemon",)

#: Per kind of worker, its imports in the order it makes them: (piece, modules).
CHAINS: Mapping[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    "executor worker": (
        ("pyspark.worker", ("pyspark.worker",)),
        ("pyarrow, numpy", ("pyarrow",)),
        ("requests", ("requests",)),
        ("clickhouse_tx client", ("clickhouse_tx.client.http",)),
        ("kafka_py read (librdkafka)", ("spark_datasource.kafka.reader", "confluent_kafka")),
        ("sink write", ("spark_datasource.sink.writer", "clickhouse_tx.factory")),
        ("pandas (Spark's write function)", ("pandas",)),
        ("kafka-python (read through kafka-python only)", ("kafka",)),
    ),
    "write_into_data_source": (
        ("pyspark.sql.worker.write_into_data_source", ("pyspark.sql.worker.write_into_data_source",)),
        ("pyarrow, numpy", ("pyarrow",)),
        ("requests", ("requests",)),
        ("spark_datasource.datasource", ("spark_datasource.datasource",)),
        ("streamWriter", ("spark_datasource.sink.setup", "clickhouse_tx.factory")),
    ),
    "python_streaming_sink_runner": (
        ("pyspark.sql.worker.python_streaming_sink_runner", ("pyspark.sql.worker.python_streaming_sink_runner",)),
        ("pyarrow, numpy", ("pyarrow",)),
        ("requests", ("requests",)),
        ("spark_datasource.datasource", ("spark_datasource.datasource",)),
        ("the commit", ("spark_datasource.sink.setup", "clickhouse_tx.factory", "clickhouse_tx.protocol.batch_commit")),
    ),
}

#: Run in each fresh interpreter: argv[1] the daemon's modules, argv[2] the pieces as JSON.
_PROBE = """import importlib, json, sys, time
for m in sys.argv[1].split(','):
    importlib.import_module(m)
out = []
for mods in json.loads(sys.argv[2]):
    t = time.process_time()
    for m in mods:
        importlib.import_module(m)
    out.append(time.process_time() - t)
print(json.dumps(out))
"""


def spark_env(pycache: str | None) -> dict[str, str]:
    """The environment of a Spark Python worker: pyspark.zip and py4j first on the path."""
    import pyspark

    lib = Path(pyspark.__file__).parent / "python" / "lib"
    path = [str(lib / "pyspark.zip"), *(str(p) for p in sorted(lib.glob("py4j-*-src.zip"))), str(ROOT)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path))
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = pycache
    return env


def probe(chain: Sequence[tuple[str, Sequence[str]]], env: Mapping[str, str]) -> list[float]:
    """CPU-seconds of each piece of ``chain`` in one fresh interpreter."""
    pieces = json.dumps([list(mods) for _, mods in chain])
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, ",".join(DAEMON), pieces],
        env=dict(env),
        capture_output=True,
        text=True,
        check=True,
    )
    return [float(x) for x in json.loads(out.stdout)]


def measure(chain: Sequence[tuple[str, Sequence[str]]], env: Mapping[str, str], rounds: int) -> dict[str, Any]:
    """Per piece the median CPU-seconds over ``rounds`` interpreters, and the chain's total."""
    runs = [probe(chain, env) for _ in range(rounds)]
    pieces = {name: round(statistics.median(r[i] for r in runs), 4) for i, (name, _) in enumerate(chain)}
    totals = [sum(r) for r in runs]
    return {
        "pieces_cpu_s": pieces,
        "total_cpu_s": round(statistics.median(totals), 4),
        "total_range": [round(min(totals), 4), round(max(totals), 4)],
    }


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.worker_imports", description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7, help="fresh interpreters per kind and bytecode setting")
    ap.add_argument("--json", default=str(RESULTS / "worker_imports.json"))
    a = ap.parse_args(argv)
    if a.rounds <= 0:
        ap.error("--rounds must be positive")
    return a


def main(argv: Sequence[str] | None = None) -> int:
    a = _parse(argv)
    t0 = time.monotonic()
    doc: dict[str, Any] = {"config": {"rounds": a.rounds, "daemon": list(DAEMON)}, "bytecode": {}}
    with tempfile.TemporaryDirectory(prefix="chtx-pyc-") as pyc:
        for setting, env in (("none", spark_env(None)), ("cached", spark_env(pyc))):
            if setting == "cached":
                for chain in CHAINS.values():
                    probe(chain, env)  # writes the bytecode once
            doc["bytecode"][setting] = {kind: measure(chain, env, a.rounds) for kind, chain in CHAINS.items()}
            for kind, r in doc["bytecode"][setting].items():
                print(f"bytecode {setting:6} {kind:30} {r['total_cpu_s']:.3f} CPU-s  {r['pieces_cpu_s']}")
    doc["config"]["machine"] = machine()
    doc["wall_s"] = round(time.monotonic() - t0, 1)
    write_result(a.json, doc)
    print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
