"""What the commit path of one query depends on, in one frozen object (:class:`CommitContext`).

A :class:`~clickhouse_tx.protocol.coordinator.Coordinator` builds it once and hands it
down: its :class:`~clickhouse_tx.protocol.tx_ops.TxOps` is built from it, and
:class:`~clickhouse_tx.protocol.batch_ops.BatchOps`,
:class:`~clickhouse_tx.protocol.batch_commit.BatchCommitter` and
:func:`~clickhouse_tx.protocol.prepare.prepare_attempt` take it beside that ``TxOps``.
Each reads its I/O from the context, none through another object.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

from clickhouse_tx.interfaces import CommitModeIO, DecisionLogIO, RegistryIO, Target
from clickhouse_tx.retry import RetryPolicy


@dataclasses.dataclass(frozen=True)
class CommitContext:
    """The dependencies of one query's (``txn_id``) commit path into one target: the
    :class:`~clickhouse_tx.protocol.coordinator.Coordinator` parameters of the same names,
    which say what each one is."""

    txn_id: str
    target: Target
    mode_io: CommitModeIO
    registry: RegistryIO
    log: DecisionLogIO
    retry: RetryPolicy = dataclasses.field(default_factory=RetryPolicy)
    clock: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    parallelism: int = 1
