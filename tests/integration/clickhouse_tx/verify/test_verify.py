"""The exactly-once verifier on the real (embedded) ClickHouse: planted anomalies are caught."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import requests

from clickhouse_tx.verify.offsets import Segment, check_segments, parse_expected, runs
from clickhouse_tx.verify.verifier import verify
from spark_datasource.testing.credentials import cli_args, http_auth, target_fields
from tests.conftest import quote_ident

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())


def _sql(url: str, sql: str, **params: str) -> str:
    r = requests.post(url, params=params, data=sql.encode(), timeout=60, auth=http_auth())
    assert r.status_code == 200, r.text
    return r.text


def _table(url: str, db: str, name: str = "events", extra: str = "") -> str:
    _sql(
        url,
        f"CREATE TABLE {quote_ident(db)}.{quote_ident(name)} (topic String, partition Int32, "
        f"offset Int64, seg UInt32{extra}) ENGINE = MergeTree ORDER BY (topic, partition, offset)",
    )
    return f"{db}.{name}"


def _insert(url: str, table: str, rows: list[tuple[str, int, int, int]]) -> None:
    db, t = table.split(".", 1)
    values = ",".join(f"('{tp}',{p},{o},{s})" for tp, p, o, s in rows)
    _sql(url, f"INSERT INTO {quote_ident(db)}.{quote_ident(t)} (topic, partition, offset, seg) VALUES {values}")


def _clean_rows() -> list[tuple[str, int, int, int]]:
    # two partitions, offsets 0..99, inserted in segments of 25
    return [("ev", p, o, o // 25) for p in (0, 1) for o in range(100)]


EXPECTED = {("ev", 0): (0, 100), ("ev", 1): (0, 100)}


def test_a_clean_table_passes_every_check(clickhouse_url: str, database: str) -> None:
    t = _table(clickhouse_url, database)
    _insert(clickhouse_url, t, _clean_rows())
    r = verify(clickhouse_url, t, expected=EXPECTED, segment_col="seg", **target_fields())
    assert r.clean, r.summary()
    assert (r.rows, r.distinct, len(r.partitions)) == (200, 200, 2)
    assert "segments by seg" in r.checks and "expected offsets" in r.checks


def test_planted_duplicates_are_counted_and_reported_as_ranges(clickhouse_url: str, database: str) -> None:
    t = _table(clickhouse_url, database)
    _insert(clickhouse_url, t, _clean_rows() + [("ev", 1, o, 9) for o in range(40, 45)] + [("ev", 0, 7, 9)])
    r = verify(clickhouse_url, t, expected=EXPECTED, **target_fields())
    assert not r.clean
    assert r.duplicates == 6 and r.missing == 0
    dups = sorted((a.partition, a.first, a.last, a.count) for a in r.anomalies if a.kind == "duplicate")
    assert dups == [(0, 7, 7, 1), (1, 40, 44, 5)]


def test_planted_gaps_inside_at_the_head_and_at_the_tail_are_found(clickhouse_url: str, database: str) -> None:
    t = _table(clickhouse_url, database)
    keep = [
        r for r in _clean_rows() if not (r[1] == 0 and 10 <= r[2] < 20) and not (r[1] == 1 and (r[2] < 3 or r[2] > 97))
    ]
    _insert(clickhouse_url, t, keep)
    r = verify(clickhouse_url, t, expected=EXPECTED, **target_fields())
    gaps = sorted((a.partition, a.first, a.last) for a in r.anomalies if a.kind == "gap")
    assert gaps == [(0, 10, 19), (1, 0, 2), (1, 98, 99)]
    assert r.missing == 10 + 3 + 2 and r.duplicates == 0


def test_a_partition_with_no_rows_is_a_gap_and_an_unknown_one_is_unexpected(clickhouse_url: str, database: str) -> None:
    t = _table(clickhouse_url, database)
    _insert(clickhouse_url, t, [r for r in _clean_rows() if r[1] == 0] + [("other", 3, 0, 0)])
    r = verify(clickhouse_url, t, expected=EXPECTED, **target_fields())
    kinds = sorted((a.kind, a.topic, a.partition, a.count) for a in r.anomalies)
    assert kinds == [("gap", "ev", 1, 100), ("unexpected", "other", 3, 1)]


def test_an_insert_overlapping_the_previous_one_is_an_overlap(clickhouse_url: str, database: str) -> None:
    t = _table(clickhouse_url, database)
    rows = _clean_rows() + [("ev", 0, o, 4) for o in range(90, 100)]  # a 5th insert replays 90..99
    _insert(clickhouse_url, t, rows)
    r = verify(clickhouse_url, t, expected=EXPECTED, segment_col="seg", **target_fields())
    overlaps = [(a.partition, a.first, a.last) for a in r.anomalies if a.kind == "overlap"]
    assert overlaps == [(0, 90, 99)]
    assert r.duplicates == 10


def test_an_insert_wholly_before_the_previous_one_is_backward(clickhouse_url: str, database: str) -> None:
    t = _table(clickhouse_url, database)
    # partition 0: segment 0 holds 50..99, segment 1 holds 0..49 (committed in the wrong order)
    rows = [("ev", 0, o, 0 if o >= 50 else 1) for o in range(100)]
    _insert(clickhouse_url, t, rows)
    r = verify(clickhouse_url, t, segment_col="seg", **target_fields())
    assert [(a.kind, a.first, a.last) for a in r.anomalies] == [("backward", 0, 49)]


def test_uncommitted_rows_of_an_open_transaction_are_not_counted(clickhouse_url: str, database: str) -> None:
    t = _table(clickhouse_url, database)
    _insert(clickhouse_url, t, _clean_rows())
    sid = f"verify-open-{database}"
    db, name = t.split(".", 1)
    _sql(clickhouse_url, "BEGIN TRANSACTION", session_id=sid)
    try:
        _sql(
            clickhouse_url,
            f"INSERT INTO {quote_ident(db)}.{quote_ident(name)} (topic, partition, offset, seg) "
            "VALUES ('ev', 0, 5, 9), ('ev', 0, 100, 9)",
            session_id=sid,
            async_insert="0",  # a server refuses a queued INSERT inside a transaction
        )
        assert verify(clickhouse_url, t, expected=EXPECTED, **target_fields()).clean
    finally:
        _sql(clickhouse_url, "ROLLBACK", session_id=sid)


def test_markers_disagreeing_with_the_table_and_double_commits_are_reported(clickhouse_url: str, database: str) -> None:
    t = _table(clickhouse_url, database)
    _insert(clickhouse_url, t, _clean_rows())
    _sql(
        clickhouse_url,
        f"CREATE TABLE {quote_ident(database)}.clickhouse_tx_commits (txn_id String, "
        "batch Int64, partition Int32, xid String, `table` String, rows UInt64, "
        "checksum UInt64) ENGINE = MergeTree ORDER BY (txn_id, batch, partition)",
    )
    _sql(
        clickhouse_url,
        f"INSERT INTO {quote_ident(database)}.clickhouse_tx_commits VALUES "
        f"('q', 0, 0, 'x0', '{t}', 100, 0), ('q', 0, 1, 'x1', '{t}', 100, 0)",
    )
    assert verify(clickhouse_url, t, expected=EXPECTED, txn_id="q", **target_fields()).clean
    _sql(
        clickhouse_url,
        f"INSERT INTO {quote_ident(database)}.clickhouse_tx_commits VALUES ('q', 0, 1, 'x1-retry', '{t}', 100, 0)",
    )
    r = verify(clickhouse_url, t, expected=EXPECTED, txn_id="q", **target_fields())
    assert sorted(a.kind for a in r.anomalies) == ["double_commit", "marker_count_mismatch"]
    assert r.markers == {"markers": 3, "rows": 300, "txn_ids": 1, "published_jobs": 0, "published_job_rows": 0}


def test_a_missing_column_is_named_in_the_error(clickhouse_url: str, database: str) -> None:
    from clickhouse_tx.errors import ConfigurationError

    t = _table(clickhouse_url, database)
    with pytest.raises(ConfigurationError, match="offset column 'off'"):
        verify(clickhouse_url, t, offset_col="off", **target_fields())


def test_the_cli_exits_0_when_clean_1_on_anomalies_and_2_on_errors(
    clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    t = _table(clickhouse_url, database)
    _insert(clickhouse_url, t, _clean_rows())
    exp = json.dumps({"ev": {"0": 100, "1": 100}})

    def run(*extra: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "clickhouse_tx", "verify", "--url", clickhouse_url, *extra, *cli_args()],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    clean = run("--table", t, "--expected", exp, "--json", str(tmp_path / "r.json"))
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert json.loads((tmp_path / "r.json").read_text())["clean"] is True
    _insert(clickhouse_url, t, [("ev", 0, 3, 0)])
    dirty = run("--table", t, "--expected", exp, "--json", "-")
    assert dirty.returncode == 1
    assert json.loads(dirty.stdout)["duplicates"] == 1
    missing = run("--table", f"{database}.nope")
    assert missing.returncode == 2 and "does not exist" in missing.stderr


def test_pure_helpers_group_runs_and_classify_segments() -> None:
    assert runs([1, 2, 3, 7, 9, 10]) == [(1, 3), (7, 7), (9, 10)]
    segs = [
        Segment("a", 0, 9, 10),
        Segment("b", 10, 19, 10),
        Segment("c", 25, 30, 6),
        Segment("d", 28, 40, 13),
        Segment("e", 0, 5, 6),
    ]
    assert [(a.kind, a.first, a.last) for a in check_segments("t", 0, segs)] == [
        ("gap", 20, 24),
        ("overlap", 28, 30),
        ("backward", 0, 5),
    ]
    assert parse_expected('{"t": {"0": 5, "1": [2, 9]}}') == {("t", 0): (0, 5), ("t", 1): (2, 9)}
