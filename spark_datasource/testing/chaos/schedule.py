"""Chaos schedules: which job, which commit mode, which faults when, all from one seed.

Pure (no I/O): :func:`plan` turns a seed into a frozen :class:`Schedule`, so a failing
schedule is replayed exactly by its seed (``make chaos CHAOS_SEED=S CHAOS_SCHEDULES=1``).

Fault kinds are dealt round-robin over consecutive seeds: schedule ``s`` has
``1 + s % 3`` faults, and its faults are the next ones of an endless sequence
(:func:`kind_of`) after the faults of seeds ``0 .. s-1``; every block of 14 in that
sequence holds each kind once. So any 100 consecutive seeds plan 200 faults and every
kind 13 to 16 times.
"""

from __future__ import annotations

import dataclasses
import random

from clickhouse_tx.testing.faults import STREAMING_STEPS

#: Every fault kind: SIGKILLs of a process, then proxy faults on the writer <-> ClickHouse
#: link (``ch_*``) and on the ClickHouse <-> ZooKeeper link (``zk_*``). ``kill_executor``
#: SIGKILLs an executor JVM: its schedule runs on :data:`CLUSTER_MASTER`; ``kill_shard``
#: one ClickHouse server of two shards: its schedule writes to both (:attr:`Schedule.shards`).
KINDS = (
    "kill_driver",
    "ch_reset",
    "zk_stall",
    "kill_worker",
    "ch_drop_reply",
    "zk_slow",
    "kill_clickhouse",
    "ch_stall",
    "zk_reset",
    "kill_zookeeper",
    "ch_slow",
    "zk_drop_reply",
    "kill_executor",
    "kill_shard",
)
#: The driver programs: a streaming query draining the topic (``Trigger.AvailableNow``
#: or a 0.5 s processing-time trigger) and a resumable batch write.
JOBS = ("stream_available_now", "stream_trigger", "batch")
MODES = ("transaction", "staging", "dedup")
#: Where a job runs: as on a cluster, a task failed by a fault is tried again (up to 4
#: attempts; ``local[2]`` would fail the job at once). A schedule that kills an executor
#: runs on ``local-cluster``: a Master and two Workers inside the driver's JVM, each Worker
#: with one executor JVM of its own (a child of the driver), which the Master replaces
#: when it dies.
LOCAL_MASTER = "local[2,4]"
CLUSTER_MASTER = "local-cluster[2,1,1024]"


@dataclasses.dataclass(frozen=True)
class ScheduledFault:
    """One fault: ``kind`` at ``at_s`` seconds after the job's first sign of life.

    ``step`` (``kill_driver`` only) arms the kill at a protocol step instead of a time;
    ``seconds`` is the outage or fault window; ``rate`` the bandwidth of ``*_slow``.
    """

    kind: str
    at_s: float
    step: str | None = None
    seconds: float = 0.0
    rate: int = 0

    def label(self) -> str:
        return f"{self.kind}@{self.step}" if self.step else f"{self.kind}@{self.at_s:.1f}s"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """One chaos schedule: the job, its mode and size, and its faults in time order."""

    seed: int
    job: str
    mode: str
    events: int
    partitions: int
    faults: tuple[ScheduledFault, ...]

    @property
    def master(self) -> str:
        """The job's Spark master: executors of their own where one is to be killed."""
        return CLUSTER_MASTER if any(f.kind == "kill_executor" for f in self.faults) else LOCAL_MASTER

    @property
    def shards(self) -> int:
        """ClickHouse shards the job writes to: two where one of them is to be killed."""
        return 2 if any(f.kind == "kill_shard" for f in self.faults) else 1

    @property
    def sharding_key(self) -> str | None:
        """Of a sharded job: rows by ``event_id`` (odd seeds) or whole Spark partitions (even)."""
        return "event_id" if self.shards > 1 and self.seed % 2 else None

    def describe(self) -> str:
        return f"seed {self.seed}: {self.job}/{self.mode}, {self.events} events, " + ", ".join(
            f.label() for f in self.faults
        )


def fault_count(seed: int) -> int:
    return 1 + seed % 3


def first_fault_index(seed: int) -> int:
    """How many faults the seeds ``0 .. seed-1`` have (closed form of the sum of fault_count)."""
    r = seed % 3
    return 2 * (seed - r) + r * (r + 1) // 2


def _window(kind: str, rng: random.Random) -> tuple[float, int]:
    """(seconds, rate) of one fault: outages of 1-4 s, stalls past the client timeouts."""
    if kind in ("kill_clickhouse", "kill_shard", "kill_zookeeper"):
        return rng.uniform(1.0, 4.0), 0
    if kind.endswith("_stall"):
        # the writer's request_timeout is 6 s in chaos runs, ClickHouse's Keeper
        # operation timeout 10 s: a stall outlasts both
        return rng.uniform(7.0, 12.0), 0
    if kind.endswith("_slow"):
        return rng.uniform(3.0, 8.0), rng.choice((2_000, 8_000, 32_000))
    if kind.endswith("_reset"):
        return rng.uniform(0.2, 2.0), 0
    if kind.endswith("_drop_reply"):
        return rng.uniform(0.1, 1.0), 0
    return 0.0, 0


def kind_of(index: int) -> str:
    """Kind of fault number ``index``: each block of 12 holds every kind once, in a
    block-seeded order (so kinds meet in varied combinations, and counts stay even)."""
    block, pos = divmod(index, len(KINDS))
    return KINDS[random.Random(block).sample(range(len(KINDS)), len(KINDS))[pos]]


def _fault(index: int, rng: random.Random) -> ScheduledFault:
    """Fault number ``index`` of the endless sequence; its times from ``rng``."""
    kind = kind_of(index)
    seconds, rate = _window(kind, rng)
    # every other driver kill is armed at a protocol step, the steps in turn
    occurrence = index // len(KINDS)
    step = (
        STREAMING_STEPS[(occurrence // 2) % len(STREAMING_STEPS)]
        if kind == "kill_driver" and occurrence % 2 == 0
        else None
    )
    return ScheduledFault(kind, round(rng.uniform(0.0, 6.0), 2), step, round(seconds, 2), rate)


def plan(seed: int, *, events: int = 3000, partitions: int = 3) -> Schedule:
    """The schedule of ``seed`` (the same seed gives the same schedule, always)."""
    rng = random.Random(seed)
    start = first_fault_index(seed)
    drawn = [_fault(start + j, rng) for j in range(fault_count(seed))]
    faults = sorted(drawn, key=lambda f: (f.step is None, f.at_s))
    return Schedule(
        seed=seed,
        job=rng.choice(JOBS),
        mode=MODES[(seed // 3) % len(MODES)],
        events=events,
        partitions=partitions,
        faults=tuple(faults),
    )
