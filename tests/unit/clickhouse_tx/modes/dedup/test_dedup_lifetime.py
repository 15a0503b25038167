"""Which layout records ``gc`` drops (``dedup_lifetime.expired_keys``), and how retentions read."""

from __future__ import annotations

import pytest

from clickhouse_tx.admin.bookkeeping import parse_duration
from clickhouse_tx.modes.dedup.lifetime import LayoutRow, count_kinds, expired_keys
from clickhouse_tx.modes.dedup.records import FIRST_RUN_PARTITION, SEAL_PARTITION

SEAL = {0: {"first": "3:a", "rows": 3, "checksum": 1, "chunks": 1}, 1: {"first": "", "rows": 0, "checksum": 0}}


def batch(txn: str, b: int, ms: int, *, sealed: bool = True) -> list[LayoutRow]:
    """A batch's records as a run of 2 partitions leaves them, all written at ``ms``."""
    out = [
        LayoutRow(f"{txn}/{b}/0", txn, b, 0, 0, ms),
        LayoutRow(f"{txn}/{b}/0/1", txn, b, 0, 1, ms),
        LayoutRow(f"{txn}/{b}/first_run", txn, b, FIRST_RUN_PARTITION, 0, ms),
    ]
    return out + ([LayoutRow(f"{txn}/{b}/all", txn, b, SEAL_PARTITION, 0, ms, SEAL)] if sealed else [])


def test_a_sealed_batch_whose_every_partition_holds_a_marker_expires_once_old_enough() -> None:
    rows = batch("q", 3, 1000)
    assert expired_keys(rows, {("q", 3): {0, 1}}, cut_ms=1000) == {("q", 3): sorted(r.key for r in rows)}
    assert expired_keys(rows, {("q", 3): {0, 1}}, cut_ms=999) == {}


def test_a_sealed_batch_with_a_partition_not_committed_is_kept_for_its_replay() -> None:
    assert expired_keys(batch("q", 3, 1000), {("q", 3): {0}}, cut_ms=5000) == {}


def test_an_unsealed_batch_without_markers_is_kept_however_old() -> None:
    assert expired_keys(batch("q", 3, 1000, sealed=False), {}, cut_ms=10**12) == {}


def test_an_unsealed_batch_with_markers_is_what_a_failed_drop_left_and_expires() -> None:
    rows = batch("q", 3, 1000, sealed=False)
    assert list(expired_keys(rows, {("q", 3): {1}}, cut_ms=1000)) == [("q", 3)]


def test_one_recent_record_keeps_its_whole_batch() -> None:
    rows = [*batch("q", 3, 1000), LayoutRow("q/3/1", "q", 3, 1, 0, 9000)]
    assert expired_keys(rows, {("q", 3): {0, 1}}, cut_ms=5000) == {}


def test_batches_are_judged_one_by_one() -> None:
    rows = batch("q", 3, 1000) + batch("job", 0, 1000) + batch("live", 9, 1000, sealed=False)
    marked = {("q", 3): {0, 1}, ("job", 0): {0}}
    assert list(expired_keys(rows, marked, cut_ms=2000)) == [("q", 3)]


def test_count_kinds_names_every_kind() -> None:
    assert count_kinds(batch("q", 0, 1)) == {
        "claims": 1, "chunk_records": 1, "seals": 1, "first_run": 1, "foreach_batch": 0,
    }  # fmt: skip
    assert count_kinds([]) == {"claims": 0, "chunk_records": 0, "seals": 0, "first_run": 0, "foreach_batch": 0}


@pytest.mark.parametrize(
    ("text", "seconds"), [("3d", 259200.0), ("12h", 43200.0), ("90m", 5400.0), ("600", 600.0), ("0s", 0.0)]
)
def test_a_retention_reads_as_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_a_negative_retention_is_refused() -> None:
    with pytest.raises(ValueError):
        parse_duration("-1d")
