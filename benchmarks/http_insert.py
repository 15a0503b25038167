"""ArrowStream insert rows/s: the local HTTP server vs chdb in-process, same data, same run.

The HTTP side runs the server in a child process (as Spark executors reach it) and
streams the Arrow IPC stream with chunked transfer; the in-process side feeds the same
bytes to ``send_insert`` in this process. Ratio = HTTP / in-process (target >= 0.7).

    python -m benchmarks.http_insert --rows 1000000 --repeat 5 --json benchmarks/results/http_insert.json

``--clients`` compares the two HTTP clients on the same insert into the same server: the
project's transport (``ClickHouseHTTP.insert_arrow_stream``: record batches streamed as
an ArrowStream, one batch in memory) and clickhouse-connect (``Client.insert_arrow``:
the whole table serialised to one Arrow buffer first). See ``docs/design.md``, Transport.

    python -m benchmarks.http_insert --clients --rows 1000000 --repeat 5 \
        --json benchmarks/results/http_insert_clients.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterator

import chdb
import pyarrow as pa
import requests

from benchmarks.results_file import write_result

DDL = "CREATE TABLE IF NOT EXISTS bench (id UInt64, ts DateTime64(3), payload String) ENGINE = MergeTree ORDER BY id"


def make_stream(rows: int, chunk_rows: int = 65536) -> bytes:
    ids = pa.array(range(rows), pa.uint64())
    ts = pa.array(range(1_700_000_000_000, 1_700_000_000_000 + rows), pa.timestamp("ms"))
    payload = pa.array([f"event-{i % 1000}" for i in range(rows)])
    table = pa.table({"id": ids, "ts": ts, "payload": payload})
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table, max_chunksize=chunk_rows)
    return sink.getvalue()


def chunks(data: bytes, size: int = 1 << 20) -> Iterator[bytes]:
    for i in range(0, len(data), size):
        yield data[i : i + size]


def start_server(data_dir: str) -> tuple[subprocess.Popen[Any], str]:
    ready = os.path.join(data_dir, "ready.json")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "server_patches.http_server",
            "--data-dir",
            os.path.join(data_dir, "http"),
            "--port",
            "0",
            "--ready-file",
            ready,
            "--log-level",
            "WARNING",
        ]
    )
    deadline = time.monotonic() + 60
    while not os.path.exists(ready):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("local ClickHouse HTTP server did not start")
        time.sleep(0.1)
    with open(ready) as f:
        port = json.load(f)["port"]
    return proc, f"http://127.0.0.1:{port}/"


def run(rows: int, repeat: int) -> dict[str, Any]:
    data = make_stream(rows)
    with tempfile.TemporaryDirectory(prefix="ctx-bench-") as tmp:
        proc, url = start_server(tmp)
        try:
            http = requests.Session()
            http.post(url, data=DDL).raise_for_status()
            conn = chdb.connect(f"file:{os.path.join(tmp, 'inproc')}")
            conn.query(DDL)
            http_s: list[float] = []
            local_s: list[float] = []
            for i in range(repeat):
                # Alternate so neither side always runs on a warmer machine.
                t0 = time.perf_counter()
                r = http.post(url, params={"query": "INSERT INTO bench FORMAT ArrowStream"}, data=chunks(data))
                r.raise_for_status()
                http_s.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                ins = conn.send_insert("INSERT INTO bench", "ArrowStream")
                for c in chunks(data):
                    ins.append(c)
                ins.finish()
                local_s.append(time.perf_counter() - t0)
                print(
                    f"  round {i + 1}/{repeat}: http {rows / http_s[-1]:,.0f} rows/s, "
                    f"in-process {rows / local_s[-1]:,.0f} rows/s",
                    flush=True,
                )
            http_count = int(http.post(url, data="SELECT count() FROM bench").text)
            local_count = int(str(conn.query("SELECT count() FROM bench", "CSV")).strip())
            conn.close()
            assert http_count == local_count == rows * repeat, (http_count, local_count)
        finally:
            proc.terminate()
            proc.wait(30)
    http_rate = rows / statistics.median(http_s)
    local_rate = rows / statistics.median(local_s)
    return {
        "benchmark": "http_insert_arrowstream",
        "rows_per_insert": rows,
        "repeat": repeat,
        "bytes_per_insert": len(data),
        "http_rows_per_s_median": round(http_rate),
        "inprocess_rows_per_s_median": round(local_rate),
        "ratio_http_vs_inprocess": round(http_rate / local_rate, 3),
        "target_ratio": 0.7,
        "http_seconds": http_s,
        "inprocess_seconds": local_s,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "chdb": chdb.__version__},
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def run_clients(rows: int, repeat: int) -> dict:
    """The same Arrow table inserted by both clients into one server, alternating."""
    import urllib.parse

    import clickhouse_connect

    from clickhouse_tx.client.http import ClickHouseHTTP
    from clickhouse_tx.interfaces import Target

    table = pa.ipc.open_stream(make_stream(rows)).read_all()
    with tempfile.TemporaryDirectory(prefix="ctx-bench-") as tmp:
        proc, url = start_server(tmp)
        try:
            ours = ClickHouseHTTP(Target(url=url, database="default", table="bench"))
            ours.command(DDL)
            port = urllib.parse.urlsplit(url).port
            theirs = clickhouse_connect.get_client(host="127.0.0.1", port=port, compress=False)
            ours_s: list[float] = []
            theirs_s: list[float] = []
            for i in range(repeat):
                t0 = time.perf_counter()
                sent = ours.insert_arrow_stream("bench", table.schema, iter(table.to_batches(max_chunksize=65536)))
                ours_s.append(time.perf_counter() - t0)
                assert sent == rows
                t0 = time.perf_counter()
                theirs.insert_arrow("bench", table)
                theirs_s.append(time.perf_counter() - t0)
                print(
                    f"  round {i + 1}/{repeat}: clickhouse_tx transport {rows / ours_s[-1]:,.0f} rows/s, "
                    f"clickhouse-connect {rows / theirs_s[-1]:,.0f} rows/s",
                    flush=True,
                )
            count = int(ours.command("SELECT count() FROM bench").strip())
            assert count == 2 * rows * repeat, count
            theirs.close()
            ours.close()
        finally:
            proc.terminate()
            proc.wait(30)
    ours_rate, theirs_rate = rows / statistics.median(ours_s), rows / statistics.median(theirs_s)
    return {
        "benchmark": "http_insert_clients",
        "rows_per_insert": rows,
        "repeat": repeat,
        "transport_rows_per_s_median": round(ours_rate),
        "clickhouse_connect_rows_per_s_median": round(theirs_rate),
        "ratio_transport_vs_clickhouse_connect": round(ours_rate / theirs_rate, 3),
        "transport_seconds": ours_s,
        "clickhouse_connect_seconds": theirs_s,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "clickhouse_connect": clickhouse_connect.__version__,
        },
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", help="write the result here")
    ap.add_argument(
        "--clients",
        action="store_true",
        help="compare the project's transport with clickhouse-connect on the same insert",
    )
    args = ap.parse_args(argv)
    if args.clients:
        print(f"Arrow insert, {args.rows:,} rows x {args.repeat}: clickhouse_tx transport vs clickhouse-connect")
        result = run_clients(args.rows, args.repeat)
        print(json.dumps({k: v for k, v in result.items() if not k.endswith("_seconds")}, indent=2))
        if args.json:
            write_result(args.json, result)
        return 0
    print(f"ArrowStream insert, {args.rows:,} rows x {args.repeat}: HTTP server vs chdb in-process")
    result = run(args.rows, args.repeat)
    print(json.dumps({k: v for k, v in result.items() if not k.endswith("_seconds")}, indent=2))
    if args.json:
        write_result(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
