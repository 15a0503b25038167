"""The servers :mod:`benchmarks.peers` runs against, and its ClickHouse killer.

:class:`ClickHouseKiller` SIGKILLs the stack's ClickHouse server at a plan's moments,
counted from the start of the run (the killer starts as the run's events start), and
starts it again on the same data after a pause
(:mod:`server_patches.crashes`). The Spark driver's own kills are the pipeline
harness's (``PipelineConfig.crashes``, at a fault step of the sink or at a random moment
after the first batch).

Calling process of the benchmark (a thread beside a run).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from pathlib import Path
from typing import Any

from clickhouse_tx.client.sql import qualified, split_table
from clickhouse_tx.verify.verifier import ClickHouseReader
from server_patches import crashes


def count_rows(reader: ClickHouseReader, sql: str) -> int:
    """The one number ``sql`` selects (as ``n``); -1 while the server is away (killed,
    restarting) or the table is not there yet."""
    try:
        return int(reader.rows(sql, committed=False)[0]["n"])
    except Exception:  # killed, restarting or not created yet: no count now
        return -1


@dataclasses.dataclass
class Servers:
    """The embedded stack of one benchmark run, where its runs keep their files, and what
    they all share: the topics' partitions, the Spark peers' ``kafka_py`` options
    (``KEY=VALUE``, e.g. ``maxPartitions=2``) and their jobs' Spark settings (``KEY=VALUE``)."""

    stack_dir: Path
    url: str
    bootstrap: str
    control: str | None
    partitions: int
    work: Path
    source_options: tuple[str, ...] = ()
    spark_conf: tuple[str, ...] = ()
    _names: itertools.count = dataclasses.field(default_factory=itertools.count)

    def fresh_name(self, peer: str) -> str:
        """A name no other run of this process used: the run's topic and table."""
        return f"{peer}_{int(time.time())}_{next(self._names)}"


@dataclasses.dataclass(frozen=True)
class FaultPlan:
    """ClickHouse is killed ``at_s`` seconds after the run started, for
    ``down_s`` each time; a Spark peer's driver is also SIGKILLed once per entry of
    ``driver_kills`` (a fault step of its sink, or ``random``; ``PipelineConfig.crash_points``)."""

    at_s: tuple[float, ...]
    down_s: float = 2.0
    driver_kills: tuple[str, ...] = ()


class ClickHouseKiller:
    """A thread killing ClickHouse at the plan's moments (a context manager: started on
    enter; on exit, stopped, and a server it left down is started again)."""

    def __init__(self, srv: Servers, table: str, plan: FaultPlan, poll_s: float = 0.1) -> None:
        self.srv, self.plan, self.poll_s = srv, plan, poll_s
        self.src = qualified(*split_table(table))
        self.kills: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ClickHouseKiller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(120)
        crashes.start_clickhouse(self.srv.stack_dir)  # no-op when it runs

    def _rows(self) -> int:
        reader = ClickHouseReader(self.srv.url, timeout_s=10)
        try:
            return count_rows(reader, f"SELECT count() AS n FROM {self.src}")
        finally:
            reader.close()

    def _run(self) -> None:
        # From the start, not from the first row in the table: in one run both of (a)'s
        # driver kills came before any of its rows were visible, its first row showed
        # 97 s into the run, and both ClickHouse kills would have come after its end.
        started = time.monotonic()
        for at in self.plan.at_s:
            if self._stop.wait(max(0.0, started + at - time.monotonic())):
                return
            rows = self._rows()
            crashes.kill_clickhouse(self.srv.stack_dir)
            killed = time.monotonic()
            time.sleep(self.plan.down_s)
            crashes.start_clickhouse(self.srv.stack_dir)
            self.kills.append(
                {
                    "after_start_s": round(killed - started, 2),
                    "rows_before": rows,
                    "down_s": round(time.monotonic() - killed, 2),
                }
            )
