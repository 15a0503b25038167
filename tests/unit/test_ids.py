"""Xids: unique per attempt, safe in session ids and quoted names, parseable."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, strategies as st

from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.ids import MAX_TXN_PART, default_txn_id, new_xid, parse_xid, sanitize_txn

SAFE = re.compile(r"^[A-Za-z0-9_-]+$")


def test_an_xid_is_readable_and_parses_back_to_its_batch_partition_and_attempt() -> None:
    xid = new_xid("events_q", 12, 3, 1)
    assert xid.startswith("events_q-b12-p3-a1-")
    parts = parse_xid(xid)
    assert (parts.txn, parts.batch, parts.partition, parts.attempt) == ("events_q", 12, 3, 1)


def test_two_xids_of_the_same_attempt_differ() -> None:
    assert len({new_xid("q", 0, 0, 0) for _ in range(200)}) == 200


@given(st.text(min_size=1, max_size=300), st.integers(0, 2**40), st.integers(0, 10**5), st.integers(0, 100))
def test_any_txn_id_gives_a_safe_parseable_xid(txn: str, batch: int, part: int, attempt: int) -> None:
    xid = new_xid(txn, batch, part, attempt)
    assert SAFE.match(xid)
    assert len(sanitize_txn(txn)) <= MAX_TXN_PART
    p = parse_xid(xid)
    assert (p.batch, p.partition, p.attempt) == (batch, part, attempt)


def test_txn_ids_that_sanitise_alike_keep_different_prefixes() -> None:
    assert sanitize_txn("a.b") != sanitize_txn("a/b")
    assert sanitize_txn("x" * 100) != sanitize_txn("x" * 101)
    assert sanitize_txn("plain_name") == "plain_name"


def test_negative_numbers_and_foreign_strings_are_refused() -> None:
    with pytest.raises(ValueError, match="batch"):
        new_xid("q", -1, 0, 0)
    with pytest.raises(ValueError, match="not a clickhouse_tx xid"):
        parse_xid("q-b1-p2")


def test_default_txn_id_is_the_query_name_with_a_hash_of_the_checkpoint() -> None:
    named = default_txn_id("events", "/chk/a")
    assert named.startswith("events-") and named != default_txn_id("events", "/chk/b")
    a = default_txn_id(None, "/chk/a")
    assert a.startswith("chk-") and a != default_txn_id(None, "/chk/b")
    assert default_txn_id("bad name/1", "/chk/a").startswith("bad_name_1-")
    with pytest.raises(ConfigurationError, match="checkpointLocation"):
        default_txn_id("events", None)
