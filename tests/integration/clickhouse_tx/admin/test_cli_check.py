"""``python -m clickhouse_tx check``: the preflight before the first write, against the real local server."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from clickhouse_tx.admin.preflight import Plan, run_checks
from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.interfaces import Mode, Target
from spark_datasource.testing.credentials import target_fields
from tests.helpers.cli import run_cli

DEDUP_WINDOW = "SETTINGS non_replicated_deduplication_window = 1000"


def _create(url: str, database: str, table: str, engine: str = "MergeTree ORDER BY id", settings: str = "") -> None:
    admin = ClickHouseHTTP(Target(url=url, database=database, table=table, **target_fields()))
    with admin:
        admin.command(f"CREATE TABLE {q.qualified(database, table)} (id UInt64) ENGINE = {engine} {settings}")


def _lines(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.strip()]


@pytest.mark.parametrize("mode", [m.value for m in Mode])
def test_check_passes_every_line_for_each_mode_into_a_proper_table(
    clickhouse_url: str, database: str, mode: str
) -> None:
    _create(clickhouse_url, database, "events", settings=DEDUP_WINDOW if mode == "dedup" else "")
    res = run_cli("check", "--url", clickhouse_url, "--table", f"{database}.events", "--mode", mode)
    assert res.returncode == 0, res.stdout + res.stderr
    lines = _lines(res.stdout)
    assert lines and all(ln.startswith("ok  ") for ln in lines), lines
    assert lines[0].startswith("ok  server (ClickHouse ") and lines[-1] == f"ok  mode {mode}"
    assert "ok  server contract settings" in res.stdout and "ok  grants" in res.stdout


def test_check_writes_nothing_into_the_target(clickhouse_url: str, database: str) -> None:
    _create(clickhouse_url, database, "events", settings=DEDUP_WINDOW)
    common = ["--url", clickhouse_url, "--table", f"{database}.events"]
    for mode in Mode:
        assert run_cli("check", *common, "--mode", mode.value).returncode == 0
    with ClickHouseHTTP(Target(url=clickhouse_url, database=database, table="events", **target_fields())) as c:
        assert c.command(f"SELECT count() FROM {q.qualified(database, 'events')}").strip() == "0"


def test_dedup_into_a_table_without_a_window_fails_naming_the_alter_that_fixes_it(
    clickhouse_url: str, database: str
) -> None:
    _create(clickhouse_url, database, "events")
    res = run_cli("check", "--url", clickhouse_url, "--table", f"{database}.events", "--mode", "dedup")
    assert res.returncode == 1, res.stdout + res.stderr
    fail = [ln for ln in _lines(res.stdout) if ln.startswith("FAIL ")]
    assert len(fail) == 1 and fail[0].startswith("FAIL mode dedup: ")
    assert "MODIFY SETTING non_replicated_deduplication_window = 1000" in fail[0]


@pytest.mark.parametrize("engine", ["Memory", "Log"])
def test_transaction_mode_into_a_memory_or_log_table_fails_suggesting_staging(
    clickhouse_url: str, database: str, engine: str
) -> None:
    _create(clickhouse_url, database, "events", engine=engine)
    res = run_cli("check", "--url", clickhouse_url, "--table", f"{database}.events", "--mode", "transaction")
    assert res.returncode == 1
    assert f"ok  table {database}.events ({engine})" in res.stdout
    fail = [ln for ln in _lines(res.stdout) if ln.startswith("FAIL ")]
    assert len(fail) == 1 and fail[0].startswith("FAIL mode transaction: ") and "use mode 'staging'" in fail[0]


def test_an_unknown_table_fails_its_line_and_the_server_checks_still_run(clickhouse_url: str, database: str) -> None:
    res = run_cli("check", "--url", clickhouse_url, "--table", f"{database}.missing", "--mode", "staging")
    assert res.returncode == 1
    lines = _lines(res.stdout)
    assert lines[-1].startswith(f"FAIL table {database}.missing: table {database}.missing does not exist")
    assert "ok  keeper map" in res.stdout and "ok  grants" in res.stdout


def test_a_profile_that_refuses_a_pinned_setting_fails_naming_the_setting_and_the_profile_fix(
    clickhouse_url: str, database: str
) -> None:
    # The embedded server runs every query as its one users.xml user and has no writable
    # access storage, so no second user with a settings constraint can be made; a
    # read-only request (readonly = 1 ahead of the contract's settings, as a read-only
    # profile sets it) is refused by the server the same way, code 164.
    _create(clickhouse_url, database, "events", settings=DEDUP_WINDOW)
    readonly = {"readonly": "1"}
    target = Target(url=clickhouse_url, database=database, table="events", settings=readonly, **target_fields())
    results = {r.name: r for r in run_checks(Plan(target, Mode.DEDUP))}
    refused = results["server contract settings"]
    assert not refused.ok
    assert "refuses the setting async_insert=0" in refused.detail and "READONLY" in refused.detail
    assert "allow it in the user's settings profile" in refused.detail
    assert refused.line().startswith("FAIL server contract settings: the server refuses the setting async_insert")


@pytest.fixture(scope="module")
def bare_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A private stack without transactions, sessions capped at 60 s and user ``checker``
    whose password is in ``CHECK_PW`` (the child processes inherit it)."""
    from server_patches import stack

    os.environ["CHECK_PW"] = "s3cret-Pw-9"
    d = tmp_path_factory.mktemp("check_stack")
    try:
        info = stack.start_stack(d, transactions=False, max_session_timeout=60, user="checker", password_env="CHECK_PW")
        target = Target(url=info.clickhouse_url, database="default", table="x", user="checker", password="s3cret-Pw-9")
        with ClickHouseHTTP(target) as c:
            c.command("CREATE DATABASE IF NOT EXISTS bare")
            c.command("CREATE TABLE IF NOT EXISTS bare.events (id UInt64) ENGINE = MergeTree ORDER BY id")
        yield info.clickhouse_url
    finally:
        stack.stop_stack(d)


def _check_as_checker(url: str, *args: str, password_env: str = "CHECK_PW") -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "clickhouse_tx", "check", "--url", url, "--user", "checker"]
    argv += ["--password-env", password_env, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


@pytest.mark.embedded_only("starts a stack of its own without transactions")
def test_transaction_mode_on_a_server_without_transactions_or_long_sessions_fails_both_lines(
    bare_server: str,
) -> None:
    res = _check_as_checker(bare_server, "--table", "bare.events", "--mode", "transaction")
    assert res.returncode == 1, res.stdout + res.stderr
    lines = _lines(res.stdout)
    tx = next(ln for ln in lines if ln.startswith("FAIL transactions: "))
    assert "allow_experimental_transactions" in tx and "transactions.xml" in tx
    session = next(ln for ln in lines if ln.startswith("FAIL session timeout 3600 s: "))
    assert "max_session_timeout" in session
    assert lines[-1] == "FAIL mode transaction: as 'transactions' above"
    assert "s3cret-Pw-9" not in res.stdout + res.stderr


@pytest.mark.embedded_only("starts a stack of its own without transactions")
def test_staging_on_a_server_without_transactions_passes_saying_batch_jobs_go_per_partition(bare_server: str) -> None:
    res = _check_as_checker(bare_server, "--table", "bare.events", "--mode", "staging")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ok  transactions (off: a batch job is published one partition at a time)" in res.stdout


@pytest.mark.embedded_only("starts a stack of its own with a password")
def test_a_wrong_password_fails_the_server_line_alone_and_is_never_printed(bare_server: str, tmp_path: Path) -> None:
    os.environ["CHECK_WRONG_PW"] = "not-the-Pw-7"
    res = _check_as_checker(bare_server, "--table", "bare.events", "--mode", "none", password_env="CHECK_WRONG_PW")
    assert res.returncode == 1
    assert _lines(res.stdout) == [
        f"FAIL server: authentication failed for ClickHouse at {bare_server} as user 'checker': "
        "check --user and --password-env"
    ]
    assert "not-the-Pw-7" not in res.stdout + res.stderr and "s3cret-Pw-9" not in res.stdout + res.stderr
