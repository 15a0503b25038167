"""Dead letters exactly once: the streaming driver SIGKILLed mid-protocol, then restarted.

The Kafka job of :mod:`tests.helpers.torture` writes into a table whose ``v``
column is ``FixedString(5)``: values ``p:i`` with ``i >= 1000`` are 6 bytes and do not
fit. With ``bad_rows=dead_letter`` those rows go to the dead-letter table with the good
rows of their partition: in its transaction, with its dedup token, or in a stage moved
with its stage (modes ``transaction``, ``dedup``, ``staging``). The first run SIGKILLs its own
process group at a protocol step; restarts on the same checkpoint drain the topic.
Every good record must be in the target once and every bad one in the dead-letter
table once.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections import Counter
from pathlib import Path

import pytest

from tests.helpers.spark_streams import make_topic
from tests.helpers.spark_writes import open_registry_entries, read_committed, run_sql
from tests.helpers.torture import PARTITIONS, PER_PARTITION, job_args, kill_at, run_child


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("step", ["after_prepare", "after_commit:1"])
@pytest.mark.parametrize("mode", ["transaction", "dedup", "staging"])
def test_dead_letters_survive_a_driver_kill_and_restart_exactly_once(
    stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path, step: str, mode: str
) -> None:
    topic, expected = make_topic(stack, kafka_bootstrap, PARTITIONS, PER_PARTITION)
    run_sql(
        clickhouse_url,
        f"CREATE TABLE `{database}`.events (p Int32, o Int64, v FixedString(5)) "
        "ENGINE = MergeTree PARTITION BY p ORDER BY (p, o) "
        "SETTINGS non_replicated_deduplication_window = 1000",
    )
    good = {r for r in expected if len(r[2]) <= 5}
    bad = expected - good
    assert good and bad
    options = {"bad_rows": "dead_letter", "dead_letter_table": "events_dlq", "mode": mode}
    name = f"dlq_{uuid.uuid4().hex[:6]}"
    args = job_args(kafka_bootstrap, topic, clickhouse_url, database, tmp_path / "chk", name=name)
    codes = [run_child({**args, "fault": {**options, **kill_at(step, tmp_path)}})]
    for _ in range(4):
        if codes[-1] == 0:
            break
        codes.append(run_child({**args, "fault": options}))
    assert codes[0] == -signal.SIGKILL and codes[-1] == 0, f"exit codes {codes}"

    # FixedString pads with NUL bytes, which TSV prints escaped: strip them in SQL.
    rows = [
        (int(p), int(o), v)
        for p, o, v in read_committed(
            clickhouse_url, f"SELECT p, o, replaceAll(toString(v), char(0), '') FROM `{database}`.events"
        )
    ]
    letters = [
        json.loads(j) for (j,) in read_committed(clickhouse_url, f"SELECT row_json FROM `{database}`.events_dlq")
    ]
    seen = Counter((d["p"], d["o"], d["v"]) for d in letters)
    print(
        f"mode={mode} step={step} exit codes {codes}: produced {len(expected)}, rows {len(rows)} "
        f"({len(set(rows))} distinct, {len(good)} good produced), dead letters {len(letters)} "
        f"({len(seen)} distinct, {len(bad)} bad produced)"
    )
    assert len(rows) == len(set(rows)), f"{len(rows) - len(set(rows))} rows written twice"
    assert set(rows) == good, f"{len(good - set(rows))} rows lost, {len(set(rows) - good)} unexpected"
    assert max(seen.values()) == 1, "a dead letter was written twice"
    assert set(seen) == bad, f"{len(bad - set(seen))} dead letters lost"
    assert len(rows) + len(letters) == len(expected)
    assert open_registry_entries(clickhouse_url, database) == 0
