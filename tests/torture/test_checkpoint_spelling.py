"""A driver SIGKILLed between COMMIT and Spark's commit log, restarted with the checkpoint spelled otherwise.

The first run (checkpoint ``<tmp>/chk``, no query name) is SIGKILLed with its whole
process group after every partition of batch 1 is COMMITted and before the batch is
marked done, so Spark's ``commits/1`` is never written and the restart replays batch 1.
The restart spells the same checkpoint another way (trailing ``/``, relative to the
driver's working directory, ``file://``) or adds ``.queryName(...)``. Spark sees the
same checkpoint every time; the writer must see the same transactional id, roll the
batch's decision forward and write nothing twice. Every Kafka record must be in
ClickHouse exactly once, and the checkpoint must hold one decision log.
"""

from __future__ import annotations

import json
import signal
import uuid
from pathlib import Path

import pytest

from tests.helpers.spark_streams import assert_exactly, create_target, make_topic
from tests.helpers.spark_writes import open_registry_entries
from tests.helpers.torture import PARTITIONS, PER_PARTITION, kill_at, run_child_past_worker_start, slow_except


def _respelled(variant: str, chk: Path) -> tuple[str, str | None, Path]:
    """(checkpoint spelling, query name, working directory) of the restart."""
    if variant == "trailing_slash":
        return f"{chk}/", None, chk.parent
    if variant == "relative":
        return "chk", None, chk.parent
    if variant == "file_uri":
        return f"file://{chk}", None, chk.parent
    if variant == "query_name_added":
        return str(chk), f"named_{uuid.uuid4().hex[:6]}", chk.parent
    raise ValueError(variant)


VARIANTS = ["trailing_slash", "relative", "file_uri", "query_name_added"]


@pytest.mark.timeout(2400)
@pytest.mark.parametrize("variant", slow_except(VARIANTS, fast="relative"))
def test_a_restart_with_the_checkpoint_spelled_otherwise_rolls_the_killed_batch_forward_not_again(
    stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path, variant: str
) -> None:
    topic, expected = make_topic(stack, kafka_bootstrap, PARTITIONS, PER_PARTITION)
    create_target(clickhouse_url, database)
    chk = tmp_path / "chk"
    base = {"bootstrap": kafka_bootstrap, "topic": topic, "url": clickhouse_url, "database": database, "daemon": True}
    fault = kill_at("before_mark_done", tmp_path)
    codes = [run_child_past_worker_start({**base, "chk": str(chk), "name": None, "fault": fault}, tmp_path)]
    assert codes[0] == -signal.SIGKILL and (tmp_path / "fault.once").exists()
    assert not (chk / "commits" / "1").exists(), "Spark logged batch 1: the kill came too late"

    spelling, name, cwd = _respelled(variant, chk)
    for _ in range(3):
        codes.append(run_child_past_worker_start({**base, "chk": spelling, "name": name}, cwd))
        if codes[-1] == 0:
            break
    assert codes[-1] == 0, f"the restarted job did not drain the topic: exit codes {codes}"
    assert_exactly(clickhouse_url, database, expected)
    assert open_registry_entries(clickhouse_url, database) == 0
    logs = [p.name for p in (chk / "clickhouse_tx").iterdir() if p.is_dir()]
    record = json.loads((chk / "clickhouse_tx" / "query.json").read_text())
    assert logs == [record["transactional_id"]], f"one query, one decision log: {logs}"
