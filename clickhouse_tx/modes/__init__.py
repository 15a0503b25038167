"""The four commit modes, each a :class:`~clickhouse_tx.interfaces.CommitModeIO`.

| mode | prepare (executor) | commit (driver) | guarantee |
|---|---|---|---|
| ``transaction`` | session ``xid``: BEGIN, INSERT, marker, no COMMIT | ``COMMIT`` in the session | exactly-once, atomic per partition |
| ``staging`` | INSERT into a stage table | MOVE PARTITION to the target, marker, DROP stage | exactly-once, per-partition moves |
| ``dedup`` | INSERT with deterministic ``insert_deduplication_token`` | marker | idempotent at-least-once |
| ``none`` | plain INSERT | nothing | at-least-once baseline |

Mode objects hold no connections and no per-call state: they are plain, picklable
values shipped to executors; each call builds its own HTTP client from the Target.
"""

from __future__ import annotations

from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.interfaces import CommitModeIO, Mode


def mode_io_for(mode: "Mode | str", *, visibility: str = "partition") -> CommitModeIO:
    """The :class:`CommitModeIO` of ``mode`` (``transaction``, ``staging``, ``dedup``, ``none``).

    ``visibility``: ``partition`` (each partition of a batch appears on its own) or
    ``batch`` (mode ``staging`` only: the whole batch appears at once).
    """
    try:
        m = Mode(mode.value if isinstance(mode, Mode) else str(mode).lower())
    except ValueError:
        raise ConfigurationError(f"unknown mode {mode!r}: choose one of {', '.join(x.value for x in Mode)}") from None
    if visibility not in ("partition", "batch"):
        raise ConfigurationError(f"option visibility={visibility!r}: choose 'partition' or 'batch'")
    if visibility == "batch" and m is not Mode.STAGING:
        raise ConfigurationError(
            f"option visibility=batch with mode={m.value!r}: only mode 'staging' can publish a whole "
            "batch at once (its stages are moved in one transaction); use mode staging, or "
            "visibility=partition"
        )
    if m is Mode.TRANSACTION:
        from clickhouse_tx.modes.transaction import TransactionMode

        return TransactionMode()
    if m is Mode.STAGING:
        from clickhouse_tx.modes.staging.mode import StagingMode

        return StagingMode(whole_batch=visibility == "batch")
    if m is Mode.DEDUP:
        from clickhouse_tx.modes.dedup.mode import DedupMode

        return DedupMode()
    from clickhouse_tx.modes.plain import PlainMode

    return PlainMode()


__all__ = ["mode_io_for"]
