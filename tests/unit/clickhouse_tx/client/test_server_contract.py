"""The server contract's settings of each kind of INSERT (pure; :mod:`clickhouse_tx.client.contract`).

The same settings on the wire: ``tests/unit/clickhouse_tx/client/test_transport_body.py`` (a recording
server) and ``tests/spark/spark_datasource/sink/test_server_contract.py`` (every INSERT of the writer).
"""

from __future__ import annotations

import pytest

from clickhouse_tx.client.contract import PINNED, InsertKind, ServerTraits, insert_settings, refuse_pinned
from clickhouse_tx.client.sql import is_insert
from clickhouse_tx.errors import ConfigurationError

NEW = ServerTraits.from_names(["deduplicate_insert", "deduplicate_insert_select"])
OLD = ServerTraits.from_names([])


def test_every_insert_of_either_kind_is_synchronous_on_any_server() -> None:
    for kind in InsertKind:
        for traits in (NEW, OLD):
            assert insert_settings(kind, traits, token="t", in_session=False)["async_insert"] == "0"


def test_an_insert_that_must_keep_every_block_turns_off_every_deduplication_the_server_has() -> None:
    s = insert_settings(InsertKind.KEEP, NEW, token=None, in_session=False)
    assert (s["insert_deduplicate"], s["deduplicate_insert"], s["deduplicate_insert_select"]) == ("0",) + (
        "disable",
    ) * 2
    assert s["deduplicate_blocks_in_dependent_materialized_views"] == "0"
    old = insert_settings(InsertKind.KEEP, OLD, token=None, in_session=False)
    assert old["insert_deduplicate"] == "0" and "deduplicate_insert" not in old


def test_an_insert_that_must_keep_every_block_gets_a_token_of_its_own_unless_it_names_one() -> None:
    a, b = (insert_settings(InsertKind.KEEP, NEW, token=None, in_session=False) for _ in range(2))
    assert a["insert_deduplication_token"] != b["insert_deduplication_token"]
    assert insert_settings(InsertKind.KEEP, NEW, token="x1", in_session=True)["insert_deduplication_token"] == "x1"


def test_a_deduplicated_insert_turns_on_deduplication_by_every_setting_the_server_has() -> None:
    s = insert_settings(InsertKind.DEDUPLICATE, NEW, token="c1", in_session=False)
    assert (s["insert_deduplicate"], s["deduplicate_insert"], s["insert_deduplication_token"]) == ("1", "enable", "c1")
    assert s["deduplicate_blocks_in_dependent_materialized_views"] == "1"
    assert "deduplicate_insert" not in insert_settings(InsertKind.DEDUPLICATE, OLD, token="c1", in_session=False)


def test_a_deduplicated_insert_without_a_token_is_a_bug_caught_before_sending() -> None:
    with pytest.raises(ValueError, match="needs its insert_deduplication_token"):
        insert_settings(InsertKind.DEDUPLICATE, NEW, token=None, in_session=False)


def test_an_insert_in_a_session_fails_rather_than_run_outside_the_transaction() -> None:
    s = insert_settings(InsertKind.KEEP, NEW, token="x", in_session=True)
    assert s["throw_on_unsupported_query_inside_transaction"] == "1"
    assert "throw_on_unsupported_query_inside_transaction" not in insert_settings(
        InsertKind.KEEP, NEW, token="x", in_session=False
    )


def test_every_setting_the_contract_sends_is_one_a_user_may_not_give() -> None:
    sent = set()
    for kind in InsertKind:
        for session in (True, False):
            sent |= set(insert_settings(kind, NEW, token="t", in_session=session))
    assert sent <= PINNED


def test_a_user_setting_the_contract_pins_is_refused_naming_it_and_any_other_passes() -> None:
    refuse_pinned({"max_insert_block_size": "5"}, "option setting.{name}")
    with pytest.raises(ConfigurationError, match=r"option setting.async_insert: the setting async_insert is set by"):
        refuse_pinned({"async_insert": "1"}, "option setting.{name}")


@pytest.mark.parametrize(
    ("sql", "insert"),
    [
        ("INSERT INTO t VALUES (1)", True),
        ("  insert into t select 1", True),
        ("-- why\n/* a */ INSERT INTO t FORMAT Native", True),
        ("SELECT 'INSERT'", False),
        ("ALTER TABLE t MOVE PARTITION ID 'a' TO TABLE u", False),
    ],
)
def test_an_insert_is_known_by_its_first_word_after_comments(sql: str, insert: bool) -> None:
    assert is_insert(sql) is insert
