"""SIGKILLs on a 2-shard stack: the Spark driver at each protocol step, and one shard's
ClickHouse server mid-run; then every record checked across both shards.

Each case runs a streaming job (``kafka_py`` -> ``clickhouse_tx`` with the ``shards``
option, rows by ``sharding_key``, trigger ``availableNow``) in a child process of its
own session, kills it (a fault plan at a protocol step) or a shard server (from here,
after a delay), and restarts the job on the same checkpoint until it drains the topic.
A record on two shards is a duplicate. The job is :mod:`tests.helpers.torture`'s.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path
from typing import Callable

import pytest

from clickhouse_tx.testing.faults import STREAMING_STEPS
from server_patches import crashes
from server_patches.stack_files import StackInfo
from tests.helpers.shards import create_everywhere
from tests.helpers.spark_streams import make_topic
from tests.helpers.spark_writes import open_registry_entries, read_committed
from tests.helpers.torture import job_args, run_child

PARTITIONS = 3
PER_PARTITION = 1000
MAX_OFFSETS = 900  # 300 per partition: 4 micro-batches


def _run_child(args: dict, during: Callable[[], None] | None = None) -> int:
    """One run of the job; a failure is a restart like any other (its causes printed)."""
    return run_child(args, timeout_s=400, during=during, check=False)


def _assert_exactly_once_across_shards(info: StackInfo, database: str, expected: set) -> None:
    rows: list[tuple[int, int, str]] = []
    for (url,) in info.clickhouse_urls:
        got = read_committed(url, f"SELECT p, o, v FROM `{database}`.events")
        assert got, f"shard {url} holds no row: the key spreads rows over both"
        rows += [(int(p), int(o), v) for p, o, v in got]
    assert len(rows) == len(set(rows)), f"{len(rows) - len(set(rows))} duplicates across the shards"
    missing, extra = expected - set(rows), set(rows) - expected
    assert not missing and not extra, f"{len(missing)} missing, {len(extra)} unexpected rows"
    for (url,) in info.clickhouse_urls:
        assert open_registry_entries(url, database) == 0


def _setup(info: StackInfo, tmp_path: Path, mode: str) -> tuple[dict, set]:
    topic, expected = make_topic(info, info.kafka_bootstrap or "", PARTITIONS, PER_PARTITION)
    database = f"shk_{uuid.uuid4().hex[:8]}"
    create_everywhere(info, f"CREATE DATABASE `{database}`")
    create_everywhere(
        info,
        f"CREATE TABLE `{database}`.events (p Int32, o Int64, v String) ENGINE = MergeTree ORDER BY (p, o)"
        + (" SETTINGS non_replicated_deduplication_window = 1000" if mode == "dedup" else ""),
    )
    options = {"shards": info.shards_option, "sharding_key": "o", "mode": mode}
    # Workers forked by pyspark's daemon: a started one must connect back within 10 s.
    more = {"options": options, "daemon": True, "max_offsets": MAX_OFFSETS, "name": f"shk_{uuid.uuid4().hex[:6]}"}
    args = job_args(info.kafka_bootstrap or "", topic, None, database, tmp_path / "chk", **more)
    return args, expected


def _until_drained(args: dict, codes: list[int]) -> None:
    for _ in range(5):
        if codes[-1] == 0:
            return
        codes.append(_run_child(args))
    assert codes[-1] == 0, f"the job did not drain the topic after restarts: exit codes {codes}"


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_driver_killed_at_each_protocol_step_on_two_shards_loses_and_duplicates_nothing(
    stack_factory: Callable[..., StackInfo], tmp_path: Path
) -> None:
    info = stack_factory(shards=2, kafka=True)
    for step in STREAMING_STEPS:
        args, expected = _setup(info, tmp_path / step, "transaction")
        once = tmp_path / f"{step}.once"
        fault = {"fault.step": step, "fault.action": "kill", "fault.batch": "1", "fault.once_file": str(once)}
        codes = [_run_child({**args, "fault": fault})]
        # A run that failed before the fault fired (a loaded machine: "Python worker
        # failed to connect back") is a restart like any other: run it again, faulty.
        while not once.exists() and codes[-1] != 0 and len(codes) < 3:
            codes.append(_run_child({**args, "fault": fault}))
        assert codes[-1] == -signal.SIGKILL and once.exists(), f"{step}: no run was killed: {codes}"
        _until_drained(args, codes)
        _assert_exactly_once_across_shards(info, args["database"], expected)
        print(f"{step}: exit codes {codes}")


@pytest.mark.slow
@pytest.mark.timeout(1500)
@pytest.mark.parametrize("mode", ["transaction", "staging"])
def test_a_shard_server_killed_and_restarted_mid_run_loses_and_duplicates_nothing(
    stack_factory: Callable[..., StackInfo], tmp_path: Path, mode: str
) -> None:
    info = stack_factory(shards=2, kafka=True)
    args, expected = _setup(info, tmp_path, mode)
    urls = info.clickhouse_urls
    restarted: list[float] = []

    def crash_shard_1() -> None:
        # Once the first micro-batch is visible the query is mid-run: crash shard 1 then.
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if any(read_committed(u, f"SELECT 1 FROM `{args['database']}`.events LIMIT 1") for (u,) in urls):
                break
            time.sleep(0.2)
        crashes.restart_clickhouse(info.dir, shard=1)
        restarted.append(time.monotonic())

    codes = [_run_child(args, during=crash_shard_1)]
    assert restarted, "shard 1 was not restarted"
    _until_drained(args, codes)
    _assert_exactly_once_across_shards(info, args["database"], expected)
    print(f"{mode}: exit codes {codes}")
