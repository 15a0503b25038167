"""Benchmark: the driver memory of the exactly-once ``foreachBatch`` helper per byte of micro-batch.

The helper collects a micro-batch to the driver as Arrow, converts it, and (mode ``dedup``)
orders it, so the driver's Python process holds several copies at its peak. This measures
that peak against the micro-batch's Arrow bytes, which is what ``driver_max_bytes``
bounds: one child process per mode and row count (a clean peak), each building a
session, a ``--rows`` DataFrame of eight columns (the pipeline's kinds: ints, a timestamp,
strings, a double, a boolean), calling the helper once on it as micro-batch 0, then
collecting it again to count its Arrow bytes. ``ru_maxrss`` before and after the call
gives the growth of the peak.

    python -m benchmarks.foreach_memory                       # 200000,1000000 rows
    python -m benchmarks.foreach_memory --rows 500000 --modes transaction

Writes ``benchmarks/results/foreach_memory.json``: per mode and row count the Arrow bytes,
the peak's growth and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.bench_session import bench_session
from benchmarks.results_file import machine, write_result

OUT = Path(__file__).parent / "results" / "foreach_memory.json"
COLUMNS = (
    "id",
    "cast(id % 64 as int) p",
    "cast(id * 1000 as timestamp) ts",
    "concat('user-', cast(id % 100000 as string)) user",
    "concat('event payload ', cast(id as string), ' ', repeat('x', 40)) payload",
    "cast(id as double) / 7 score",
    "cast(id % 1000 as int) k",
    "id % 2 = 0 flag",
)
DDL = (
    "CREATE TABLE {t} (id Int64, p Int32, ts DateTime64(6), user String, payload String, score Float64, "
    "k Int32, flag Bool) ENGINE = MergeTree ORDER BY id SETTINGS non_replicated_deduplication_window = 1000"
)


def child(args: dict[str, Any]) -> dict[str, Any]:
    """One measurement (in a fresh process): the helper on ``rows`` rows in ``mode``."""
    from spark_datasource.foreach.collect import collect_arrow
    from spark_datasource.foreach.helper import clickhouse_tx_batch
    from spark_datasource.testing.credentials import writer_options
    from spark_datasource.testing.session import local_session

    spark = local_session("foreach_memory", {"spark.driver.maxResultSize": "4g"})
    df = spark.range(args["rows"], numPartitions=4).selectExpr(*COLUMNS)
    chk = Path(args["chk"])
    chk.mkdir(parents=True)
    (chk / "metadata").write_text(json.dumps({"id": f"foreach-memory-{args['mode']}-{args['rows']}"}) + "\n")
    fn = clickhouse_tx_batch(
        url=args["url"],
        table=args["table"],
        app_id=f"memory-{args['mode']}-{args['rows']}",
        mode=args["mode"],
        checkpoint_location=str(chk),
        driver_max_bytes=1 << 40,
        **writer_options(),
    )
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.monotonic()
    fn(df, 0)
    seconds = time.monotonic() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    arrow = sum(b.nbytes for b in collect_arrow(df) or [])
    spark.stop()
    return {
        "arrow_bytes": arrow,
        "peak_growth_bytes": peak - before,
        "ratio": round((peak - before) / arrow, 2),
        "seconds": round(seconds, 2),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="200000,1000000")
    p.add_argument("--modes", default="transaction,dedup")
    p.add_argument("--json", default=str(OUT))
    a = p.parse_args()
    results: list[dict[str, Any]] = []
    with bench_session("ctx-foreach-memory-") as s:
        from benchmarks.spark_write import run_sql

        url = s.info.clickhouse_url
        for mode in a.modes.split(","):
            for rows in (int(r) for r in a.rows.split(",")):
                table = f"default.memory_{mode}_{rows}"
                run_sql(url, DDL.format(t=table))
                args = {
                    "url": url,
                    "table": table,
                    "mode": mode,
                    "rows": rows,
                    "chk": str(s.work / f"chk-{mode}-{rows}"),
                }
                out = subprocess.run(
                    [sys.executable, "-m", "benchmarks.foreach_memory", "--child", json.dumps(args)],
                    capture_output=True,
                    text=True,
                    env=os.environ,
                )
                if out.returncode != 0:
                    raise RuntimeError(f"{mode} at {rows} rows failed:\n{out.stderr[-6000:]}")
                one = {"mode": mode, "rows": rows, **json.loads(out.stdout.strip().splitlines()[-1])}
                s.say(json.dumps(one))
                results.append(one)
    doc = {
        "machine": machine(),
        "command": "python -m benchmarks.foreach_memory " + " ".join(sys.argv[1:]),
        "results": results,
    }
    print("wrote", write_result(a.json, doc))


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        print(json.dumps(child(json.loads(sys.argv[2]))))
    else:
        main()
