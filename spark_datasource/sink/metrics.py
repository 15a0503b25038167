"""Per-batch metrics of the ``clickhouse_tx`` writer: built, logged and appended to a file.

Spark runs every ``commit``/``abort`` in a fresh Python worker on the driver, so
nothing kept in memory there reaches the user. Each finished batch (committed or
aborted) is therefore logged on the logger ``clickhouse_tx.spark`` and appended as one
JSON line to ``<decision_log>/metrics.jsonl``; :func:`read_metrics` reads them back
from the checkpoint location (or the decision log URI) in any Python process.

Where things run
----------------
- :func:`batch_metrics`, :func:`append_metrics`: driver, once per batch commit/abort.
- :func:`read_metrics`: anywhere (the user's driver program, a test, a notebook).

Fields of one line
------------------
``txn_id``, ``batch``, ``status`` (``committed`` | ``aborted``), ``mode``, ``table``,
``rows``, ``bytes`` (Arrow bytes the executors sent), ``partitions`` (messages
received), ``committed_partitions``, ``prepare_seconds_max`` / ``prepare_seconds_p50``
(executors' ``prepare_seconds``), ``commit_seconds`` (the driver's commit call),
``retried_attempts`` (messages whose task attempt was > 0: retried or speculative
tasks), ``rolled_back`` (xids rolled back by this commit/abort: speculative
duplicates, failed attempts found in the registry, replaced xids), ``replay``
(the batch had a decision already), ``durations`` (the coordinator's steps) and
``written_at`` (epoch seconds).
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import time
from typing import Any, Mapping, Sequence

import pyarrow.fs as pafs

from clickhouse_tx.store import checkpoint_paths
from clickhouse_tx.store.checkpoint_paths import METRICS_FILE

log = logging.getLogger("clickhouse_tx.spark")

__all__ = ["METRICS_FILE", "append_metrics", "batch_metrics", "metrics_path", "read_metrics"]


def batch_metrics(
    *,
    txn_id: str,
    batch: int,
    status: str,
    mode: str,
    table: str,
    messages: Sequence[Mapping[str, Any]],
    committed_partitions: int,
    rows: int,
    commit_seconds: float,
    rolled_back: int,
    replay: bool = False,
    durations: Mapping[str, float] | None = None,
) -> dict[str, Any]:
    """One batch's metrics as a JSON-ready dict (pure; driver).

    Parameters
    ----------
    messages
        Per received commit message: ``rows``, ``bytes``, ``prepare_seconds``, ``attempt``,
        ``dead_letters`` (rows set aside by ``bad_rows=dead_letter``; counted when the
        batch committed, since they commit with their partition).
    committed_partitions, rows
        What the commit made visible (0 for an abort).
    """
    prep = sorted(float(m.get("prepare_seconds", 0.0)) for m in messages)
    return {
        "txn_id": txn_id,
        "batch": int(batch),
        "status": status,
        "mode": mode,
        "table": table,
        "rows": int(rows),
        "dead_letters": sum(int(m.get("dead_letters", 0)) for m in messages) if status == "committed" else 0,
        "bytes": int(sum(int(m.get("bytes", 0)) for m in messages)),
        "partitions": len(messages),
        "committed_partitions": int(committed_partitions),
        "prepare_seconds_max": prep[-1] if prep else 0.0,
        "prepare_seconds_p50": statistics.median(prep) if prep else 0.0,
        "commit_seconds": float(commit_seconds),
        "retried_attempts": sum(1 for m in messages if int(m.get("attempt", 0)) > 0),
        "rolled_back": int(rolled_back),
        "replay": bool(replay),
        "durations": {k: round(float(v), 6) for k, v in (durations or {}).items()},
        "written_at": time.time(),
    }


def metrics_path(decision_log_uri: str) -> str:
    """``<decision_log_uri>/clickhouse_tx/metrics.jsonl``, beside the decision logs.

    The decision log root is the checkpoint location itself for streaming queries, so
    the file goes in the library's own subdirectory, not among Spark's files
    (:mod:`clickhouse_tx.store.checkpoint_paths`).
    """
    return checkpoint_paths.metrics_path(decision_log_uri)


def append_metrics(decision_log_uri: str, record: Mapping[str, Any]) -> None:
    """Log ``record`` and append it as one JSON line (driver, once per batch).

    Never raises: metrics must not fail a commit that already happened; a write
    failure is logged as a warning. Locally the line is one ``O_APPEND`` write (whole
    lines even with several writers); on filesystems without append (object stores)
    each batch gets its own object ``metrics.jsonl.<txn_id>.<batch>.<status>``, which
    :func:`read_metrics` reads too.
    """
    line = json.dumps(record, sort_keys=True) + "\n"
    log.info("clickhouse_tx batch metrics: %s", line.strip())
    try:
        fs, root = checkpoint_paths.open_location(decision_log_uri)
        path = checkpoint_paths.metrics_path(root)
        fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        if isinstance(fs, pafs.LocalFileSystem):
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
            return
        name = f"{path}.{record.get('txn_id')}.{record.get('batch')}.{record.get('status')}"
        with fs.open_output_stream(name) as out:
            out.write(line.encode())
    except Exception as exc:  # see the docstring
        log.warning("could not append batch metrics under %s: %s", decision_log_uri, exc)


def _candidates(location: str) -> list[str]:
    base = location.rstrip("/")
    return [base, checkpoint_paths.library_dir(base)]


def read_metrics(checkpoint_location_or_log_uri: str, *, txn_id: str | None = None) -> list[dict[str, Any]]:
    """Every batch metrics line recorded under a checkpoint or decision log, oldest first.

    Parameters
    ----------
    checkpoint_location_or_log_uri
        A streaming query's ``checkpointLocation`` (its default decision log is
        ``<checkpointLocation>/clickhouse_tx``) or an explicit ``decision_log``.
    txn_id
        Keep only the lines of this transactional id.

    Returns
    -------
    list of dict
        In the order written (then by ``written_at`` for per-object files). A replayed
        batch that committed twice (once cut short by a crash after its COMMITs) has
        one line per commit call that finished.
    """
    out: list[dict[str, Any]] = []
    for cand in _candidates(checkpoint_location_or_log_uri):
        fs, root = checkpoint_paths.open_location(cand)
        infos = fs.get_file_info(pafs.FileSelector(root, allow_not_found=True))
        names = sorted(i.path for i in infos if i.type == pafs.FileType.File and i.base_name.startswith(METRICS_FILE))
        for name in names:
            with fs.open_input_stream(name) as f:
                for raw in f.read().decode().splitlines():
                    if raw.strip():
                        out.append(json.loads(raw))
        if names:
            break
    if txn_id is not None:
        out = [r for r in out if r.get("txn_id") == txn_id]
    return out
