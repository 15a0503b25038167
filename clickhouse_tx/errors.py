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
    done, trying again later may work. Built by :mod:`clickhouse_tx._transport.errors`."""


class ServerOutcomeUnknownError(ServerError, OutcomeUnknownError):
    """The server answered with an error that leaves a write's outcome open (Keeper
    connection loss, Keeper session expired, Keeper operation timeout): a read may be
    repeated, a write is resolved by reading back. Built by
    :mod:`clickhouse_tx._transport.errors`."""
