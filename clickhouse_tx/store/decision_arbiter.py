"""Arbiters of decision versions on stores without an exclusive create (S3, GCS).

A PUT to an object store is atomic but not exclusive, so two drivers could both
publish version N of a batch. The :class:`~clickhouse_tx.store.decision_log.FileDecisionLog`
of such a store first claims the version with an :class:`Arbiter`, an atomic
create-if-absent of a small record; only the claim's winner writes the file.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from clickhouse_tx.store.registry import KeeperMapRegistry


class Arbiter(Protocol):
    """Atomic create-if-absent of small records, for stores without one."""

    def claim(self, key: str, body: bytes) -> bytes:
        """Create ``key`` holding ``body`` if absent; return the body ``key`` holds."""

    def get(self, key: str) -> bytes | None: ...

    def forget(self, keys: Sequence[str]) -> None: ...


class RegistryArbiter:
    """:class:`Arbiter` on a KeeperMap table (``clickhouse_tx_decisions``).

    A claim is a registry ``register``: an INSERT under ``keeper_map_strict_mode``,
    which fails if the key exists (atomic create-if-absent in ZooKeeper), with a
    lost reply settled by reading back. The entry holds the decision's bytes in its
    payload and is finished (``committed``), so nothing else acts on it. Picklable.
    """

    TABLE = "clickhouse_tx_decisions"

    def __init__(self, registry: "KeeperMapRegistry") -> None:
        self.registry = registry

    def claim(self, key: str, body: bytes) -> bytes:
        d = json.loads(body)
        won = self.registry.create_record(
            key, body.decode(), txn_id=str(d["txn_id"]), batch=int(d["batch"]), attempt=int(d["version"])
        )
        return won.encode()

    def get(self, key: str) -> bytes | None:
        body = self.registry.record(key)
        return None if body is None else body.encode()

    def forget(self, keys: Sequence[str]) -> None:
        self.registry.forget(list(keys))
