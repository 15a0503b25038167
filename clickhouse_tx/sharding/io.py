"""A write over several ClickHouse shards: prepare per (partition, shard), one decision.

Executors prepare one xid per shard that gets rows of their partition, each with the
plain one-server :class:`~clickhouse_tx.protocol.coordinator.Coordinator` of that shard (on a
healthy replica), under the slot number of :mod:`clickhouse_tx.sharding.placement`. The driver
commits with one coordinator whose I/O is routed here: :class:`ShardedModeIO` sends
each commit, rollback and lookup to the server that prepared the xid (its
``Prepared.server``), and :class:`ShardedRegistry` keeps each xid's registry entry
on its shard. The decision log stays one per query, so one decision covers the xids
of every (partition, shard) of a batch (``docs/design.md`` §5).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
from typing import Callable, Iterable, Iterator, Mapping, Sequence, TypeVar

import pyarrow as pa

from clickhouse_tx.client.http import ClickHouseHTTP, safe_url
from clickhouse_tx.conversion.schema import TableInfo
from clickhouse_tx.errors import AlreadyRegisteredError, ClickHouseTxError, NotCommittedError
from clickhouse_tx.ids import is_run_fence, parse_xid
from clickhouse_tx.interfaces import CommitModeIO, CommitOutcome, Hook, Prepared, RegistryEntry, Target, WriteContext
from clickhouse_tx.protocol.coordinator import Coordinator
from clickhouse_tx.sharding.placement import ShardPlacement, split_by_shard
from clickhouse_tx.store.registry import KeeperMapRegistry

log = logging.getLogger(__name__)
T = TypeVar("T")


def answers(target: Target, url: str, timeout_s: float = 3.0) -> bool:
    """True if the server at ``url`` answers a trivial query within ``timeout_s``."""
    probe = dataclasses.replace(target, url=url, connect_timeout_s=timeout_s, request_timeout_s=timeout_s)
    try:
        with ClickHouseHTTP(probe) as c:
            c.command("SELECT 1")
        return True
    except (ClickHouseTxError, OSError):
        return False


def pick_replica(target: Target, replicas: Sequence[str], *, rng: random.Random | None = None, shard: int = 0) -> str:
    """A replica of one shard that answers, chosen at random among those that do.

    Runs on an executor once per (partition attempt, shard), and on the driver once
    per shard when it builds a coordinator. One replica is taken as it is (no probe).

    Raises
    ------
    NotCommittedError
        No replica of the shard answers; nothing was written there.
    """
    if len(replicas) == 1:
        return replicas[0]
    order = list(replicas)
    (rng or random.Random()).shuffle(order)
    for url in order:
        if answers(target, url):
            return url
        log.warning("shard %d: replica %s does not answer; trying another", shard, safe_url(url))
    raise NotCommittedError(
        f"shard {shard}: none of its replicas answers ({', '.join(safe_url(u) for u in replicas)}); "
        "nothing was written there"
    )


def _shard_of_xid(placement: ShardPlacement, xid: str) -> int:
    return placement.shard_of_slot(parse_xid(xid).partition)


class ShardedRegistry:
    """The registry of a sharded write: each xid's entry lives on its shard.

    Implements :class:`~clickhouse_tx.interfaces.RegistryIO` (plus the bulk and
    housekeeping calls the coordinator and recovery use) over one
    :class:`~clickhouse_tx.store.registry.KeeperMapRegistry` per shard.
    """

    def __init__(self, placement: ShardPlacement, registries: Sequence[KeeperMapRegistry]) -> None:
        self.placement = placement
        self.registries = list(registries)

    def __repr__(self) -> str:
        return f"ShardedRegistry({len(self.registries)} shards)"

    def of(self, xid: str) -> KeeperMapRegistry:
        """The registry of ``xid``'s shard."""
        return self.registries[_shard_of_xid(self.placement, xid)]

    def _by_shard(self, xids: Iterable[str]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for x in xids:
            out.setdefault(_shard_of_xid(self.placement, x), []).append(x)
        return out

    def register(self, entry: RegistryEntry) -> None:
        if not is_run_fence(entry.xid):
            self.of(entry.xid).register(entry)
            return
        # Each shard's attempts check their run's fence in their own shard's registry.
        for registry in self.registries:
            with contextlib.suppress(AlreadyRegisteredError):  # an abort repeated
                registry.register(entry)

    def transition(
        self, xid: str, expected: Sequence[str], new: str, payload: Mapping[str, object] | None = None
    ) -> bool:
        return self.of(xid).transition(xid, expected, new, payload)

    def transition_many(
        self, xids: Sequence[str], expected: Sequence[str], new: str, payload: Mapping[str, object] | None = None
    ) -> list[str]:
        moved: list[str] = []
        for shard, some in self._by_shard(xids).items():
            moved += self.registries[shard].transition_many(some, expected, new, payload)
        return moved

    def get(self, xid: str) -> RegistryEntry | None:
        return self.of(xid).get(xid)

    def get_many(self, xids: Sequence[str]) -> dict[str, RegistryEntry]:
        fences = [x for x in xids if is_run_fence(x)]
        found = self.registries[0].get_many(fences) if fences else {}
        for shard, some in self._by_shard(x for x in xids if not is_run_fence(x)).items():
            found.update(self.registries[shard].get_many(some))
        return found

    def list_batch(self, txn_id: str, batch: int) -> list[RegistryEntry]:
        return [e for r in self.registries for e in r.list_batch(txn_id, batch)]

    def list_txn(self, txn_id: str) -> list[RegistryEntry]:
        return [e for r in self.registries for e in r.list_txn(txn_id)]

    def list_open(self, older_than_s: float | None = None) -> list[RegistryEntry]:
        return [e for r in self.registries for e in r.list_open(older_than_s)]

    def forget(self, xids: Sequence[str], committed: Sequence[str] = ()) -> None:
        done = set(committed)
        for shard, some in self._by_shard([*xids, *committed]).items():
            self.registries[shard].forget(some, [x for x in some if x in done])


class ShardedModeIO:
    """A commit mode over shards: each call goes to the server that prepared the xid.

    Implements :class:`~clickhouse_tx.interfaces.CommitModeIO` for the driver
    (``validate``, ``commit``, ``rollback``, ``lookup``, ``check_layout``);
    ``prepare`` runs per shard through :func:`prepare_sharded`.
    """

    def __init__(self, placement: ShardPlacement, per_shard: Sequence[CommitModeIO]) -> None:
        self.placement = placement
        self.per_shard = list(per_shard)
        self.mode = self.per_shard[0].mode

    def target_of(self, target: Target, p: Prepared) -> Target:
        """``target`` on the server that prepared ``p`` (its recorded replica)."""
        replicas = self.placement.urls[self.placement.shard_of_slot(p.partition)]
        url = next((u for u in replicas if safe_url(u) == p.server), replicas[0])
        return dataclasses.replace(target, url=url)

    def _io(self, p: Prepared) -> CommitModeIO:
        return self.per_shard[self.placement.shard_of_slot(p.partition)]

    def validate(self, target: Target, schema: pa.Schema, info: TableInfo | None = None) -> None:
        # Each server has its own table: ``info`` (one server's) describes none of the others.
        for shard, replicas in enumerate(self.placement.urls):
            for url in replicas:
                self.per_shard[shard].validate(dataclasses.replace(target, url=url), schema)

    def prepare(self, target: Target, ctx: WriteContext, xid: str, batches: Iterator[pa.RecordBatch]) -> Prepared:
        raise NotImplementedError("a sharded write prepares per shard (clickhouse_tx.sharding.io.prepare_sharded)")

    def commit(self, target: Target, p: Prepared) -> None:
        self._io(p).commit(self.target_of(target, p), p)

    def rollback(self, target: Target, p: Prepared) -> None:
        self._io(p).rollback(self.target_of(target, p), p)

    def lookup(self, target: Target, p: Prepared) -> CommitOutcome:
        return self._io(p).lookup(self.target_of(target, p), p)

    def renew(self, target: Target, p: Prepared) -> bool:
        """The shard's mode's ``renew`` (transaction mode keeps a session alive), else True."""
        renew = self._io(p).renew
        return True if renew is None else bool(renew(self.target_of(target, p), p))

    def commit_together(self, target: Target, ps: Sequence[Prepared], before_commit: Hook | None = None) -> None:
        """Nothing: a batch over shards spans servers (``visibility=batch`` is refused with ``shards``)."""

    def check_layout(self, target: Target, batch: int, messages: Sequence[Prepared]) -> None:
        by_shard: dict[int, list[Prepared]] = {}
        for m in messages:
            by_shard.setdefault(self.placement.shard_of_slot(m.partition), []).append(m)
        for shard, msgs in sorted(by_shard.items()):
            url = self.target_of(target, msgs[0]).url
            self.per_shard[shard].check_layout(dataclasses.replace(target, url=url), batch, msgs)


def prepare_sharded(
    placement: ShardPlacement,
    coordinator_on: Callable[[int, str], Coordinator],
    target: Target,
    ctx: WriteContext,
    batches: Iterator[pa.RecordBatch],
) -> list[Prepared]:
    """Executor, once per partition attempt: prepare an xid on each shard that gets rows.

    Without a sharding key the partition goes whole, streamed, to one shard. With one,
    the partition is split by shard in memory first (a Spark partition is held whole
    on the executor), then each shard's rows are prepared in shard order; a partition
    without rows prepares an empty xid on its partition's shard. ``coordinator_on(shard,
    url)`` is the one-server coordinator of a shard's chosen replica.

    Raises
    ------
    NotCommittedError
        A shard could not be prepared; the xids prepared before it are rolled back
        (best effort: never chosen, the batch's commit or GC rolls back the rest).
    """
    if placement.key is None:
        shard = placement.shard_of_partition(ctx.partition)
        return [_prepare_on(placement, coordinator_on, target, ctx, shard, batches)[1]]
    parts: dict[int, list[pa.RecordBatch]] = {}
    for b in batches:
        for shard, rows in split_by_shard(b, placement).items():
            parts.setdefault(shard, []).append(rows)
    if not parts:
        parts[placement.shard_of_partition(ctx.partition)] = []
    done: list[tuple[Coordinator, Prepared]] = []
    try:
        for shard in sorted(parts):
            done.append(_prepare_on(placement, coordinator_on, target, ctx, shard, iter(parts[shard])))
    except BaseException:
        for c, p in done:
            c.ops.abort_quietly(p)
        raise
    return [p for _, p in done]


def _prepare_on(
    placement: ShardPlacement,
    coordinator_on: Callable[[int, str], Coordinator],
    target: Target,
    ctx: WriteContext,
    shard: int,
    batches: Iterator[pa.RecordBatch],
) -> tuple[Coordinator, Prepared]:
    """One shard's xid, on a replica that answers, under the slot of (partition, shard)."""
    c = coordinator_on(shard, pick_replica(target, placement.urls[shard], shard=shard))
    return c, c.prepare(dataclasses.replace(ctx, partition=placement.slot(ctx.partition, shard)), batches)


def build_sharded_coordinator(
    target: Target,
    placement: ShardPlacement,
    build_one: Callable[[Target], Coordinator],
) -> Coordinator:
    """The driver's coordinator of a sharded write: one decision log, I/O routed by xid.

    Runs on the driver for every commit, abort, recovery and GC of a sharded write.
    ``build_one(target)`` builds the one-server coordinator of a target (the factory
    with the query's mode, id, decision log and retry policy); the decision log (and
    its arbiter on object stores) is shard 0's, the registry and mode I/O of each shard
    are that shard's, reached on a replica that answers.
    """
    ones = [
        build_one(dataclasses.replace(target, url=pick_replica(target, replicas, shard=shard)))
        for shard, replicas in enumerate(placement.urls)
    ]
    registries = [one.registry for one in ones]
    if not all(isinstance(r, KeeperMapRegistry) for r in registries):
        raise TypeError("a sharded coordinator needs KeeperMap registries")
    first = ones[0]
    return Coordinator(
        first.txn_id,
        first.target,
        ShardedModeIO(placement, [one.mode_io for one in ones]),
        ShardedRegistry(placement, registries),  # type: ignore[arg-type]
        first.log,
        retry=first.retry,
        parallelism=first.parallelism,
        conversion=first.conversion,
    )
