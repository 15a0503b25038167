"""Operators' commands on a database shared by two real Spark jobs, after a driver SIGKILL.

Job A (a Spark batch write of 3,000 rows in 3 partitions) is SIGKILLed by its fault
plan right after the first of its three COMMITs: its decision is durable, one
partition is visible, two are COMMITTING. Job B, another Spark job, writes into the
same database, so both share one registry. ``recover`` given B's decision log must
leave A's decided xids alone; ``recover`` given A's own log then finishes A.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.interfaces import Target
from spark_datasource.testing.credentials import cli_args, target_fields

ROOT = Path(__file__).resolve().parents[2]

_JOB = r"""
import json, os, sys
os.environ["CLICKHOUSE_TX_KILL_PGID"] = str(os.getpgrp())  # a fault kills driver, JVM and workers
from pyspark.sql import SparkSession
import spark_datasource
from spark_datasource.testing.credentials import writer_options

a = json.loads(sys.argv[1])
spark = (SparkSession.builder.master("local[2]")
         .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
spark_datasource.register(spark)
w = (spark.range(0, a["rows"], 1, 3).write.format("clickhouse_tx").option("url", a["url"])
     .options(**writer_options()).option("database", a["database"]).option("table", a["table"])
     .option("transactional_id", a["txn"]).option("decision_log", a["log"]))
for k, v in a.get("fault", {}).items():
    w = w.option(k, v)
w.mode("append").save()
spark.stop()
"""


def _job(**args: object) -> int:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _JOB, json.dumps(args)],
        cwd=ROOT,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        try:  # whatever of the job's session outlived it (a JVM, a worker)
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert proc.returncode in (0, -signal.SIGKILL), err.decode()[-3000:]
    return proc.returncode


def _cli(*args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-m", "clickhouse_tx", *args, *cli_args(), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_recover_given_another_jobs_decision_log_leaves_a_killed_jobs_decided_xids_for_its_own_recovery(
    clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    admin = ClickHouseHTTP(Target(url=clickhouse_url, database=database, table="a", **target_fields()))
    for table in ("a", "b"):
        admin.command(f"CREATE TABLE {q.qualified(database, table)} (id Int64) ENGINE = MergeTree ORDER BY id")
    common = {"url": clickhouse_url, "database": database}
    fault = {"fault.step": "after_commit:1", "fault.action": "kill", "fault.once_file": str(tmp_path / "once")}
    cli = ["--url", clickhouse_url, "--table", f"{database}.a", "--mode", "transaction"]

    def count(table: str) -> int:
        return int(
            admin.command(
                f"SELECT count() FROM {q.qualified(database, table)} SETTINGS implicit_transaction = 1"
            ).strip()
        )

    try:
        assert (
            _job(**common, table="a", rows=3000, txn="job-a", log=str(tmp_path / "a"), fault=fault) == -signal.SIGKILL
        )
        assert _job(**common, table="b", rows=10, txn="job-b", log=str(tmp_path / "b")) == 0
        assert (count("a"), count("b")) == (1000, 10)
        wrong = _cli("recover", *cli, "--checkpoint", str(tmp_path / "b"))
        assert wrong["rolled_back"] == [] and wrong["committed"] == []
        assert _cli("gc", *cli, "--checkpoint", str(tmp_path / "b"), "--older-than", "0")["rolled_back"] == []
        assert count("a") == 1000
        own = _cli("recover", *cli, "--checkpoint", str(tmp_path / "a"))
        # One found committed (its registry move was still pending), two rolled forward.
        assert len(own["committed"]) == 3 and own["rolled_back"] == []
        assert (count("a"), count("b")) == (3000, 10)
    finally:  # open transactions would block the DROP DATABASE of the fixture
        subprocess.run(
            [sys.executable, "-m", "clickhouse_tx", "recover", *cli, "--checkpoint", str(tmp_path / "a")],
            capture_output=True,
            timeout=120,
            cwd=ROOT,
        )
