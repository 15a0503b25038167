"""Mode ``staging``: the batch's one ``DROP ... SYNC`` of its stages comes after every marker.

A ClickHouse restart under that DROP (its reply lost) must not stop a batch that is
already published: the per-xid commits find the markers and drop the stages.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import ReplyLostError
from clickhouse_tx.factory import build_coordinator
from clickhouse_tx.interfaces import WriteContext
from clickhouse_tx.modes.staging.tables import STAGE_PREFIX
from tests.helpers.tables import TXN, batches, committed_count, distinct_ids, make_table, rows, tables

PARTS = 3


def test_a_lost_reply_to_the_batch_s_stage_drop_still_commits_the_batch_and_drops_every_stage(
    admin: ClickHouseHTTP, database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = make_table(admin, database)
    co = build_coordinator(target, "staging", TXN, str(tmp_path))
    msgs = [co.prepare(WriteContext(TXN, 0, p, 0), batches(rows(100, start=100 * p))) for p in range(PARTS)]
    lost: list[str] = []
    command = ClickHouseHTTP.command

    def restart_under_the_batched_drop(self: ClickHouseHTTP, sql: str, *args: Any, **kwargs: Any) -> str:
        if sql.startswith("DROP TABLE IF EXISTS") and sql.count(STAGE_PREFIX) > 2 and not lost:
            lost.append(sql)  # the batch's drop, not a per-xid one: never sent, reply lost
            raise ReplyLostError("DROP TABLE IF: connection lost before the reply (RemoteDisconnected)")
        return command(self, sql, *args, **kwargs)

    monkeypatch.setattr(ClickHouseHTTP, "command", restart_under_the_batched_drop)
    report = co.commit_batch(0, msgs)
    assert lost, "the batch's stages were not dropped in one request"
    assert len(report.committed) == PARTS
    assert committed_count(admin, target) == distinct_ids(admin, target) == 100 * PARTS
    assert not {t for t in tables(admin, database) if t.startswith(STAGE_PREFIX)}
