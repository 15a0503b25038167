"""Fault injection at named protocol steps, for torture tests and the demo's crashes.

A :class:`FaultPlan` names one step and an action. The step names follow the driver's
commit path (``before_decision``, ``after_decision``, ``after_commit:N`` for the N-th
COMMIT of the batch, ``before_mark_done``) and the executor's prepare path
(``after_prepare``); ``in_batch_transaction`` fires inside the one transaction of a
``visibility=batch`` commit, just before its COMMIT; in mode ``staging`` with
``visibility=partition``, after the first MOVE of the batched publish; and in
mode ``dedup`` just before the one INSERT of the batch's markers. A batch job published at once
(:mod:`clickhouse_tx.jobs.publish`) adds ``before_publish`` (its stage committed),
``in_publish`` (inside the publishing transaction, before its COMMIT) and
``after_publish`` (after that COMMIT, before Spark's ``commit`` returns).
The action ``kill`` SIGKILLs the whole process group (the Spark
driver's Python, its JVM and workers when the job was started in its own session),
``exit`` ends only this process, ``raise`` raises :class:`InjectedFault`: the code
stops there as a crashed process would (a ``BaseException``: no error handling of the
protocol runs, only ``finally`` blocks), but the job lives to report it. ``error``
raises :class:`InjectedServerError`, a :class:`~clickhouse_tx.errors.ServerError` like
an exception in a ClickHouse reply, which the protocol handles as it handles any error
(at ``after_commit:N``: a server error after the COMMIT took effect, which the driver
settles by the xid's marker).

A plan fires at most once per ``once_file``: the file is created just before the action,
so a restarted query is not killed again at the same step.

``kill`` and Spark: pyspark's worker daemon moves itself and its workers into a process
group of their own, so the group of the process that hits the fault is not the driver's.
A job that wants the driver killed exports ``CLICKHOUSE_TX_KILL_PGID`` (its own process
group) before it starts Spark; the JVM and every Python worker inherit it.

The hooks are for tests only: a ``fault.*`` option is refused (:func:`check_enabled`,
on the driver when the writer's options are parsed, and again wherever a plan is
parsed) unless the process runs with ``CLICKHOUSE_TX_TEST_FAULTS=1``. The test suite
sets it in ``tests/conftest.py`` before any Spark or subprocess starts, so the JVM,
its Python workers and the jobs the torture tests launch all inherit it; so does the
demo's job (``spark_datasource/testing/job_launcher.py``), whose crashes are these hooks.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import signal
import threading
from typing import TYPE_CHECKING, Iterable, Iterator, Mapping, Sequence

import pyarrow as pa

from clickhouse_tx.conversion.schema import TableInfo
from clickhouse_tx.errors import ConfigurationError, ServerError
from clickhouse_tx.interfaces import (
    CommitModeIO,
    CommitOutcome,
    Decision,
    DecisionLogIO,
    Hook,
    Prepared,
    Target,
    WriteContext,
)

if TYPE_CHECKING:  # pragma: no cover
    from clickhouse_tx.protocol.coordinator import Coordinator

KILL_PGID_ENV = "CLICKHOUSE_TX_KILL_PGID"
#: Set to ``1`` by the test suite (and the demo's job) only: without it ``fault.*`` is refused.
TEST_FAULTS_ENV = "CLICKHOUSE_TX_TEST_FAULTS"

STEPS = (
    "before_decision",
    "after_decision",
    "in_batch_transaction",
    "after_commit",
    "before_mark_done",
    "after_prepare",
    "before_publish",
    "in_publish",
    "after_publish",
)
#: The steps of a streaming commit where the kill tests, the pipeline harness and chaos
#: runs crash a job, in protocol order (``after_commit:1``: after the first part commits).
STREAMING_STEPS = ("after_prepare", "before_decision", "after_decision", "after_commit:1", "before_mark_done")
ACTIONS = ("kill", "exit", "raise", "error")


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process may run fault hooks (``CLICKHOUSE_TX_TEST_FAULTS=1``)."""
    return (os.environ if environ is None else environ).get(TEST_FAULTS_ENV) == "1"


def check_enabled(names: Iterable[str], environ: Mapping[str, str] | None = None) -> None:
    """Refuse fault options outside the test suite.

    Runs on the driver when the writer's options are parsed (once per job or
    streaming commit) and in :meth:`FaultPlan.parse` (executors and the commit), so
    a production writer given ``fault.*`` fails before any task writes.

    Raises
    ------
    ConfigurationError
        ``names`` is not empty and ``CLICKHOUSE_TX_TEST_FAULTS`` is not ``1``.
    """
    given = sorted(names)
    if given and not enabled(environ):
        raise ConfigurationError(
            f"option(s) {', '.join(given)}: fault.* options are test-only hooks (they can "
            f"SIGKILL the process group) and are refused unless {TEST_FAULTS_ENV}=1 is set "
            "in the environment of the Spark driver and executors; remove them"
        )


class InjectedFault(BaseException):
    """Raised by a ``raise`` fault plan (never in production: only when a plan is set).

    A ``BaseException``, as ``KeyboardInterrupt`` is: it stands for the process dying at
    the step, so no ``except Exception`` of the protocol (cleanup, lookups) handles it.
    """


class InjectedServerError(ServerError):
    """Raised by an ``error`` fault plan: a server error at the step, handled as any other."""


@dataclasses.dataclass(frozen=True)
class FaultPlan:
    step: str
    action: str = "kill"
    nth: int = 1
    batch: int | None = None
    once_file: str | None = None

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> "FaultPlan | None":
        """From ``fault.step``, ``fault.action``, ``fault.batch``, ``fault.once_file``.

        ``fault.step`` may carry the count: ``after_commit:2``.

        Raises
        ------
        ConfigurationError
            Without ``CLICKHOUSE_TX_TEST_FAULTS=1`` (:func:`check_enabled`).
        ValueError
            An unknown step or action.
        """
        check_enabled(options)
        raw = options.get("step") or options.get("fault.step")
        if not raw:
            return None
        step, _, nth = raw.partition(":")
        if step not in STEPS:
            raise ValueError(f"fault.step must be one of {', '.join(STEPS)} (got {raw!r})")
        action = options.get("action") or options.get("fault.action") or "kill"
        if action not in ACTIONS:
            raise ValueError(f"fault.action must be one of {', '.join(ACTIONS)} (got {action!r})")
        batch = options.get("batch") or options.get("fault.batch")
        return cls(
            step=step,
            action=action,
            nth=int(nth or 1),
            batch=int(batch) if batch else None,
            once_file=options.get("once_file") or options.get("fault.once_file"),
        )

    def hit(self, step: str, batch: int, count: int = 1) -> None:
        if step != self.step or count != self.nth or (self.batch is not None and batch != self.batch):
            return
        if self.once_file:
            try:
                fd = os.open(self.once_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return
            os.write(fd, f"{step}:{count} batch {batch} pid {os.getpid()}\n".encode())
            os.fsync(fd)
            os.close(fd)
        if self.action == "raise":
            raise InjectedFault(f"injected fault at {step}:{count} of batch {batch}")
        if self.action == "error":
            raise InjectedServerError(f"injected server error at {step}:{count} of batch {batch}")
        if self.action == "exit":
            os._exit(137)
        driver = os.environ.get(KILL_PGID_ENV)
        if driver and int(driver) != os.getpgrp():
            os.killpg(int(driver), signal.SIGKILL)  # the driver's Python and JVM first
        os.killpg(os.getpgrp(), signal.SIGKILL)


class FaultyDecisionLog:
    """A :class:`DecisionLogIO` that fires the plan around decision writes and mark_done."""

    def __init__(self, inner: DecisionLogIO, plan: FaultPlan) -> None:
        self.inner = inner
        self.plan = plan

    def read(self, batch: int) -> Decision | None:
        return self.inner.read(batch)

    def write(self, decision: Decision) -> None:
        self.plan.hit("before_decision", decision.batch)
        self.inner.write(decision)
        self.plan.hit("after_decision", decision.batch)

    def mark_done(self, batch: int) -> None:
        self.plan.hit("before_mark_done", batch)
        self.inner.mark_done(batch)

    def batches(self) -> Iterable[int]:
        return self.inner.batches()

    @property
    def root_uri(self) -> str:
        return self.inner.root_uri

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


class FaultyModeIO:
    """A :class:`CommitModeIO` that fires the plan after the N-th COMMIT and after prepare."""

    def __init__(self, inner: CommitModeIO, plan: FaultPlan) -> None:
        self.inner = inner
        self.plan = plan
        self.mode = inner.mode
        self._commits: dict[int, int] = {}
        # COMMITs one at a time under a plan, so ``after_commit:N`` fires with exactly N
        # done and the others not yet sent, even though the coordinator commits in parallel.
        self._lock = threading.Lock()

    def validate(self, target: Target, schema: pa.Schema, info: TableInfo | None = None) -> None:
        self.inner.validate(target, schema, info)

    def prepare(self, target: Target, ctx: WriteContext, xid: str, batches: Iterator[pa.RecordBatch]) -> Prepared:
        p = self.inner.prepare(target, ctx, xid, batches)
        self.plan.hit("after_prepare", ctx.batch)
        return p

    def commit(self, target: Target, p: Prepared) -> None:
        with self._lock:
            self.inner.commit(target, p)
            n = self._commits[p.batch] = self._commits.get(p.batch, 0) + 1
            self.plan.hit("after_commit", p.batch, n)

    def rollback(self, target: Target, p: Prepared) -> None:
        self.inner.rollback(target, p)

    def lookup(self, target: Target, p: Prepared) -> CommitOutcome:
        return self.inner.lookup(target, p)

    def renew(self, target: Target, p: Prepared) -> bool:
        return self.inner.renew(target, p)

    def check_layout(self, target: Target, batch: int, messages: Sequence[Prepared]) -> None:
        self.inner.check_layout(target, batch, messages)

    def commit_together(self, target: Target, ps: Sequence[Prepared], before_commit: Hook | None = None) -> None:
        self.inner.commit_together(target, ps, before_commit=lambda: self.plan.hit("in_batch_transaction", ps[0].batch))

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)


def with_faults(coordinator: Coordinator, plan: FaultPlan) -> Coordinator:
    """The same coordinator with its mode I/O and decision log wrapped by ``plan``.

    A shallow copy with its context replaced: everything else it was built with (the
    conversion, the xid factory, the clock and sleep, the retry policy) is kept.
    """
    faulty = copy.copy(coordinator)
    faulty.context = dataclasses.replace(
        coordinator.context,
        mode_io=FaultyModeIO(coordinator.mode_io, plan),
        log=FaultyDecisionLog(coordinator.log, plan),
    )
    return faulty
