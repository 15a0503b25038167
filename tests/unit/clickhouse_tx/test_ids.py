"""Xids: unique per attempt, safe in session ids and quoted names, parseable."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.ids import (
    MAX_TXN_PART,
    StoredQueryId,
    canonical_location,
    choose_stream_txn_id,
    new_xid,
    parse_xid,
    sanitize_txn,
    txn_id_for_spark_query,
)

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


# ------------------------------------------------------------------ one spelling per checkpoint


@pytest.mark.parametrize(
    "raw",
    [
        "/chk/x",
        "/chk/x/",
        "//chk//x",
        "../chk/x",
        "./../chk/x/",
        "../w/../chk/x",
        "file:/chk/x",
        "file:///chk/x",
        "file:///chk/x/",
        "file://localhost/chk/x",
        "FILE:/chk/./x",
    ],
)
def test_every_spelling_of_a_local_checkpoint_is_one_absolute_path(raw: str) -> None:
    assert canonical_location(raw, "/w") == "/chk/x"  # relative ones from /w


@pytest.mark.parametrize(
    "raw,expected",
    [
        ("s3a://bucket/chk/x/", "s3://bucket/chk/x"),
        ("S3://bucket//chk/x", "s3://bucket/chk/x"),
        ("hdfs://nn:8020/chk/x/", "hdfs://nn:8020/chk/x"),
        ("gs://b/c", "gs://b/c"),
    ],
)
def test_a_remote_checkpoint_keeps_scheme_and_authority_with_one_path_spelling(raw: str, expected: str) -> None:
    assert canonical_location(raw, "/anywhere") == expected


@pytest.mark.parametrize("raw", ["", "  ", "file:chk/x", "file://otherhost/chk/x"])
def test_an_empty_relative_or_remote_file_uri_is_refused(raw: str) -> None:
    with pytest.raises(ConfigurationError, match="checkpointLocation"):
        canonical_location(raw, "/w")


# ------------------------------------------------------------------ choosing the streaming id

QID = "428ab10a-d7f3-4ae3-8ebe-651c8978a8c3"


def choose(**kw):
    args = dict(explicit=None, stored=None, spark_query_id=QID, where="/chk/x")
    return choose_stream_txn_id(**{**args, **kw})


def test_a_new_query_takes_its_id_from_sparks_query_id_and_stores_it() -> None:
    c = choose()
    assert c.txn_id == "q_428ab10ad7f34ae38ebe651c8978a8c3" == txn_id_for_spark_query(QID)
    assert c.store and SAFE.match(c.txn_id) and sanitize_txn(c.txn_id) == c.txn_id


def test_a_stored_id_wins_and_is_not_stored_again() -> None:
    stored = StoredQueryId("stored_id", QID)
    c = choose(stored=stored)
    assert (c.txn_id, c.store) == ("stored_id", False)
    assert choose(stored=stored, explicit="stored_id").txn_id == "stored_id"


def test_an_explicit_id_that_differs_from_the_stored_one_is_refused_naming_both() -> None:
    with pytest.raises(ConfigurationError) as e:
        choose(stored=StoredQueryId("stored_id", QID), explicit="other")
    assert "'other'" in str(e.value) and "'stored_id'" in str(e.value) and "/chk/x" in str(e.value)


def test_a_recreated_spark_metadata_under_a_kept_record_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="Spark's metadata was recreated"):
        choose(stored=StoredQueryId("stored_id", "00000000-0000-0000-0000-000000000000"))


def test_a_first_explicit_id_is_stored() -> None:
    c = choose(explicit="mine")
    assert (c.txn_id, c.store) == ("mine", True)


def test_a_spark_query_id_that_is_not_a_uuid_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="not a UUID"):
        txn_id_for_spark_query("../../etc")
