"""The pure pieces of :mod:`benchmarks.streaming_speed`: its constants, a micro-batch's split, ratios, the ramp."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

MODES = ("none", "transaction", "staging", "dedup")
TRIGGERS = (0.5, 1.0, 5.0, 10.0)
RESULTS = Path(__file__).resolve().parent / "results"
#: Seconds of each pipeline run before what it measures: the first micro-batches with
#: data start Python workers (imports, Kafka consumers, ClickHouse connections).
WARMUP_S = 10.0

#: Micro-batches measured by the floor query (after batch_overhead's warm-up batches).
FLOOR_BATCHES = 10

#: durationMs entries Spark reports for a micro-batch, in the order they happen.
SPLIT_KEYS = ("latestOffset", "getBatch", "queryPlanning", "walCommit", "addBatch", "commitOffsets", "triggerExecution")


def batch_split(progress: Sequence[Mapping[str, Any]], skip_first: bool = True) -> dict[str, Any]:
    """Throughput and mean ``durationMs`` per entry over the batches that read rows.

    ``skip_first`` leaves out the first such batch (Python worker start, imports).
    """
    batches = [p for p in progress if p.get("numInputRows")]
    if skip_first and len(batches) > 1:
        batches = batches[1:]
    if not batches:
        return {"batches": 0, "rows": 0, "rows_per_s": None, "mean_ms": {}}
    rows = sum(int(p["numInputRows"]) for p in batches)
    trig = sum(float((p.get("durationMs") or {}).get("triggerExecution") or 0) for p in batches)
    mean = {
        k: round(statistics.fmean(float((p.get("durationMs") or {}).get(k) or 0) for p in batches), 1)
        for k in SPLIT_KEYS
    }
    return {
        "batches": len(batches),
        "rows": rows,
        "rows_per_s": round(1000 * rows / trig, 1) if trig else None,
        "mean_ms": mean,
    }


def _div(a: float | None, b: float | None) -> float | None:
    """``a / b`` to 3 places, or None when either is missing (a run that failed)."""
    return round(a / b, 3) if a and b else None


def ratios(doc: Mapping[str, Any]) -> dict[str, float | None]:
    """The ratios the issue asks for, from one run's figures (None when a part is missing)."""
    # The noop rounds' medians, when the run has them; else its one run of each.
    rounds = (doc.get("noop_rounds") or {}).get("median") or {}
    ceiling = rounds.get("batch") or (doc.get("batch_noop") or {}).get("rows_per_s")
    avail = {r["sink"]: r.get("rows_per_s") for r in doc.get("available_now", [])}
    split = {k: v.get("rows_per_s") for k, v in ((doc.get("noop_rounds") or {}).get("split_median") or {}).items()}
    out: dict[str, float | None] = {
        "stream_noop/batch_noop": _div(rounds.get("default") or avail.get("noop"), ceiling),
        # the job as it runs by default: the JSON decoded in the source
        "stream_transaction/batch_noop": _div(split.get("decoded_transaction") or avail.get("transaction"), ceiling),
        "available_now transaction/none": _div(avail.get("transaction"), avail.get("none")),
    }
    for label in split:
        if label not in ("noop", "decoded_transaction") and split.get(label):
            out[f"stream {label}/batch_noop"] = _div(split.get(label), ceiling)
    if split.get("transaction"):
        out["split transaction/none"] = _div(split.get("transaction"), split.get("none"))
    if split.get("decoded_transaction"):
        decoded = (split.get("decoded_transaction"), split.get("decoded_none"))
        out["split decoded_transaction/decoded_none"] = _div(*decoded)
    for label in (c for c in rounds if c not in ("batch", "default")):
        out[f"stream_noop {label}/batch_noop"] = _div(rounds.get(label), ceiling)
    batch_sinks = (doc.get("noop_rounds") or {}).get("batch_sink_median") or {}
    out.update(_sink_ceiling_ratios(batch_sinks, split, ceiling))
    one = {r["sink"]: r.get("rows_per_s") for r in doc.get("available_now_one_batch", [])}
    out["stream_noop one batch/batch_noop"] = _div(one.get("noop"), ceiling)
    paced = {r["sink"]: r.get("rows_per_s") for r in (doc.get("available_now_paced") or {}).get("by_sink", [])}
    for sink in ("noop", "transaction"):
        out[f"available_now {sink} paced/bulk"] = _div(paced.get(sink), avail.get(sink))
    for mode in ("staging", "dedup"):
        out[f"available_now {mode}/none"] = _div(avail.get(mode), avail.get("none"))
    fixed_runs = (doc.get("fixed_cost") or {}).get("by_sink", [])
    fixed = {r["sink"]: (r.get("mean_ms") or {}).get("triggerExecution") for r in fixed_runs}
    floor = (doc.get("spark_floor") or {}).get("mean_ms") or {}
    out["fixed_cost noop/spark_floor"] = _div(fixed.get("noop"), floor.get("triggerExecution"))
    by = {(r["mode"], r["trigger_s"]): steady(r).get("processing_rps") for r in doc.get("triggers", [])}
    for trig in sorted({t for _, t in by}):
        out[f"trigger {trig:g}s transaction/none"] = _div(by.get(("transaction", trig)), by.get(("none", trig)))
    return out


def _sink_ceiling_ratios(
    batch_sinks: Mapping[str, float | None], split: Mapping[str, float | None], ceiling: float | None
) -> dict[str, float | None]:
    """The batch jobs into ``clickhouse_tx`` over the batch job into noop, and each
    streaming run of the decoded job over the batch job into the same mode with the
    same ``kafka_py`` options."""
    out: dict[str, float | None] = {}
    for label, (mode, options) in BATCH_SINKS.items():
        batch_sink = batch_sinks.get(label)
        if not batch_sink:
            continue
        out[f"batch {label}/batch_noop"] = _div(batch_sink, ceiling)
        for run, (sink, decode, _, run_options) in SPLIT_RUNS.items():
            if (sink, decode, run_options) == (mode, "source", options) and split.get(run):
                out[f"stream {run}/batch {label}"] = _div(split.get(run), batch_sink)
    return out


def steady(run: Mapping[str, Any]) -> Mapping[str, Any]:
    """A pipeline run's batch figures after its warm-up (the whole run's when it had none)."""
    return run.get("steady") or run


def kept_up(run: Mapping[str, Any], trigger_s: float) -> bool:
    """A run at an offered rate kept up: every record arrived, batches after the warm-up fit in the trigger."""
    mean = steady(run).get("mean_batch_ms")
    return bool(run.get("ok")) and mean is not None and mean <= 1000 * trigger_s


def ramp(
    measure: Callable[[float], Mapping[str, Any]], start: float, steps: int, trigger_s: float
) -> tuple[float | None, list[dict[str, Any]]]:
    """Double the offered rate from ``start`` until a run does not keep up (at most ``steps``).

    Returns the highest rate that kept up (None if the first did not) and every run.
    """
    best: float | None = None
    runs: list[dict[str, Any]] = []
    rate = start
    for _ in range(steps):
        r = dict(measure(rate))
        r["kept_up"] = kept_up(r, trigger_s)
        runs.append(r)
        if not r["kept_up"]:
            break
        best = rate
        rate *= 2
    return best, runs


#: The noop rounds' streaming variants: label → (``maxOffsetsPerTrigger`` as a multiple of
#: ``--max-offsets``, ``kafka_py`` options; ``"cores"`` stands for the session's default
#: parallelism). ``minRecordsPerPartition`` 1 is Spark's own cut (a task per Kafka
#: partition) and 2000 the earlier default; the larger batches, cut into one
#: task per core, show what Spark's per-batch checkpoint writes and pyspark's per-task
#: cost leave of the batch job's rate once a batch holds more records.
VARIANTS: dict[str, tuple[int, dict[str, str]]] = {
    "default": (1, {}),
    "minRecordsPerPartition=1": (1, {"minRecordsPerPartition": "1"}),
    "minRecordsPerPartition=2000": (1, {"minRecordsPerPartition": "2000"}),
    "2x maxOffsetsPerTrigger": (2, {}),
    "2x maxOffsetsPerTrigger, maxPartitions=cores": (2, {"maxPartitions": "cores"}),
    "4x maxOffsetsPerTrigger, maxPartitions=cores": (4, {"maxPartitions": "cores"}),
}


#: The batch jobs each noop round runs beside the batch ``kafka_py`` → noop: the
#: pipeline's events, JSON decoded in the source, into ``clickhouse_tx``: label → (mode,
#: more ``kafka_py`` options). They are what the streaming runs into the same sink and
#: cut can reach on this machine, where ClickHouse, the broker and Spark share the cores.
BATCH_SINKS: dict[str, tuple[str, dict[str, str]]] = {
    "none": ("none", {}),
    "transaction": ("transaction", {}),
    "transaction, maxPartitions=cores": ("transaction", {"maxPartitions": "cores"}),
}


#: The split of a micro-batch into the stages of the pipeline's job, one availableNow
#: query each per noop round after the raw read (the "default" variant): label → (sink,
#: where the JSON is decoded (``streaming_job.DECODE_OPTIONS``), ``maxOffsetsPerTrigger``
#: as a multiple of ``--max-offsets``, more ``kafka_py`` options). With ``from_json``:
#: the parse (Spark's JVM no-op sink), the hop of the rows to a Python writer that
#: counts them, the sink in two modes. Then the same job with the JSON decoded in the
#: source, and that job in batches of four times the records, one task per core.
SPLIT_RUNS: dict[str, tuple[str, str, int, dict[str, str]]] = {
    "parsed_noop": ("parsed_noop", "spark", 1, {}),
    "parsed_noop_python": ("parsed_noop_python", "spark", 1, {}),
    "none": ("none", "spark", 1, {}),
    "transaction": ("transaction", "spark", 1, {}),
    "decoded_noop": ("parsed_noop", "source", 1, {}),
    "decoded_none": ("none", "source", 1, {}),
    "decoded_transaction": ("transaction", "source", 1, {}),
    "decoded_transaction, 4x maxOffsetsPerTrigger, maxPartitions=cores": (
        "transaction",
        "source",
        4,
        {"maxPartitions": "cores"},
    ),
}
