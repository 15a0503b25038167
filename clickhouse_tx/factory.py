"""Wire the protocol to its I/O: a commit mode, the KeeperMap registry, the decision log.

Runs wherever a coordinator is needed: on the driver (validate, commit, abort) and on
executors (prepare). Everything it builds is picklable (plain Targets and modes); the
HTTP clients are created on first use in the process that uses them. The protocol
modules are imported lazily so this module imports cleanly on its own.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from clickhouse_tx.interfaces import CommitModeIO, Mode, Target
from clickhouse_tx.modes import mode_io_for
from clickhouse_tx.registry import DEFAULT_TABLE, KeeperMapRegistry

if TYPE_CHECKING:  # pragma: no cover
    from clickhouse_tx.convert import ConversionPlan
    from clickhouse_tx.coordinator import Coordinator
    from clickhouse_tx.retry import RetryPolicy


# Partitions committed at once on the driver: each COMMIT is a few round trips, and
# 16 partitions in sequence took ~550 ms (benchmarks/modes.py).
COMMIT_PARALLELISM = 8


def build_mode_io(mode: "Mode | str") -> CommitModeIO:
    """The commit mode's I/O (raises ConfigurationError naming an unknown mode)."""
    return mode_io_for(mode)


def build_registry(target: Target, *, table: str = DEFAULT_TABLE,
                   database: str | None = None) -> KeeperMapRegistry:
    """The KeeperMap registry (in the target's database unless ``database`` is given)."""
    return KeeperMapRegistry(target, table=table, database=database)


def build_coordinator(target: Target, mode: "Mode | str", txn_id: str, decision_log_uri: str, *,
                      registry_table: str = DEFAULT_TABLE, registry_database: str | None = None,
                      retry: "RetryPolicy | None" = None,
                      conversion: "ConversionPlan | None" = None) -> "Coordinator":
    """A :class:`~clickhouse_tx.coordinator.Coordinator` for one query into one target.

    Parameters
    ----------
    target
        The ClickHouse server and table.
    mode
        ``transaction``, ``staging``, ``dedup`` or ``none``.
    txn_id
        Stable id of the query (same across restarts).
    decision_log_uri
        Root of the decision log (the checkpoint location; any ``pyarrow.fs`` URI).
    retry
        Policy for transient errors (default :class:`~clickhouse_tx.retry.RetryPolicy`).
    conversion
        The table's column types; executors convert and check values before sending.
    """
    from clickhouse_tx.coordinator import Coordinator
    from clickhouse_tx.decision_log import FileDecisionLog

    return Coordinator(txn_id, target, build_mode_io(mode),
                       build_registry(target, table=registry_table, database=registry_database),
                       FileDecisionLog(decision_log_uri, txn_id), retry=retry, parallelism=COMMIT_PARALLELISM,
                       conversion=conversion)
