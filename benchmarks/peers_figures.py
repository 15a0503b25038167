"""The pure pieces of :mod:`benchmarks.peers`: the peers, rates, the summary, the guarantee as measured."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: The ways into the same MergeTree table, in the order each round runs them:
#: name → (letter, what it is).
PEERS: dict[str, tuple[str, str]] = {
    "transaction": ("a", "kafka_py → clickhouse_tx, mode transaction"),
    "foreach_batch": ("b", "kafka_py → foreachBatch: toArrow() + clickhouse-connect insert_arrow"),
    "foreach_tx": ("e", "kafka_py → foreachBatch: clickhouse_tx_batch, the exactly-once helper"),
    "kafka_engine": ("c", "ClickHouse Kafka engine + materialized view, offsets in Kafka"),
    "kafka_engine_keeper": ("d", "ClickHouse Kafka engine + materialized view, offsets in Keeper"),
}

#: The peers that run a Spark job (the others run inside ClickHouse).
SPARK_PEERS = ("transaction", "foreach_batch", "foreach_tx")

#: Cap of the events one latency run produces: the dev broker keeps ~5 MiB (~60,000 of
#: these events) per partition and drops the oldest beyond that; 50,000 a partition is
#: what the throughput runs produce up front (400,000 in 8 partitions) and read whole.
MAX_RATE_EVENTS_PER_PARTITION = 50_000


def rows_per_s(rows: int, seconds: float | None) -> float | None:
    """``rows / seconds`` to one place; None when no time was measured."""
    return round(rows / seconds, 1) if seconds and seconds > 0 else None


def latency_plan(sustained: float | None, duration_s: float, warmup_s: float, partitions: int) -> tuple[float, int]:
    """(offered rate, events) of a latency run: half the peer's sustained rate for
    ``warmup_s + duration_s``, the events capped at what the dev broker keeps.

    A peer with no sustained rate (every throughput run failed) is offered 1,000/s.
    """
    rate = max(100.0, (sustained or 2000.0) / 2)
    events = int(rate * (warmup_s + duration_s))
    return rate, max(1, min(events, MAX_RATE_EVENTS_PER_PARTITION * partitions))


def guarantee(duplicates: int | None, lost: int | None) -> str:
    """What a run under faults showed: the delivery guarantee as measured, not as documented."""
    if duplicates is None or lost is None:
        return "not measured"
    if duplicates == 0 and lost == 0:
        return "exactly once (in this run)"
    if lost == 0:
        return "at least once (duplicates)"
    if duplicates == 0:
        return "at most once (losses)"
    return "neither (duplicates and losses)"


def _best(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x]
    return max(vals) if vals else None


def _median(xs: Iterable[float | None]) -> float | None:
    vals = [x for x in xs if x]
    return round(statistics.median(vals), 1) if vals else None


def sustained_rate(runs: Sequence[Mapping[str, Any]], peer: str) -> float | None:
    """A peer's sustained rate: the best throughput of its runs at any batch size."""
    return _best(r.get("rows_per_s") for r in runs if r["peer"] == peer and r.get("ok"))


def summarise(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per peer: throughput per batch size (best and median of the rounds), latency, faults."""
    out: dict[str, dict[str, Any]] = {}
    sizes = doc["config"]["batch_sizes"]
    for peer, (letter, what) in PEERS.items():
        if peer not in doc["config"]["peers"]:
            continue
        tput = [r for r in doc.get("throughput", []) if r["peer"] == peer]
        row: dict[str, Any] = {"letter": letter, "what": what, "throughput": {}}
        for size in sizes:
            runs = [r for r in tput if r["batch"] == size]
            ok = [r for r in runs if r.get("ok")]
            row["throughput"][str(size)] = {
                "best_rows_per_s": _best(r.get("rows_per_s") for r in ok),
                "median_rows_per_s": _median(r.get("rows_per_s") for r in ok),
                # Spark peers: after the first micro-batch (the engine has no batches: all)
                "best_steady_rows_per_s": _best(r.get("steady_rps", r.get("rows_per_s")) for r in ok),
                "median_first_batch_ms": _median(r.get("first_batch_ms") for r in ok),
                "rounds": len(runs),
                "failed": sum(1 for r in runs if not r.get("ok")),
            }
        lat = (doc.get("latency") or {}).get(peer) or {}
        row["latency"] = {k: lat.get(k) for k in ("rate", "p50_ms", "p99_ms", "records", "ok")}
        row["faults"] = _fault_row(((doc.get("faults") or {}).get("runs") or {}).get(peer))
        out[peer] = row
    return out


def _fault_row(run: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if not run:
        return None
    dup, lost = run.get("duplicates"), run.get("lost")
    return {
        "duplicates": dup,
        "lost": lost,
        "lost_event_ids": run.get("lost_event_ids"),
        "clickhouse_kills": len(run.get("clickhouse_kills") or []),
        "driver_kills": run.get("crashes", 0),
        "failed_runs_restarted": len(run.get("failures") or []),
        "guarantee": guarantee(dup, lost),
    }


def ratios(summary: Mapping[str, Mapping[str, Any]], sizes: Sequence[int]) -> dict[str, float | None]:
    """Each peer's best throughput over (b)'s, the issue's yardstick, per batch size:
    over every micro-batch, and after the first (``steady``)."""
    out: dict[str, float | None] = {}
    base = summary.get("foreach_batch")
    if not base:
        return out
    for size in sizes:
        for key, label in (("best_rows_per_s", ""), ("best_steady_rows_per_s", " steady")):
            b = base["throughput"][str(size)][key]
            for peer, row in summary.items():
                if peer != "foreach_batch":
                    x = row["throughput"][str(size)][key]
                    out[f"{peer}/foreach_batch at {size}{label}"] = round(x / b, 3) if x and b else None
    return out


def _fmt(x: float | None, unit: str = "") -> str:
    return "-" if x is None else f"{x:,.0f}{unit}"


def markdown_table(summary: Mapping[str, Mapping[str, Any]], sizes: Sequence[int]) -> str:
    """The table of docs/performance.md: one row per peer."""
    head = ["peer"] + [f"rows/s at {s:,} (after the 1st batch)" for s in sizes]
    head += [f"1st batch s at {s:,}" for s in sizes] + ["offered /s", "p50 ms", "p99 ms", "faults: dup / lost"]
    head.append("as measured")
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for peer, row in summary.items():
        cells = [f"({row['letter']}) {peer}"]
        for s in sizes:
            t = row["throughput"][str(s)]
            cells.append(f"{_fmt(t['best_rows_per_s'])} ({_fmt(t['best_steady_rows_per_s'])})")
        for s in sizes:
            first = row["throughput"][str(s)]["median_first_batch_ms"]
            cells.append("-" if first is None else f"{first / 1000:.1f}")
        lat = row["latency"]
        cells += [_fmt(lat.get("rate")), _fmt(lat.get("p50_ms")), _fmt(lat.get("p99_ms"))]
        f = row["faults"]
        cells += [f"{f['duplicates']} / {f['lost']}", f["guarantee"]] if f else ["-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
