"""Errors by what is known about the outcome.

- :class:`NotCommittedError`: the operation definitely did not take effect. Safe to
  clean up and retry.
- :class:`OutcomeUnknownError`: it may or may not have taken effect. Resolve by
  lookup (markers, registry); never retry blindly.
- :class:`ConfigurationError`: bad options, tables or schemas, raised before any
  data is written.

Every error carries the xid (when there is one) and the ClickHouse code and name.
Passwords never reach a message: build messages from :class:`Target` reprs only.
"""

from __future__ import annotations


class ClickHouseTxError(Exception):
    """Base of every error raised by clickhouse_tx."""

    def __init__(
        self, message: str, *, xid: str | None = None, code: int | None = None, name: str | None = None
    ) -> None:
        self.xid = xid
        self.code = code
        self.name = name
        self.message = message
        super().__init__(message)

    def __str__(self) -> str:
        parts = [self.message]
        if self.xid:
            parts.append(f"xid={self.xid}")
        if self.code is not None:
            parts.append(f"code={self.code}" + (f" ({self.name})" if self.name else ""))
        return "; ".join(parts)


class ConfigurationError(ClickHouseTxError):
    """Bad option, missing table, incompatible schema or server set-up. Nothing written."""


class ServerError(ClickHouseTxError):
    """ClickHouse answered with an exception (code and name from the reply)."""


class RowsNotWrittenError(ServerError):
    """The server answered an INSERT with success but its reply's summary
    (``X-ClickHouse-Summary``, ``written_rows``) counts fewer rows than were sent,
    beyond the blocks a deduplication token may drop. Nothing is claimed written:
    the task fails, and its attempt is rolled back like any failed insert.
    Built by :mod:`clickhouse_tx.client._transport.reply_mapping`."""

    def __init__(self, message: str, *, sent: int = 0, written: int = 0, xid: str | None = None) -> None:
        super().__init__(message, xid=xid)
        self.sent = sent
        self.written = written


class NotCommittedError(ClickHouseTxError):
    """Definitely not committed: safe to roll back, clean up and retry."""


class ValueDoesNotFitError(NotCommittedError):
    """A value of the data does not fit its ClickHouse column (raised on an executor while
    the partition is prepared, before anything of it is visible). Deterministic: a
    retry of the same data fails the same way; fix the data or the table."""

    # Set by the converter where it is raised, for dead letters: the row in the batch,
    # the column (with its path inside a nested value), its ClickHouse type, and why.
    row: int
    column: str
    ch_type: str
    reason: str


class OutcomeUnknownError(ClickHouseTxError):
    """Outcome unknown (e.g. a COMMIT whose reply was lost): resolve by lookup."""


class IllegalTransitionError(ClickHouseTxError):
    """A state change the transition table does not allow (e.g. COMMITTED -> ABORTING)."""


class TransactionFinishedError(IllegalTransitionError):
    """A finished (committed or aborted) transaction was used again."""


class DecisionConflictError(ClickHouseTxError):
    """Another coordinator already wrote this decision version."""


class LostTransactionError(ClickHouseTxError):
    """A decided xid can no longer commit and no replayed partition can replace it.

    Raised only when part of the batch is already visible and no message of the
    replay carries the lost partition's rows (same row count and checksum), e.g. a
    replay under another partitioning. The message names the lost partitions and
    xids, the visible ones, and the way out (the same transactional_id and the
    original partitioning); the batch is not marked done and nothing of the replay
    is committed.
    """


class TransientError(NotCommittedError):
    """Definitely not done, and trying again may work (connection refused, overload).

    The one kind of error :mod:`clickhouse_tx.retry` retries by default.
    """


class ServerBusyError(ServerError, TransientError):
    """The server refused the request before running it (HTTP 503/429 without an
    exception, ``TOO_MANY_SIMULTANEOUS_QUERIES``, no Keeper connection): nothing was
    done, trying again later may work. Built by :mod:`clickhouse_tx.client._transport.reply_mapping`."""


class ServerOutcomeUnknownError(ServerError, OutcomeUnknownError):
    """The server answered with an error that leaves a write's outcome open (Keeper
    connection loss, Keeper session expired, Keeper operation timeout): a read may be
    repeated, a write is resolved by reading back. Built by
    :mod:`clickhouse_tx.client._transport.reply_mapping`."""


class RequestNotSentError(TransientError):
    """The request never reached the server (refused, DNS, connect timeout)."""


class ReplyLostError(OutcomeUnknownError):
    """The request was (or may have been) sent, but no complete reply arrived."""


class AlreadyRegisteredError(IllegalTransitionError):
    """:meth:`KeeperMapRegistry.register` found the xid already there (in any state)."""


class DedupWindowError(ClickHouseTxError):
    """More blocks went into the table since a partition's first chunk than the dedup
    window holds: a replay could duplicate rows. Raise the window (docs/modes.md)."""


class DedupLayoutError(NotCommittedError):
    """A replay of a dedup batch cut it into other partitions than the run whose rows are
    in the table: refused before inserting (executor) or committing (driver)."""


class TornDecisionError(ClickHouseTxError):
    """A decision file is incomplete: its writer died mid-write (exclusive-create store)."""


# ----------------------------------------------------------------------------------------
# Operator runbooks: the messages that tell what is visible and the way out
# ----------------------------------------------------------------------------------------


def recover_command(url: str, table: str, mode: str, txn_id: str, log_root: str) -> str:
    """The ``python -m clickhouse_tx recover`` command that finishes a batch left in doubt.

    ``url`` must be credential-free (:func:`clickhouse_tx.client.http.safe_url`).
    """
    return (
        f"python -m clickhouse_tx recover --url {url} --table {table} --mode {mode} "
        f"--txn-id {txn_id} --checkpoint {log_root}"
    )


def sessions_gone_runbook(batch: int, partitions: list[int], xids: list[str], session_timeout_s: int) -> str:
    """Why nothing of ``batch`` was committed: prepared transactions gone before its decision."""
    return (
        f"batch {batch}: the prepared transactions of partitions {partitions} are gone before the "
        f"commit: lost xids {xids} (their sessions expired after session_timeout={session_timeout_s} "
        "s idle, or ClickHouse restarted). Nothing of the batch was committed and every prepared "
        "partition is rolled back, so restarting the query replays the batch (a batch job: run it "
        "again) and writes it once; supervise streaming queries to restart them. "
        "Tasks that wait longer than session_timeout for the commit need a larger "
        "session_timeout option (the server caps it at max_session_timeout)"
    )


def lost_partitions_runbook(
    *,
    batch: int,
    txn_id: str,
    lost: dict[int, str],
    visible_rows: dict[int, int],
    decided: int,
    this_run: int,
    log_root: str,
) -> str:
    """Why decided partitions can no longer commit, what is visible, and the way out.

    ``lost``: xid per lost partition; ``visible_rows``: rows per committed partition;
    ``decided``/``this_run``: the partitions of the decision and of this run.
    """
    return (
        f"batch {batch} of {txn_id}: partitions {sorted(lost)} (xids {list(lost.values())}) can no "
        "longer commit: their prepared transactions are gone (ClickHouse restarted, their sessions "
        "expired, or the server lost Keeper at COMMIT and rolled them back) and no task of this run "
        "wrote the same rows (a replacement must match the decided partition's rows and checksum; "
        f"this run has {this_run} partitions, the decision {decided}). Partitions "
        f"{sorted(visible_rows)} are committed and visible ({sum(visible_rows.values())} rows): "
        "running the job again under a new transactional_id would write them twice. Way out: run "
        f"again with transactional_id '{txn_id}' and decision_log '{log_root}' (a streaming query: "
        f"restart it on the same checkpoint) and the original partitioning ({decided} partitions: "
        "the same repartition(n), minPartitions and Kafka partitions), which re-writes and matches "
        "the missing partitions and keeps the visible ones"
    )


def in_doubt_runbook(
    *,
    batch: int,
    txn_id: str,
    doubt: list[int],
    first: BaseException,
    attempts: int,
    committed: list[int],
    log_root: str,
    recover: str,
) -> str:
    """Why ``batch`` is not done (``doubt`` partitions unsettled), what is visible, the way out."""
    return (
        f"batch {batch}: partitions {doubt} are in doubt ({type(first).__name__}: {first}; "
        f"retry.attempts={attempts}); partitions {committed} are committed and visible. The batch "
        "is not done: restart the query (or run the job again with options transactional_id "
        f"'{txn_id}' and decision_log '{log_root}'), or finish it with `{recover}`; running the "
        "job again under a new transactional_id would write the visible partitions twice"
    )
