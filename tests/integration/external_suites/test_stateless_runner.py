"""The runner of ClickHouse's stateless tests (tests/external_suites/clickhouse_stateless.py)
judges tests as clickhouse-test does, on small tests written here in ClickHouse's format."""

from __future__ import annotations

import json
from pathlib import Path

from spark_datasource.testing import credentials
from tests.external_suites import clickhouse_stateless

TESTS = {
    "00001_txn_rollback.sql": (
        "create table t (n Int64) engine=MergeTree order by n;\n"
        "commit; -- { serverError INVALID_TRANSACTION }\n"
        "set async_insert = 0;\nbegin transaction;\ninsert into t values (1);\n"
        "select 'in', count() from t;\nrollback;\n"
        "select 'after', count() from t;\n",
        "in\t1\nafter\t0\n",
    ),
    "00002_txn_wrong_reference.sql": ("select 1;\n", "2\n"),
    "00003_txn_unexpected_error.sql": ("select 'before';\nselect throwIf(1);\n", "before\n"),
    "00004_txn_cluster.sql": (
        "select 'first';\nselect * from cluster('test_cluster_two_shards', system, one);\n",
        "first\n0\n0\n",
    ),
    "00005_txn_shell.sh": (
        '. "$(dirname "$0")"/../shell_config.sh\n'
        '$CLICKHOUSE_CLIENT -q "create table s (n Int64) engine=MergeTree order by n; insert into s values (7)"\n'
        '${CLICKHOUSE_CURL} -sS "${CLICKHOUSE_URL}" --data "select n from s"\n',
        "7\n",
    ),
    "00006_txn_local.sh": ('$CLICKHOUSE_LOCAL -q "select 1"\n', "1\n"),
    "00007_txn_client_option.sh": ('$CLICKHOUSE_CLIENT --send_logs_level=trace -q "select 1"\n', "1\n"),
    "00008_other.sql": ("select 1;\n", "1\n"),
}


def test_each_test_is_judged_passed_failed_or_not_runnable_with_its_reason(clickhouse_url: str, tmp_path: Path) -> None:
    tests_dir = tmp_path / "tests" / "queries" / "0_stateless"
    tests_dir.mkdir(parents=True)
    for name, (text, reference) in TESTS.items():
        (tests_dir / name).write_text(text)
        (tests_dir / name).with_suffix(".reference").write_text(reference)
    out = tmp_path / "results.json"

    argv = [str(tmp_path), "--url", clickhouse_url, "--pattern", "txn", "--json", str(out), *credentials.cli_args()]
    code = clickhouse_stateless.main(argv)

    results = {r["name"]: r for r in json.loads(out.read_text())}
    assert {n: r["status"] for n, r in results.items()} == {
        "00001_txn_rollback": "passed",
        "00002_txn_wrong_reference": "failed",
        "00003_txn_unexpected_error": "failed",
        "00004_txn_cluster": "not runnable",
        "00005_txn_shell": "passed",
        "00006_txn_local": "not runnable",
        "00007_txn_client_option": "not runnable",
    }
    assert "FUNCTION_THROW_IF_VALUE_IS_NON_ZERO" in results["00003_txn_unexpected_error"]["reason"]
    assert "needs cluster()" in results["00004_txn_cluster"]["reason"]
    assert "output before it matches the reference: True" in results["00004_txn_cluster"]["reason"]
    assert "clickhouse-local" in results["00006_txn_local"]["reason"]
    assert "--send_logs_level=trace" in results["00007_txn_client_option"]["reason"]
    assert code == 1
