"""Benchmark-only trace of every ClickHouse HTTP request the writer makes (no production hook).

:mod:`benchmarks.batch_overhead` puts a ``sitecustomize.py`` that calls :func:`install`
on the ``PYTHONPATH`` of Spark's Python workers; each request then appends one JSON
line (pid, role, statement kind, session or not, start and seconds) to the file named
by ``CLICKHOUSE_TX_BENCH_TRACE``. ``role`` is ``executor`` inside a Spark task and
``driver`` elsewhere (the commit runs in a driver-side Python worker without a task).
"""

from __future__ import annotations

import json
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ENV = "CLICKHOUSE_TX_BENCH_TRACE"
_lock = threading.Lock()


def kind_of(sql: str) -> str:
    """A short label of a statement: its first words, table names dropped."""
    sql = re.sub(r"_ctx_(dl)?stage_\S+", "<stage>", sql)
    words = re.sub(r"\s+", " ", sql.strip()).split(" ")
    head = " ".join(words[:2]).upper() if words else ""
    if head.startswith("SELECT"):
        m = re.search(r"\bFROM\s+(\S+)", sql, re.IGNORECASE)
        return "SELECT " + (m.group(1).split(".")[-1].strip('`"') if m else words[1] if len(words) > 1 else "")
    if head.startswith(("ALTER", "CREATE", "DROP")):
        return " ".join(w for w in words[:3] if not w.startswith(("`", '"'))).upper() + (
            " <stage>" if "<stage>" in " ".join(words[:6]) else ""
        )
    if head.startswith("INSERT"):
        m = re.search(r"\bINTO\s+(\S+)", sql, re.IGNORECASE)
        return "INSERT " + (m.group(1).split(".")[-1].strip('`"') if m else "")
    return head


def _role() -> str:
    try:
        from pyspark import TaskContext

        return "executor" if TaskContext.get() is not None else "driver"
    except Exception:  # outside Spark
        return "driver"


def install() -> None:
    """Wrap ``ClickHouseHTTP._post`` to append one line per request to ``$CLICKHOUSE_TX_BENCH_TRACE``."""
    path = os.environ.get(ENV)
    if not path:
        return
    from clickhouse_tx.client import http as http_client

    original = http_client.ClickHouseHTTP._post

    def traced(self: Any, *, url_params: dict[str, str], data: Any, what: str) -> Any:
        started = time.time()
        ok = True
        try:
            return original(self, url_params=url_params, data=data, what=what)
        except BaseException:
            ok = False
            raise
        finally:
            body = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
            sql = url_params.get("query") or (body if isinstance(body, str) else "")
            line = json.dumps(
                {
                    "pid": os.getpid(),
                    "role": _role(),
                    "kind": kind_of(str(sql)),
                    "session": "session_id" in url_params,
                    "t": started,
                    "s": time.time() - started,
                    "ok": ok,
                }
            )
            with _lock, open(path, "a") as f:
                f.write(line + "\n")

    setattr(http_client.ClickHouseHTTP, "_post", traced)  # noqa: B010 - patching a method on purpose


def read(path: str | Path) -> list[dict[str, Any]]:
    p = Path(path)
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def per_batch(lines: Iterable[dict[str, Any]], batches: int) -> dict[str, Any]:
    """Requests per micro-batch by role and kind, and their summed seconds per batch."""
    lines = list(lines)
    counts: Counter[tuple[str, str]] = Counter((x["role"], x["kind"]) for x in lines)
    seconds: Counter[str] = Counter()
    for x in lines:
        seconds[x["role"]] += x["s"]
    by_role: dict[str, Any] = {}
    for (role, kind), n in sorted(counts.items()):
        by_role.setdefault(role, {})[kind] = round(n / batches, 2)
    return {
        "requests_per_batch": {r: round(sum(k.values()), 2) for r, k in by_role.items()},
        "request_seconds_per_batch": {r: round(s / batches, 4) for r, s in seconds.items()},
        "by_kind": by_role,
        "processes": len({x["pid"] for x in lines}),
    }
