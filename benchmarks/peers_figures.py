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

#: ``kafka_py``'s clients (its ``kafka.client`` option). A Spark peer named
#: ``PEER@CLIENT`` (``transaction@kafka-python``) is that peer with its source on that
#: client, so one run can hold the same peer on both clients, interleaved.
KAFKA_CLIENTS = ("auto", "librdkafka", "kafka-python")


def base_peer(name: str) -> str:
    """The peer of ``name`` without its client: ``transaction@kafka-python`` → ``transaction``."""
    return name.split("@", 1)[0]


def peer_client(name: str) -> str | None:
    """The ``kafka.client`` a ``PEER@CLIENT`` name sets, None for a plain peer name."""
    return name.split("@", 1)[1] if "@" in name else None


def known_peer(name: str) -> bool:
    """A peer of :data:`PEERS`, or a Spark peer at one of :data:`KAFKA_CLIENTS`."""
    client = peer_client(name)
    return base_peer(name) in PEERS and (client is None or (base_peer(name) in SPARK_PEERS and client in KAFKA_CLIENTS))


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
    for peer in doc["config"]["peers"]:
        letter, what = PEERS[base_peer(peer)]
        if peer_client(peer):
            what = f"{what}; kafka.client={peer_client(peer)}"
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


#: The peers every other peer's throughput is divided by (:func:`ratios`).
YARDSTICKS = ("foreach_batch", "kafka_engine")


def ratios(summary: Mapping[str, Mapping[str, Any]], sizes: Sequence[int]) -> dict[str, float | None]:
    """Each peer's best throughput over (b)'s and over (c)'s (the yardsticks that are in
    the run), per batch size: over every micro-batch, and after the first (``steady``;
    the engine has no batches, so its figure is the same in both)."""
    out: dict[str, float | None] = {}
    for yardstick in YARDSTICKS:
        base = summary.get(yardstick)
        if not base:
            continue
        for size in sizes:
            for key, label in (("best_rows_per_s", ""), ("best_steady_rows_per_s", " steady")):
                b = base["throughput"][str(size)][key]
                for peer, row in summary.items():
                    if peer != yardstick:
                        x = row["throughput"][str(size)][key]
                        out[f"{peer}/{yardstick} at {size}{label}"] = round(x / b, 3) if x and b else None
    return out


def round_ratios(doc: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each peer over each yardstick within a round (the runs next to each other, so under
    the same outside load), per batch size: the ratio of every round and their median.
    Under a load that changes from run to run this is steadier than best over best."""
    runs = [r for r in doc.get("throughput", []) if r.get("ok") and r.get("rows_per_s")]
    rate = {(r["peer"], r["batch"], r["round"]): r["rows_per_s"] for r in runs}
    out: dict[str, dict[str, Any]] = {}
    peers, sizes = doc["config"]["peers"], doc["config"]["batch_sizes"]
    rounds = sorted({r["round"] for r in runs})
    for yardstick in (y for y in YARDSTICKS if y in peers):
        for peer in (p for p in peers if p != yardstick):
            for size in sizes:
                per = [
                    round(rate[(peer, size, n)] / rate[(yardstick, size, n)], 3)
                    for n in rounds
                    if (peer, size, n) in rate and (yardstick, size, n) in rate
                ]
                if per:
                    out[f"{peer}/{yardstick} at {size}"] = {"rounds": per, "median": round(statistics.median(per), 3)}
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
