"""Who the writer writes as: its transactional id and decision log, and the checkpoint I/O behind them.

The options ``transactional_id``, ``decision_log`` and ``checkpointLocation``
decide under which id the coordinator decides each batch and where it
writes the decisions. :func:`identity` derives them from the options alone (driver,
whenever the options are parsed); :func:`settle_stream_txn_id` and
:func:`refuse_finished_batch_job` then read the checkpoint or the decision log (driver,
before any task writes). ``docs/options.md``, "The transactional id", says why.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any, Mapping

from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.ids import canonical_location
from spark_datasource.options.writer_specs import WRITER_OPTIONS

__all__ = ["identity", "batch_log", "settle_stream_txn_id", "refuse_finished_batch_job"]


def identity(opts: Mapping[str, str], streaming: bool) -> dict[str, Any]:
    """``transactional_id``, ``decision_log`` and what they derive from, as ``WriterOptions`` fields.

    A streaming id stays empty until :func:`settle_stream_txn_id` reads it from the
    checkpoint; a batch job gets a fresh id unless it has its own id and
    ``decision_log`` (then it is resumable).

    Raises
    ------
    ConfigurationError
        A malformed id or log, or a streaming write with neither a checkpoint nor both.
    """
    chk: str | None = WRITER_OPTIONS["checkpointLocation"].read(opts)
    explicit: str | None = WRITER_OPTIONS["transactional_id"].read(opts) if "transactional_id" in opts else None
    if streaming and chk is None and ("transactional_id" not in opts or "decision_log" not in opts):
        raise ConfigurationError(
            "a streaming write needs .option('checkpointLocation', ...) on the writer "
            "(a checkpoint set through spark.sql.streaming.checkpointLocation is not "
            "passed to data sources), or explicit transactional_id and decision_log"
        )
    resumable = not streaming and explicit is not None and "decision_log" in opts
    if streaming:
        txn = explicit or ""  # checked against the stored one by settle_stream_txn_id()
    elif resumable and explicit is not None:
        # Replays an unfinished decision when run again (refuse_finished_batch_job
        # refuses a finished one on the driver).
        txn = explicit
    else:
        txn = _batch_job_id(explicit)
    return {
        "transactional_id": txn,
        "checkpoint_location": chk,
        "decision_log": _decision_log(opts, streaming, chk),
        "resumable_batch_job": resumable,
    }


def _batch_job_id(explicit: str | None) -> str:
    """A batch job's id: fresh per job, with the ``transactional_id`` option as prefix.

    Batch ids start at 0 in every job, so a reused id would meet an earlier job's
    decision for batch 0 and write nothing. Keying each job apart makes two jobs with
    the same option write their rows and never see each other's registry entries.
    """
    job = uuid.uuid4().hex
    return f"{explicit}.job-{job[:12]}" if explicit else f"batch-{job}"


def batch_log() -> str:
    """The default decision log of a batch job (the log adds ``clickhouse_tx/<txn_id>`` below it)."""
    # Batch commit runs in a Python worker on the driver host: a local dir works.
    return os.path.join(tempfile.gettempdir(), "clickhouse_tx_batch")


def _decision_log(opts: Mapping[str, str], streaming: bool, chk: str | None) -> str:
    if "decision_log" in opts:
        return str(WRITER_OPTIONS["decision_log"].read(opts))
    if streaming and chk is not None:  # else refused by identity()
        # The decision log lives at <checkpointLocation>/clickhouse_tx/<txn_id>/
        # (clickhouse_tx.store.checkpoint_paths), the checkpoint spelled one way.
        return canonical_location(chk, os.getcwd())
    return batch_log()


def settle_stream_txn_id(checkpoint_location: str, explicit: str) -> str:
    """Driver: the streaming query's transactional id, read from (or stored in) its checkpoint.

    Runs when the stream writer is built, before any task writes, and again before
    each commit. The id is stored there on first use, derived from Spark's query id,
    so no spelling of the location and no query name changes it; an ``explicit`` id
    (empty: none) must match it (:func:`clickhouse_tx.store.query_identity.resolve_stream_txn_id`).

    Raises
    ------
    ConfigurationError
        The explicit id differs from the stored one, or Spark's metadata is not where
        the checkpoint location points.
    """
    from clickhouse_tx.store.query_identity import resolve_stream_txn_id

    return resolve_stream_txn_id(
        checkpoint=canonical_location(checkpoint_location, os.getcwd()), explicit=explicit or None
    )


def refuse_finished_batch_job(decision_log: str, txn_id: str) -> None:
    """Driver, once per resumable batch job, before any task writes: refuse a finished one.

    Batch ids start at 0 in every job, so a job whose decision for batch 0 is done
    would commit nothing; it is refused instead of skipped. An unfinished one is
    replayed (its decision rolled forward), which is how a failed job is finished.

    Raises
    ------
    ConfigurationError
        The decision log already holds a finished job under this id.
    """
    from clickhouse_tx.store.decision_log import FileDecisionLog

    decision = FileDecisionLog(decision_log, txn_id).read(0)
    if decision is not None and decision.done:
        raise ConfigurationError(
            f"the batch job with transactional_id {txn_id!r} and decision_log "
            f"{decision_log!r} has already committed ({len(decision.chosen)} partitions); "
            "it would write nothing. Give a new transactional_id, or leave out decision_log "
            "(each job then gets a fresh id)"
        )
