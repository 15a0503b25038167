"""``python -m clickhouse_tx --shards ...``: status, gc and verify over every shard."""

from __future__ import annotations

import dataclasses
import json
import uuid
from pathlib import Path

from clickhouse_tx.factory import build_coordinator
from clickhouse_tx.interfaces import Target, WriteContext
from clickhouse_tx.sharding.io import prepare_sharded
from clickhouse_tx.sharding.placement import ShardPlacement
from server_patches.stack_files import StackInfo
from tests.helpers.cli import run_cli
from tests.helpers.shards import create_everywhere, drop_everywhere, sharded_table
from tests.helpers.tables import TXN, batches, rows


def _insert(url: str, database: str, offsets: list[int]) -> None:
    from clickhouse_tx.client.http import ClickHouseHTTP

    values = ", ".join(f"('t', 0, {o})" for o in offsets)
    with ClickHouseHTTP(Target(url=url, database=database, table="k")) as c:
        c.command(f"INSERT INTO `{database}`.k VALUES {values}")


def test_verify_across_shards_counts_an_offset_on_two_shards_as_a_duplicate(sharded_stack: StackInfo) -> None:
    database = f"shv_{uuid.uuid4().hex[:8]}"
    create_everywhere(sharded_stack, f"CREATE DATABASE `{database}`")
    try:
        create_everywhere(
            sharded_stack,
            f"CREATE TABLE `{database}`.k (topic String, partition Int32, offset Int64) "
            "ENGINE = MergeTree ORDER BY offset",
        )
        (a,), (b,) = sharded_stack.clickhouse_urls
        _insert(a, database, list(range(0, 100, 2)))
        _insert(b, database, list(range(1, 100, 2)))
        args = ["verify", "--shards", sharded_stack.shards_option, "--table", f"{database}.k"]
        clean = run_cli(*args, "--expected", '{"t": {"0": 100}}')
        assert clean.returncode == 0, clean.stdout + clean.stderr
        assert "CLEAN" in clean.stdout
        # Each shard alone has a gap at every other offset; the union has none.
        single = run_cli("verify", "--url", a, "--table", f"{database}.k", "--no-markers")
        assert single.returncode == 1
        _insert(b, database, [4, 200])
        bad = run_cli(*args, "--json", "-")
        assert bad.returncode == 1
        doc = json.loads(bad.stdout)
        dup = [x for x in doc["anomalies"] if x["kind"] == "duplicate"]
        assert [(x["first"], x["last"], x["count"]) for x in dup] == [(4, 4, 1)]
        assert a in dup[0]["detail"] and b in dup[0]["detail"]
        gaps = [(x["first"], x["last"]) for x in doc["anomalies"] if x["kind"] == "gap"]
        assert gaps == [(100, 199)]
    finally:
        drop_everywhere(sharded_stack, database)


def test_status_and_gc_cover_the_open_prepares_of_every_shard(sharded_stack: StackInfo, tmp_path: Path) -> None:
    target = sharded_table(sharded_stack)
    try:
        placement = ShardPlacement(tuple((u,) for (u,) in sharded_stack.clickhouse_urls), key="id")

        def on(shard: int, url: str):
            return build_coordinator(dataclasses.replace(target, url=url), "transaction", TXN, str(tmp_path))

        msgs = prepare_sharded(placement, on, target, WriteContext(TXN, 0, 0, 0), batches(rows(500)))
        assert len(msgs) == 2
        table = ["--table", f"{target.database}.{target.table}"]
        status = run_cli("status", "--shards", sharded_stack.shards_option, *table, "--json")
        assert status.returncode == 0, status.stderr
        docs = [json.loads(d) for d in status.stdout.replace("}\n{", "}\n\x00{").split("\x00")]
        assert [d["open_by_state"] for d in docs] == [{"initialized": 1}, {"initialized": 1}]
        gc = run_cli(
            "gc", "--shards", sharded_stack.shards_option, *table, "--mode", "transaction",
            "--txn-id", TXN, "--older-than", "0", "--not-running",
        )  # fmt: skip
        assert gc.returncode == 0, gc.stdout + gc.stderr
        assert gc.stdout.count("rolled back 1,") == 2
        after = run_cli("status", "--shards", sharded_stack.shards_option, *table)
        assert after.stdout.count("0 open transactions") == 2, after.stdout
    finally:
        drop_everywhere(sharded_stack, target.database)
