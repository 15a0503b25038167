"""The embedded stack: its launcher, its config, and ClickHouse-style behaviour on bad input."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Callable

import clickhouse_connect
import pytest
import requests
from clickhouse_connect.driver.exceptions import DatabaseError

from server_patches import chdb_config, crashes, zookeeper
from server_patches import stack as stack_mod
from server_patches.stack_files import StackError, StackInfo
from tests.conftest import quote_ident

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "server_patches", *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def _pid_gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


def _sql(url: str, sql: str, **params: object) -> requests.Response:
    return requests.post(url, params=params, data=sql.encode(), timeout=60)


# ------------------------------------------------------------------ config patches


def test_config_d_patches_turn_on_transactions_keeper_map_and_long_sessions() -> None:
    merged = chdb_config.load_patches(chdb_config.patch_files())

    assert merged.findtext("allow_experimental_transactions") == "42"
    assert merged.findtext("transaction_log/zookeeper_path")
    assert merged.findtext("keeper_map_path_prefix")
    assert int(merged.findtext("max_session_timeout") or 0) >= 3600
    # The user's server has its own Keeper: the patches must not point it elsewhere.
    assert merged.find("zookeeper") is None
    assert {p.name for p in chdb_config.patch_files()} == {"transactions.xml", "keeper_map.xml", "sessions.xml"}


def test_rendered_config_puts_each_stack_under_its_own_zookeeper_root(tmp_path: Path) -> None:
    one = ET.fromstring(
        chdb_config.render(zookeeper=[("127.0.0.1", 2181)], name=chdb_config.stack_name(tmp_path / "one"))
    )
    two = ET.fromstring(
        chdb_config.render(zookeeper=[("127.0.0.1", 2181)], name=chdb_config.stack_name(tmp_path / "two"))
    )

    assert one.findtext("zookeeper/node/host") == "127.0.0.1"
    assert one.findtext("zookeeper/node/port") == "2181"
    # each stack under its own ZooKeeper root (chroot); its paths are relative to it
    assert one.findtext("zookeeper/root").startswith("/clickhouse_tx_stack/one-")
    assert two.findtext("zookeeper/root").startswith("/clickhouse_tx_stack/two-")
    assert one.findtext("transaction_log/zookeeper_path") == "/txn"
    assert one.findtext("keeper_map_path_prefix") == "/keeper_map"
    assert one.findtext("allow_experimental_transactions") == "42"


def test_a_config_patch_without_a_clickhouse_root_is_refused_by_name(tmp_path: Path) -> None:
    bad = tmp_path / "bad.xml"
    bad.write_text("<yandexx><a>1</a></yandexx>")

    with pytest.raises(chdb_config.ConfigPatchError, match="bad.xml"):
        chdb_config.load_patches([bad])


def test_zookeeper_without_java_fails_saying_how_to_install_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)

    with pytest.raises(zookeeper.ZooKeeperError, match="make test"):
        zookeeper.start_zookeeper(tmp_path / "zk")


def test_stack_info_round_trips_through_its_json_form(stack: StackInfo) -> None:
    assert StackInfo.from_json(json.loads(json.dumps(stack.to_json()))) == stack


# ------------------------------------------------------------------ the launcher


def test_cli_up_status_down_runs_the_stack_and_leaves_no_stray_processes(tmp_path: Path) -> None:
    d = tmp_path / "cli"
    up = _cli("up", "--dir", str(d))
    assert up.returncode == 0, up.stderr
    info = json.loads(up.stdout.strip().splitlines()[-1])
    try:
        pids = info["pids"]
        assert set(pids) == {"zookeeper", "clickhouse"}
        assert not any(_pid_gone(p) for p in pids.values())
        assert requests.get(info["clickhouse_url"] + "/ping", timeout=10).text == "Ok.\n"
        host, port = info["zookeeper"].split(":")
        assert zookeeper.is_healthy(host, int(port))
        assert json.loads((d / "stack.json").read_text())["clickhouse_url"] == info["clickhouse_url"]

        status = _cli("status", "--dir", str(d))
        assert status.returncode == 0, status.stderr
        assert all(c["alive"] for c in json.loads(status.stdout)["components"].values())

        again = _cli("up", "--dir", str(d))
        assert again.returncode == 0, again.stderr
        again_info = json.loads(again.stdout)
        assert again_info["already_running"] is True
        assert again_info["pids"] == pids
    finally:
        down = _cli("down", "--dir", str(d))
    assert down.returncode == 0, down.stderr
    assert sorted(json.loads(down.stdout)["stopped"]) == ["clickhouse", "zookeeper"]
    assert all(_pid_gone(p) for p in pids.values())
    after = _cli("status", "--dir", str(d))
    assert after.returncode == 3
    assert not any(c["alive"] for c in json.loads(after.stdout)["components"].values())
    assert (d / "clickhouse" / "data").is_dir()  # down keeps the data


def test_restarting_the_stack_on_the_same_dir_keeps_tables_rows_and_keeper_map_entries(
    stack_factory: Callable[..., StackInfo],
) -> None:
    info = stack_factory()
    url = info.clickhouse_url
    for sql in (
        "CREATE TABLE default.kept (id UInt64) ENGINE = MergeTree ORDER BY id",
        "INSERT INTO default.kept SELECT number FROM numbers(1000)",
        "CREATE TABLE default.reg (k String, v String) ENGINE = KeeperMap('/reg') PRIMARY KEY k",
        "INSERT INTO default.reg VALUES ('x1', 'COMMITTED')",
    ):
        assert _sql(url, sql).status_code == 200

    stack_mod.stop_stack(info.dir)
    assert stack_mod.stack_status(info.dir)["running"] is False
    again = stack_mod.start_stack(info.dir)

    assert again.pids != info.pids
    assert _sql(again.clickhouse_url, "SELECT count(), sum(id) FROM default.kept").text == "1000\t499500\n"
    assert _sql(again.clickhouse_url, "SELECT k, v FROM default.reg").text == "x1\tCOMMITTED\n"


def test_down_with_purge_deletes_the_data(stack_factory: Callable[..., StackInfo]) -> None:
    info = stack_factory()
    assert (
        _sql(info.clickhouse_url, "CREATE TABLE default.gone (id UInt64) ENGINE = MergeTree ORDER BY id").status_code
        == 200
    )

    stopped = stack_mod.stop_stack(info.dir, purge=True)

    assert sorted(stopped) == ["clickhouse", "zookeeper"]
    assert not (info.dir / "clickhouse").exists()
    assert not (info.dir / "stack.json").exists()
    again = stack_mod.start_stack(info.dir)
    r = _sql(again.clickhouse_url, "SELECT count() FROM default.gone")
    assert r.headers.get("X-ClickHouse-Exception-Code") == "60"


def test_restart_clickhouse_keeps_committed_rows_and_drops_the_open_transaction(
    stack_factory: Callable[..., StackInfo],
) -> None:
    info = stack_factory()
    client = clickhouse_connect.get_client(host="127.0.0.1", port=info.clickhouse_port, session_id="doomed")
    client.command("CREATE TABLE t (id UInt64) ENGINE = MergeTree ORDER BY id")
    client.command("INSERT INTO t VALUES (1), (2)")
    client.command("BEGIN TRANSACTION")
    # Synchronous: a server refuses a queued (async) INSERT inside a transaction, and
    # async_insert is on by default since 26.2.
    client.command("INSERT INTO t VALUES (3)", settings={"async_insert": 0})
    old_pid = info.pids["clickhouse"]

    after = crashes.restart_clickhouse(info.dir)

    assert _pid_gone(old_pid)
    assert after.clickhouse_url == info.clickhouse_url
    assert after.pids["clickhouse"] != old_pid
    assert _sql(after.clickhouse_url, "SELECT groupArray(id) FROM (SELECT id FROM t ORDER BY id)").text == "[1,2]\n"
    with pytest.raises(DatabaseError):
        client.command("COMMIT")  # the session died with the server
    client.close()


def test_up_on_a_busy_port_fails_clearly_and_leaves_nothing_running(stack: StackInfo, tmp_path: Path) -> None:
    d = tmp_path / "busy"
    with pytest.raises(StackError, match=f"port 127.0.0.1:{stack.clickhouse_port} is already in use"):
        stack_mod.start_stack(d, port=stack.clickhouse_port)

    assert not stack_mod.stack_status(d)["components"]
    assert _processes_running_in(d / "zookeeper") == []  # the ZooKeeper it started was stopped


def _processes_running_in(cwd: Path) -> list[int]:
    """Pids of live processes whose working directory is ``cwd`` (ZooKeeper runs in its dir)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                here = os.readlink(f"/proc/{entry}/cwd")
            except OSError:
                continue
            if Path(here) == cwd.resolve() and not _pid_gone(int(entry)):
                found.append(int(entry))
    return found


def test_password_protected_stack_refuses_anonymous_queries_and_never_stores_the_password(
    stack_factory: Callable[..., StackInfo], monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s3cret-Pa55-for-test"
    monkeypatch.setenv("CHTX_TEST_PASSWORD", secret)
    info = stack_factory(user="alice", password_env="CHTX_TEST_PASSWORD")

    anonymous = requests.post(info.clickhouse_url, data=b"SELECT 1", timeout=30)
    wrong = requests.post(info.clickhouse_url, data=b"SELECT 1", timeout=30, auth=("alice", "not-it"))
    client = clickhouse_connect.get_client(
        host="127.0.0.1", port=info.clickhouse_port, username="alice", password=secret
    )

    assert anonymous.status_code in (401, 403)
    assert anonymous.headers.get("X-ClickHouse-Exception-Code") in ("194", "516")
    assert wrong.status_code in (401, 403)
    assert secret not in wrong.text
    assert client.command("SELECT 1") == 1
    client.close()
    for f in [info.dir / "stack.json", info.dir / "clickhouse" / "config.xml", *(info.dir / "logs").iterdir()]:
        assert secret not in f.read_text(errors="replace"), f


# ------------------------------------------------------------ bad input over raw HTTP


@pytest.fixture
def table_t(clickhouse_url: str, database: str) -> str:
    name = f"{quote_ident(database)}.t"
    assert (
        _sql(clickhouse_url, f"CREATE TABLE {name} (id UInt64, s String) ENGINE = MergeTree ORDER BY id").status_code
        == 200
    )
    return name


def _assert_clickhouse_error(r: requests.Response, code: int, name: str, status: int) -> None:
    assert r.status_code == status, r.text
    assert r.headers.get("X-ClickHouse-Exception-Code") == str(code), r.headers
    assert r.text.startswith(f"Code: {code}. DB::Exception: "), r.text
    assert f"({name})" in r.text, r.text


def _assert_still_serving(url: str, table: str) -> None:
    assert requests.get(url + "/ping", timeout=10).text == "Ok.\n"
    r = requests.post(url, params={"query": f"INSERT INTO {table} FORMAT TSV"}, data=b"7\tseven\n", timeout=30)
    assert r.status_code == 200, r.text
    assert _sql(url, f"SELECT s FROM {table} WHERE id = 7").text == "seven\n"


def test_unknown_table_is_a_404_with_code_60(clickhouse_url: str, table_t: str) -> None:
    r = _sql(clickhouse_url, "SELECT * FROM no_such_database_xyz.no_such_table")
    _assert_clickhouse_error(r, 81, "UNKNOWN_DATABASE", 404)
    db = table_t.rsplit(".", 1)[0]
    r = _sql(clickhouse_url, f"SELECT * FROM {db}.no_such_table")
    _assert_clickhouse_error(r, 60, "UNKNOWN_TABLE", 404)
    _assert_still_serving(clickhouse_url, table_t)


def test_malformed_insert_body_is_a_400_parse_error(clickhouse_url: str, table_t: str) -> None:
    r = requests.post(
        clickhouse_url, params={"query": f"INSERT INTO {table_t} FORMAT TSV"}, data=b"not-a-number\tx\n", timeout=30
    )

    assert r.status_code == 400, r.text
    code = int(r.headers["X-ClickHouse-Exception-Code"])
    assert code in (6, 27, 72), r.text  # CANNOT_PARSE_TEXT / _INPUT_ASSERTION_FAILED / _NUMBER
    assert r.text.startswith(f"Code: {code}. DB::Exception: ")
    assert _sql(clickhouse_url, f"SELECT count() FROM {table_t}").text == "0\n"
    _assert_still_serving(clickhouse_url, table_t)


def test_syntax_error_is_a_400_with_code_62(clickhouse_url: str, table_t: str) -> None:
    _assert_clickhouse_error(_sql(clickhouse_url, "SELEKT 1"), 62, "SYNTAX_ERROR", 400)
    _assert_still_serving(clickhouse_url, table_t)


def test_unknown_format_name_is_a_404_with_code_73(clickhouse_url: str, table_t: str) -> None:
    r = _sql(clickhouse_url, "SELECT 1 FORMAT NoSuchFormatXyz")
    _assert_clickhouse_error(r, 73, "UNKNOWN_FORMAT", 404)
    _assert_still_serving(clickhouse_url, table_t)


def test_unknown_setting_in_the_url_is_a_404_with_code_115(clickhouse_url: str, table_t: str) -> None:
    r = _sql(clickhouse_url, "SELECT 1", no_such_setting_xyz=1)
    _assert_clickhouse_error(r, 115, "UNKNOWN_SETTING", 404)
    assert "no_such_setting_xyz" in r.text
    _assert_still_serving(clickhouse_url, table_t)


def test_garbled_compressed_body_is_refused_and_the_server_keeps_serving(clickhouse_url: str, table_t: str) -> None:
    garbage = bytes(range(256)) * 8
    native = requests.post(
        clickhouse_url, params={"query": f"INSERT INTO {table_t} FORMAT TSV", "decompress": 1}, data=garbage, timeout=30
    )
    lz4_frame = requests.post(
        clickhouse_url,
        params={"query": f"INSERT INTO {table_t} FORMAT TSV"},
        headers={"Content-Encoding": "lz4"},
        data=garbage,
        timeout=30,
    )

    for r in (native, lz4_frame):
        assert r.status_code >= 400, r.text
        code = int(r.headers["X-ClickHouse-Exception-Code"])
        assert r.text.startswith(f"Code: {code}. DB::Exception: "), r.text
        assert re.search(r"\([A-Z][A-Z_0-9]+\)", r.text), r.text  # the error's name
    # A real server fails on the block header or checksum: CHECKSUM_DOESNT_MATCH,
    # UNKNOWN_COMPRESSION_METHOD, TOO_LARGE_SIZE_COMPRESSED, CANNOT_DECOMPRESS, UNKNOWN_CODEC.
    assert int(native.headers["X-ClickHouse-Exception-Code"]) in (40, 89, 246, 271, 432), native.text
    assert int(lz4_frame.headers["X-ClickHouse-Exception-Code"]) == 271, lz4_frame.text
    assert _sql(clickhouse_url, f"SELECT count() FROM {table_t}").text == "0\n"
    _assert_still_serving(clickhouse_url, table_t)


def test_restart_zookeeper_keeps_keeper_map_entries_and_clickhouse_reconnects(
    stack_factory: Callable[..., StackInfo],
) -> None:
    info = stack_factory()
    url = info.clickhouse_url
    assert (
        _sql(url, "CREATE TABLE default.reg (k String, v String) ENGINE = KeeperMap('/reg') PRIMARY KEY k").status_code
        == 200
    )
    assert _sql(url, "INSERT INTO default.reg VALUES ('x1', 'INITIALIZED')").status_code == 200

    after = crashes.restart_zookeeper(info.dir)

    assert after.zookeeper == info.zookeeper
    assert after.pids["zookeeper"] != info.pids["zookeeper"]
    # ClickHouse notices the lost Keeper session on its next use and reconnects;
    # the first queries after the crash may fail with a Keeper error.
    deadline = time.monotonic() + 60
    while True:
        r = _sql(url, "INSERT INTO default.reg VALUES ('x2', 'INITIALIZED')")
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        assert r.headers.get("X-ClickHouse-Exception-Code") in ("999", "242", "225"), r.text
        time.sleep(0.2)
    assert r.status_code == 200, r.text
    assert _sql(url, "SELECT k FROM default.reg ORDER BY k").text == "x1\nx2\n"


def test_shared_stack_serves_kafka_at_its_bootstrap_address(kafka_bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient

    metadata = AdminClient({"bootstrap.servers": kafka_bootstrap}).list_topics(timeout=30)

    assert metadata.brokers, "the broker answered no metadata"
