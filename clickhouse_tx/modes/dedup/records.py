"""Mode ``dedup``: where a batch's layout records live, and how a commit drops the earlier ones.

The records themselves (claims, chunk records, first-run records, seals) and what each
one binds are described in :mod:`clickhouse_tx.modes.dedup.claims`. They are KeeperMap
rows of ``clickhouse_tx_layouts`` beside the registry, keyed ``<txn>/<batch>/...``.

Spark replays only the last batch of a query, so a commit drops the records of the
batches before its own. KeeperMap filters on anything but the key by reading every key
of the table (every query's records), so the drop avoids scans: the batch before holds
the keys :func:`keys_of` derives from its seal (every partition's claim and chunk
records, its seal and first-run record), read by key beside the commit's own seal.
What a seal does not name (records a task of another run made for partitions it does
not hold, a drop that failed) is found by a scan of the query's records, which a commit
makes when the keys cannot be derived and every :data:`SCAN_EVERY` batches.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from clickhouse_tx.interfaces import Mode, RegistryEntry, Target
from clickhouse_tx.modes.dedup.claims import Claim, Part

if TYPE_CHECKING:  # pragma: no cover
    from clickhouse_tx.store.registry import KeeperMapRegistry

#: The KeeperMap table of the layout records (in the registry's database).
LAYOUT_TABLE = "clickhouse_tx_layouts"
#: The ``partition`` column of a seal and of a first-run record (claims hold their partition).
SEAL_PARTITION, FIRST_RUN_PARTITION = 2**32 - 1, 2**32 - 2
#: The ``partition`` column of the ``foreachBatch`` helper's first-attempt records
#: (:mod:`clickhouse_tx.foreach.contents`), kept in the same table: no claim of a batch.
CONTENT_PARTITION = 2**32 - 3
#: Every this many batches, a commit's drop scans the query's records instead of deriving
#: the keys of the batch before (what the seals do not name is dropped at least that often).
SCAN_EVERY = 64


def _body(key: str, stored: str) -> dict[str, Any]:
    """The JSON object a layout record holds."""
    body = json.loads(stored)
    if not isinstance(body, dict):
        raise ValueError(f"layout record {key} holds {type(body).__name__}, not an object")
    return body


class ClaimRecords:
    """The claims and seals of one target's dedup batches (KeeperMap). Picklable."""

    def __init__(self, registry: "KeeperMapRegistry") -> None:
        self.registry = registry

    @classmethod
    def beside(cls, target: Target, registry: "KeeperMapRegistry | None") -> "ClaimRecords":
        """The records in the registry's database (the target's when there is none)."""
        from clickhouse_tx.store.registry import KeeperMapRegistry

        database = registry.database if registry is not None else target.database
        return cls(KeeperMapRegistry(target, table=LAYOUT_TABLE, database=database))

    @staticmethod
    def key(txn_id: str, batch: int, partition: int | None) -> str:
        return f"{txn_id}/{batch}/{'all' if partition is None else partition}"

    def _create(
        self, key: str, txn_id: str, batch: int, partition: int, body: dict[str, Any], attempt: int = 0
    ) -> dict[str, Any]:
        """Create ``key`` holding ``body`` unless it exists; the body that is stored."""
        text = json.dumps(body, sort_keys=True)
        stored = self.registry.create_record(
            key, text, txn_id=txn_id, batch=batch, partition=partition, attempt=attempt, mode=Mode.DEDUP
        )
        return _body(key, stored)

    def _get(self, key: str) -> dict[str, Any] | None:
        stored = self.registry.record(key)
        return None if stored is None else _body(key, stored)

    def of_batch(self, txn_id: str, batch: int) -> tuple[dict[int, Part] | None, dict[int, Claim]]:
        """The batch's seal (None before its first commit) and its claims: one scan of the batch."""
        entries = self.registry.list_batch(txn_id, batch)
        return _seal_in(entries), _claims_in(entries)

    @staticmethod
    def first_run_key(txn_id: str, batch: int) -> str:
        return f"{txn_id}/{batch}/first_run"

    def _heads(self, txn_id: str, batch: int, *more: str) -> tuple[dict[str, str], dict[int, Part] | None, str | None]:
        """One point read of the batch's seal and first-run record (and ``more`` keys): the
        bodies found, the seal (None before the batch's first commit), the first run (None)."""
        seal_key, run_key = self.key(txn_id, batch, None), self.first_run_key(txn_id, batch)
        found = self.registry.records(seal_key, run_key, *more)
        seal = None if seal_key not in found else _by_partition(_body(seal_key, found[seal_key]))
        return found, seal, None if run_key not in found else str(_body(run_key, found[run_key]).get("run"))

    def first_run(self, txn_id: str, batch: int, run: str) -> tuple[dict[int, Part] | None, str]:
        """The batch's seal (None before its first commit) and the first run that reached its
        claims (none yet: ``run``, then recorded so): one point read."""
        _, seal, first = self._heads(txn_id, batch)
        if first is not None:
            return seal, first
        created = self._create(self.first_run_key(txn_id, batch), txn_id, batch, FIRST_RUN_PARTITION, {"run": run})
        return seal, str(created.get("run"))

    def at_seal(self, txn_id: str, batch: int) -> tuple[dict[int, Part] | None, str, list[str] | None]:
        """Driver, at a commit's seal: the batch's seal (None before its first commit), its
        first run ("" if none), and the keys of the batch before it to drop (:func:`keys_of`
        of that batch's seal; ``[]`` for batch 0). None instead of keys where a scan must
        find them: that seal is gone or names no chunk counts, or the batch is a multiple
        of :data:`SCAN_EVERY`. One point read."""
        before = self.key(txn_id, batch - 1, None)
        found, seal, first = self._heads(txn_id, batch, *([before] if batch > 0 else []))
        if batch == 0:
            return seal, first or "", []
        if batch % SCAN_EVERY == 0 or before not in found:
            return seal, first or "", None
        return seal, first or "", keys_of(txn_id, batch - 1, _by_partition(_body(before, found[before])))

    def claim(self, txn_id: str, batch: int, partition: int, claim: Claim) -> Claim:
        """Claim ``partition`` with ``claim`` (:func:`run_claim`) unless claimed; the stored claim."""
        return self._create(self.key(txn_id, batch, partition), txn_id, batch, partition, dict(claim))

    def chunk(self, txn_id: str, batch: int, partition: int, chunk: int, fingerprint: str, run: str) -> str:
        """Record chunk ``chunk`` (> 0) of ``partition`` unless recorded (key
        ``<txn>/<batch>/<partition>/<chunk>``, the chunk number in the ``attempt`` column:
        one create-if-absent, one read more if recorded first); the recorded fingerprint."""
        key, body = f"{self.key(txn_id, batch, partition)}/{chunk}", {"chunk": fingerprint, "run": run}
        return str(self._create(key, txn_id, batch, partition, body, attempt=chunk).get("chunk"))

    def recorded_chunk(self, txn_id: str, batch: int, partition: int, chunk: int) -> str | None:
        """The fingerprint recorded for chunk ``chunk`` of ``partition`` (None: none yet). One read."""
        key = f"{self.key(txn_id, batch, partition)}/{chunk}"
        body = self._get(key)
        return None if body is None else str(body.get("chunk"))

    def claim_of(self, txn_id: str, batch: int, partition: int) -> Claim | None:
        """The partition's claim (None: nobody claimed it). One read."""
        return self._get(self.key(txn_id, batch, partition))

    def update(self, txn_id: str, batch: int, partition: int, claim: Claim) -> None:
        """Overwrite a claim (confirmed or refused by a later run; the last writer wins)."""
        self.registry.transition(
            self.key(txn_id, batch, partition),
            ["committed"],
            "committed",
            {"body": json.dumps(dict(claim), sort_keys=True)},
        )

    def claims(self, txn_id: str, batch: int) -> dict[int, Claim]:
        """Every partition claim of the batch (one scan of the query's records, all keys)."""
        return _claims_in(self.registry.list_batch(txn_id, batch))

    def at_commit(self, txn_id: str, batch: int) -> tuple[dict[int, Part] | None, dict[int, Claim], list[str]]:
        """The batch's seal (None before its first commit), its claims, and the keys of the
        query's earlier batches: what a commit reads, in one KeeperMap scan of the query."""
        entries = self.registry.list_txn(txn_id)
        now = [e for e in entries if e.batch == batch]
        return _seal_in(now), _claims_in(now), [e.xid for e in entries if e.batch < batch]

    def seal(self, txn_id: str, batch: int, layout: Mapping[int, Part]) -> dict[int, Part]:
        """Seal the batch's layout unless sealed; the seal that is stored."""
        body = self._create(
            self.key(txn_id, batch, None), txn_id, batch, SEAL_PARTITION, {str(p): dict(v) for p, v in layout.items()}
        )
        return _by_partition(body)

    def sealed(self, txn_id: str, batch: int) -> bool:
        """Whether the batch holds a seal (one point read)."""
        return self.registry.record(self.key(txn_id, batch, None)) is not None

    def forget_batch(self, txn_id: str, batch: int) -> int:
        """Driver, once a batch job is done (or aborted for good): drop every record of
        ``batch``, by the keys its seal names (:func:`keys_of`; a point read), else by a
        scan of the batch (no seal, or one that cannot name them). The keys dropped."""
        _, seal, _ = self._heads(txn_id, batch)
        keys = None if seal is None else keys_of(txn_id, batch, seal)
        if keys is None:
            keys = [e.xid for e in self.registry.list_batch(txn_id, batch)]
        self.forget(keys)
        return len(keys)

    def forget(self, keys: Sequence[str]) -> None:
        """Drop these records (the query's earlier batches: Spark replays none of them)."""
        self.registry.forget(keys)


def keys_of(txn_id: str, batch: int, seal: Mapping[int, Part]) -> list[str] | None:
    """Every key of a batch sealed with ``seal``: its seal and first-run record, and each
    partition's claim and chunk records (``<partition>/1`` up to the one past its last
    chunk). None if a partition of the seal has no chunk count (a seal written before
    seals held them, or a partition an earlier attempt committed): only a scan finds its
    records."""
    keys = [ClaimRecords.key(txn_id, batch, None), ClaimRecords.first_run_key(txn_id, batch)]
    for p, part in sorted(seal.items()):
        chunks = part.get("chunks")
        if not isinstance(chunks, int):
            return None
        claim = ClaimRecords.key(txn_id, batch, p)
        keys += [claim, *(f"{claim}/{k}" for k in range(1, chunks + 1))]
    return keys


def _seal_in(entries: Sequence[RegistryEntry]) -> dict[int, Part] | None:
    """The seal among one batch's records, or None."""
    seal = next((e for e in entries if e.partition == SEAL_PARTITION), None)
    return None if seal is None else _by_partition(_body(seal.xid, str(seal.payload["body"])))


def _by_partition(body: Mapping[str, Any]) -> dict[int, Part]:
    """A seal's body (JSON keys are strings) by partition number."""
    return {int(p): v for p, v in body.items()}


def _claims_in(entries: Sequence[RegistryEntry]) -> dict[int, Claim]:
    """The partition claims among one batch's records (not its seal, not its chunk records)."""
    return {
        e.partition: _body(e.xid, str(e.payload["body"]))
        for e in entries
        if e.partition < CONTENT_PARTITION and e.attempt == 0  # not a chunk record, nor the helper's
    }
