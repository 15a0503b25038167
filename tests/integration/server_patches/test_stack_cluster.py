"""The embedded stack as a cluster: shards × replicas ClickHouse servers on one ZooKeeper."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Callable

import requests

from server_patches import chdb_config, stack, stack_clickhouse, stack_files
from server_patches.stack_files import StackInfo


def _q(url: str, sql: str) -> str:
    r = requests.post(url, data=sql.encode(), timeout=60)
    assert r.status_code == 200, r.text
    return r.text.strip()


def test_rendered_cluster_config_has_macros_the_cluster_and_per_shard_keeper_paths() -> None:
    servers = (((stack_files.HOST, 1), (stack_files.HOST, 2)), ((stack_files.HOST, 3), (stack_files.HOST, 4)))
    text = chdb_config.render(
        zookeeper=[("127.0.0.1", 2181)], name="st", member=chdb_config.ClusterMember(1, 0, servers)
    )
    assert "<shard>1</shard>" in text and "<replica>r0</replica>" in text
    assert "<clickhouse_tx>" in text and text.count("<replica>\n") == 4
    # Each shard under its own ZooKeeper root; each server its own transaction log.
    assert "<root>/clickhouse_tx_stack/st-s1</root>" in text
    assert "<keeper_map_path_prefix>/keeper_map<" in text and "<zookeeper_path>/r0/txn<" in text


def test_two_shards_are_two_servers_with_their_own_data_and_keeper_map_tables(sharded_stack: StackInfo) -> None:
    urls = sharded_stack.clickhouse_urls
    assert len(urls) == 2 and all(len(r) == 1 for r in urls)
    assert sharded_stack.shards_option == f"{urls[0][0]},{urls[1][0]}"
    assert urls[0][0] == sharded_stack.clickhouse_url
    for i, (url,) in enumerate(urls):
        _q(url, "CREATE DATABASE IF NOT EXISTS cl_t")
        _q(url, "CREATE TABLE IF NOT EXISTS cl_t.km (k String, v UInt64) ENGINE = KeeperMap('/km') PRIMARY KEY k")
        _q(url, f"INSERT INTO cl_t.km VALUES ('shard', {i})")
        _q(url, "CREATE TABLE IF NOT EXISTS cl_t.t (x UInt64) ENGINE = MergeTree ORDER BY x")
        _q(url, f"INSERT INTO cl_t.t SELECT number FROM numbers({10 + i})")
    # Same KeeperMap DDL path, yet each shard keeps its own rows (its own prefix).
    assert [_q(u, "SELECT v FROM cl_t.km WHERE k = 'shard'") for (u,) in urls] == ["0", "1"]
    assert [_q(u, "SELECT count() FROM cl_t.t") for (u,) in urls] == ["10", "11"]
    assert [_q(u, "SELECT getMacro('shard')") for (u,) in urls] == ["0", "1"]


def test_cli_up_with_shards_and_replicas_prints_the_urls_and_kill_restart_one_server(tmp_path: Path) -> None:
    def cli(*args: str) -> dict[str, object]:
        out = subprocess.run(
            [sys.executable, "-m", "server_patches", *args, "--dir", str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode in (0, 3), out.stderr
        return dict(json.loads(out.stdout))

    try:
        up = cli("up", "--shards", "2", "--replicas", "2")
        urls = up["clickhouse_urls"]
        assert isinstance(urls, list) and [len(r) for r in urls] == [2, 2]
        assert up["shards_option"] == ",".join("|".join(r) for r in urls)
        assert all(stack_clickhouse.ping(u) for r in urls for u in r)
        cli("kill", "--shard", "1", "--replica", "1")
        assert not stack_clickhouse.ping(urls[1][1]) and stack_clickhouse.ping(urls[1][0])
        status = cli("status")
        assert status["running"] is False
        assert status["components"]["clickhouse-s1r1"]["alive"] is False  # type: ignore[index]
        cli("restart", "--shard", "1", "--replica", "1")
        assert stack_clickhouse.ping(urls[1][1])
        assert cli("status")["running"] is True
    finally:
        down = cli("down")
    assert sorted(down["stopped"]) == sorted(  # type: ignore[arg-type]
        ["clickhouse", "clickhouse-s0r1", "clickhouse-s1r0", "clickhouse-s1r1", "zookeeper"]
    )


def test_a_running_stack_refuses_another_shard_count(stack_factory: Callable[..., StackInfo]) -> None:
    info = stack_factory()
    try:
        stack.start_stack(info.dir, shards=2)
    except stack.StackError as e:
        assert "run `down` first" in str(e) and "1 shard(s)" in str(e)
    else:
        raise AssertionError("a running one-server stack was turned into a cluster")
    assert "clickhouse_urls" not in json.loads((info.dir / "stack.json").read_text())
