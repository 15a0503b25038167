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
from clickhouse_tx.modes.dedup.mode import DedupMode
from clickhouse_tx.store.checkpoint_paths import open_location
from clickhouse_tx.store.decision_log import DEFAULT_RETAIN_BATCHES
from clickhouse_tx.store.registry import DEFAULT_TABLE, KeeperMapRegistry

if TYPE_CHECKING:  # pragma: no cover
    from clickhouse_tx.conversion.convert import ConversionPlan
    from clickhouse_tx.protocol.coordinator import Coordinator
    from clickhouse_tx.retry import RetryPolicy
    from clickhouse_tx.store.decision_log import FileDecisionLog


# Partitions committed at once on the driver: each COMMIT is a few round trips that
# wait on the server, not on this process, so they overlap well.
COMMIT_PARALLELISM = 8


def build_mode_io(
    mode: "Mode | str", registry: KeeperMapRegistry | None = None, *, visibility: str = "partition"
) -> CommitModeIO:
    """The commit mode's I/O (raises ConfigurationError naming an unknown mode).

    ``registry``: where mode ``dedup`` checks, before each chunk it inserts, that its
    xid is still INITIALIZED (the fence of a zombie attempt); default the target's.
    ``visibility``: the writer option (``partition`` or ``batch``, see :func:`mode_io_for`).
    """
    io = mode_io_for(mode, visibility=visibility)  # refuses an unknown mode or visibility
    if registry is not None and isinstance(io, DedupMode):
        return DedupMode(io.sizing, registry=registry)
    return io


def build_registry(
    target: Target,
    *,
    table: str = DEFAULT_TABLE,
    database: str | None = None,
    retry: "RetryPolicy | None" = None,
) -> KeeperMapRegistry:
    """The KeeperMap registry (in the target's database unless ``database`` is given).

    ``retry``: the budget of its read-backs of unknown writes (default
    :class:`~clickhouse_tx.retry.RetryPolicy`); a coordinator's registry shares the
    coordinator's.
    """
    return KeeperMapRegistry(target, table=table, database=database, retry=retry)


def build_decision_log(
    target: Target,
    txn_id: str,
    decision_log_uri: str,
    *,
    registry_database: str | None = None,
    retain_batches: int = DEFAULT_RETAIN_BATCHES,
) -> "FileDecisionLog":
    """The decision log of ``txn_id`` under ``decision_log_uri``, atomic on its store.

    Driver, wherever a coordinator commits. On a store without an exclusive create
    (S3, GCS) it arbitrates versions by the registry's compare-and-set, in the
    KeeperMap table ``clickhouse_tx_decisions`` beside the registry.
    """
    from clickhouse_tx.store.decision_arbiter import RegistryArbiter
    from clickhouse_tx.store.decision_log import FileDecisionLog, publication_semantics

    fs, root = open_location(decision_log_uri)
    arbiter = None
    if publication_semantics(fs) == "registry-cas":
        arbiter = RegistryArbiter(build_registry(target, table=RegistryArbiter.TABLE, database=registry_database))
    return FileDecisionLog(
        decision_log_uri, txn_id, arbiter=arbiter, retain_batches=retain_batches, filesystem=(fs, root)
    )


def build_coordinator(
    target: Target,
    mode: "Mode | str",
    txn_id: str,
    decision_log_uri: str,
    *,
    registry_table: str = DEFAULT_TABLE,
    registry_database: str | None = None,
    retry: "RetryPolicy | None" = None,
    retain_batches: int = DEFAULT_RETAIN_BATCHES,
    conversion: "ConversionPlan | None" = None,
    visibility: str = "partition",
) -> "Coordinator":
    """A :class:`~clickhouse_tx.protocol.coordinator.Coordinator` for one query into one target.

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
    retain_batches
        Done batches the decision log keeps (Spark's ``minBatchesToRetain``, default 100).
    retry
        Policy for transient errors (default :class:`~clickhouse_tx.retry.RetryPolicy`).
    conversion
        The table's column types; executors convert and check values before sending.
    visibility
        ``partition`` or ``batch`` (mode ``staging``: the batch appears at once).
    """
    from clickhouse_tx.protocol.coordinator import Coordinator

    registry = build_registry(target, table=registry_table, database=registry_database, retry=retry)
    return Coordinator(
        txn_id,
        target,
        build_mode_io(mode, registry, visibility=visibility),
        registry,
        build_decision_log(
            target, txn_id, decision_log_uri, registry_database=registry_database, retain_batches=retain_batches
        ),
        retry=retry,
        parallelism=COMMIT_PARALLELISM,
        conversion=conversion,
    )
