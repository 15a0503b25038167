"""WriterOptions.parse: every option, every error path, the password kept out of sight."""

from __future__ import annotations

import json
import pickle
import uuid
from pathlib import Path

import pytest

from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.ids import sanitize_txn
from clickhouse_tx.interfaces import Mode, Target
from spark_datasource.options.writer_options import WriterOptions
from spark_datasource.options.writer_specs import MIN_SESSION_TIMEOUT_S, WRITER_OPTIONS

SECRET = "s3cr3t-Pa55"
BASE = {"url": "http://127.0.0.1:8123", "table": "db.events"}


def parse(streaming: bool = False, **extra: str) -> WriterOptions:
    return WriterOptions.parse({**BASE, **extra}, streaming=streaming)


def error_of(options: dict, streaming: bool = False) -> str:
    with pytest.raises(ConfigurationError) as e:
        WriterOptions.parse(options, streaming=streaming)
    return str(e.value)


def test_defaults_for_a_batch_write_with_only_url_and_table():
    o = parse()
    assert (o.url, o.database, o.table, o.user, o.password) == ("http://127.0.0.1:8123", "db", "events", "default", "")
    assert o.mode is Mode.TRANSACTION
    assert (o.batch_size, o.batch_bytes, o.session_timeout_s) == (65536, 64 * 1024 * 1024, 3600)
    assert (o.connect_timeout_s, o.request_timeout_s) == (10.0, 300.0)
    assert (o.create_table, o.order_by, o.partition_by, o.engine) == (False, None, None, "MergeTree")
    assert (o.table_column, o.allow_nullable_into_non_nullable) == (None, False)
    assert (o.retry_attempts, o.retry_max_seconds) == (5, 60.0)
    assert o.settings == {} and o.faults == {} and o.streaming is False


def test_every_option_is_read_and_keys_are_case_insensitive():
    o = WriterOptions.parse(
        {
            "URL": "HTTPS://ch.example:8443/",
            "User": "alice",
            "Password": SECRET,
            "Database": "analytics",
            "Table": "events.v2",
            "MODE": "Staging",
            "transactional_id": "job-1.a_b",
            "decision_log": "s3://bucket/log",
            "batch_size": "1000",
            "batch_bytes": "2048",
            "connect_timeout": "1.5",
            "request_timeout": "30",
            "session_timeout": "120",
            "create_table": "yes",
            "order_by": "(id, ts)",
            "partition_by": "toYYYYMM(ts)",
            "engine": "ReplacingMergeTree(ver)",
            "table_column": "dest",
            "allow_nullable_into_non_nullable": "1",
            "retry.attempts": "9",
            "retry.max_seconds": "2.5",
            "setting.max_insert_block_size": "100",
            "fault.kill_after_rows": "10",
        },
        streaming=False,
    )
    assert o.url == "https://ch.example:8443"
    assert (o.user, o.password, o.database, o.table) == ("alice", SECRET, "analytics", "events.v2")
    assert o.mode is Mode.STAGING and o.transactional_id == "job-1.a_b" and o.resumable_batch_job
    assert o.decision_log == "s3://bucket/log"
    assert (o.batch_size, o.batch_bytes, o.connect_timeout_s, o.request_timeout_s, o.session_timeout_s) == (
        1000,
        2048,
        1.5,
        30.0,
        120,
    )
    assert (o.create_table, o.order_by, o.partition_by, o.engine) == (
        True,
        "(id, ts)",
        "toYYYYMM(ts)",
        "ReplacingMergeTree(ver)",
    )
    assert o.table_column == "dest" and o.allow_nullable_into_non_nullable is True
    assert (o.retry_attempts, o.retry_max_seconds) == (9, 2.5)
    assert o.settings == {"max_insert_block_size": "100"}
    assert o.faults == {"fault.kill_after_rows": "10"}


def test_target_carries_connection_settings_and_the_password():
    o = parse(password=SECRET, **{"setting.max_insert_block_size": "1000", "session_timeout": "60"})
    t = o.target()
    assert isinstance(t, Target)
    assert (t.url, t.database, t.table, t.password, t.session_timeout_s) == (
        "http://127.0.0.1:8123",
        "db",
        "events",
        SECRET,
        60,
    )
    assert dict(t.settings) == {"max_insert_block_size": "1000"}
    assert SECRET not in repr(t)


@pytest.mark.parametrize(
    "table,database,expected",
    [
        ("events", None, ("default", "events")),
        ("db.events", None, ("db", "events")),
        ("db.events.v2", None, ("db", "events.v2")),
        ("db.events", "other", ("other", "db.events")),
    ],
)
def test_database_comes_from_the_option_or_a_qualified_table(table, database, expected):
    opts = {"url": BASE["url"], "table": table}
    if database:
        opts["database"] = database
    o = WriterOptions.parse(opts, streaming=False)
    assert (o.database, o.table) == expected
    assert o.qualified_table == f"{expected[0]}.{expected[1]}"


def test_save_path_is_the_table_when_no_table_option_is_given():
    o = WriterOptions.parse({"url": BASE["url"], "path": "db.t"}, streaming=False)
    assert (o.database, o.table) == ("db", "t")


def test_a_path_that_disagrees_with_table_is_refused():
    assert "disagree" in error_of({**BASE, "path": "/some/path"})


@pytest.mark.parametrize("mode", ["transaction", "staging", "dedup", "none", "DEDUP"])
def test_every_mode_parses(mode):
    assert parse(mode=mode).mode is Mode(mode.lower())


QID = "428ab10a-d7f3-4ae3-8ebe-651c8978a8c3"


def spark_checkpoint(path: Path, query_id: str = QID) -> Path:
    """A checkpoint as Spark leaves it when the query is created: ``metadata`` only."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "metadata").write_text(json.dumps({"id": query_id}) + "\n")
    return path


def resolved(**extra: str) -> WriterOptions:
    return parse(streaming=True, **extra).with_query_identity()


def test_a_streaming_id_comes_from_sparks_query_id_whatever_the_spelling_or_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chk = spark_checkpoint(tmp_path / "chk")
    first = resolved(checkpointLocation=str(chk))
    assert first.transactional_id == "q_" + QID.replace("-", "")
    assert first.decision_log == str(chk)
    monkeypatch.chdir(tmp_path)
    for spelling in (f"{chk}/", "chk", "./chk/", f"file://{chk}", f"file:{chk}"):
        again = resolved(checkpointLocation=spelling)
        assert (again.transactional_id, again.decision_log) == (first.transactional_id, str(chk)), spelling
        assert again.checkpoint_location == spelling  # the option itself is kept as given
    assert resolved(checkpointLocation="chk", queryName="now named").transactional_id == first.transactional_id
    assert json.loads((chk / "clickhouse_tx" / "query.json").read_text()) == {
        "spark_query_id": QID,
        "transactional_id": first.transactional_id,
    }


def test_a_streaming_id_differs_per_checkpoint(tmp_path: Path) -> None:
    a = resolved(checkpointLocation=str(spark_checkpoint(tmp_path / "a")))
    b = resolved(checkpointLocation=str(spark_checkpoint(tmp_path / "b", str(uuid.uuid4()))))
    assert a.transactional_id != b.transactional_id


def test_an_explicit_id_different_from_the_stored_one_is_refused(tmp_path: Path) -> None:
    chk = str(spark_checkpoint(tmp_path / "chk"))
    stored = resolved(checkpointLocation=chk).transactional_id
    assert resolved(checkpointLocation=chk, transactional_id=stored).transactional_id == stored
    with pytest.raises(ConfigurationError) as e:
        resolved(checkpointLocation=chk, transactional_id="other")
    assert "transactional_id='other'" in str(e.value) and repr(stored) in str(e.value)


def test_a_first_explicit_id_is_stored_and_then_kept_without_the_option(tmp_path: Path) -> None:
    chk = str(spark_checkpoint(tmp_path / "chk"))
    assert resolved(checkpointLocation=chk, transactional_id="events.v1").transactional_id == "events.v1"
    assert resolved(checkpointLocation=chk).transactional_id == "events.v1"


def test_a_checkpoint_without_sparks_metadata_is_refused_with_what_to_do(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as e:
        resolved(checkpointLocation=str(tmp_path / "nothing"))
    assert "metadata" in str(e.value) and "absolute URI" in str(e.value)


def test_an_unresolved_streaming_id_is_never_used_silently() -> None:
    o = parse(streaming=True, checkpointLocation="/chk")
    assert o.transactional_id == ""
    with pytest.raises(RuntimeError, match="with_query_identity"):
        o.txn_id()


def test_a_streaming_write_without_checkpoint_location_is_refused_with_the_reason():
    msg = error_of({**BASE, "queryName": "q"}, streaming=True)
    assert "checkpointLocation" in msg and "spark.sql.streaming.checkpointLocation" in msg


def test_a_streaming_write_may_name_its_own_id_and_decision_log_instead():
    o = parse(streaming=True, transactional_id="t1", decision_log="/logs/t1")
    assert (o.transactional_id, o.decision_log) == ("t1", "/logs/t1")


def test_a_streaming_write_with_only_an_id_still_needs_a_decision_log():
    assert "decision_log" in error_of({**BASE, "transactional_id": "t1"}, streaming=True)


def test_each_batch_job_gets_a_fresh_id_and_a_temp_decision_log():
    a, b = parse(), parse()
    assert a.transactional_id != b.transactional_id
    assert a.transactional_id.startswith("batch-")
    assert a.decision_log == b.decision_log  # one temp root; each job's log is clickhouse_tx/<id> below it
    assert a.with_query_identity() is a


def test_batch_jobs_with_the_same_transactional_id_are_still_keyed_apart():
    a, b = parse(transactional_id="nightly"), parse(transactional_id="nightly")
    assert a.transactional_id != b.transactional_id
    assert a.transactional_id.startswith("nightly.job-") and b.transactional_id.startswith("nightly.job-")
    assert sanitize_txn(a.txn_id()) != sanitize_txn(b.txn_id())  # xids and registry entries apart


def test_a_batch_job_with_its_own_id_and_decision_log_is_resumable_and_refused_once_done(tmp_path: Path) -> None:
    from clickhouse_tx.interfaces import Decision, Prepared
    from clickhouse_tx.store.decision_log import FileDecisionLog

    o = parse(transactional_id="nightly", decision_log=str(tmp_path))
    assert o.transactional_id == "nightly" and o.resumable_batch_job
    o.check_batch_job_not_done()  # nothing decided yet: the job runs
    log = FileDecisionLog(str(tmp_path), "nightly")
    p = Prepared(
        xid="nightly-b0-p0-a0-0000abcd",
        txn_id="nightly",
        batch=0,
        partition=0,
        attempt=0,
        mode=Mode.TRANSACTION,
        server="http://h",
        table="db.events",
        rows=1,
        checksum=1,
    )
    log.write(Decision(txn_id="nightly", batch=0, chosen=(p,), version=1))
    o.check_batch_job_not_done()  # decided, not done: a re-run replays it
    log.mark_done(0)
    with pytest.raises(ConfigurationError, match="already committed .* it would write nothing"):
        o.check_batch_job_not_done()
    assert not parse(transactional_id="nightly").resumable_batch_job


def test_options_survive_pickling_unchanged():
    o = parse(password=SECRET, **{"setting.x": "1"})
    assert pickle.loads(pickle.dumps(o)) == o


def test_the_password_is_never_in_repr_or_str():
    o = parse(password=SECRET)
    assert SECRET not in repr(o) and SECRET not in str(o)


@pytest.mark.parametrize(
    "bad",
    [
        {"url": "ftp://host"},
        {"batch_size": "ten"},
        {"create_table": "maybe"},
        {"mode": "exactly"},
        {"pasword": "x"},
        {"session_timeout": "-1"},
    ],
)
def test_no_error_message_contains_the_password(bad):
    msg = error_of({**BASE, "password": SECRET, **bad})
    assert SECRET not in msg


def test_an_unknown_option_is_named_with_close_matches():
    msg = error_of({**BASE, "batchsize": "10", "tabel_column": "t", "zzz": "1"})
    assert "batchsize (did you mean batch_size" in msg
    assert "tabel_column (did you mean table_column" in msg
    assert "zzz" in msg


def test_spark_prefixed_keys_are_not_silently_accepted():
    assert "spark.foo" in error_of({**BASE, "spark.foo": "1"})


def test_the_same_option_in_two_cases_is_refused():
    assert "twice" in error_of({**BASE, "MODE": "none", "mode": "dedup"})


@pytest.mark.parametrize("missing", ["url", "table"])
def test_a_missing_required_option_is_named(missing):
    opts = dict(BASE)
    del opts[missing]
    assert f"option {missing} is required" in error_of(opts)


@pytest.mark.parametrize(
    "url", ["ftp://h:21", "http://", "localhost:8123", "http://h:port", "http://h:8123/?x=1", "http://h:8123/#f"]
)
def test_a_bad_url_is_named_with_its_value(url):
    msg = error_of({**BASE, "url": url})
    assert "option url=" in msg


def test_a_url_with_credentials_is_refused_without_echoing_them():
    msg = error_of({**BASE, "url": f"http://bob:{SECRET}@h:8123"})
    assert SECRET not in msg and "bob" not in msg and "user and password options" in msg


@pytest.mark.parametrize(
    "option,value",
    [
        ("batch_size", "ten"),
        ("batch_size", "0"),
        ("batch_size", "-5"),
        ("batch_size", "1.5"),
        ("batch_bytes", "big"),
        ("session_timeout", "1h"),
        ("retry.attempts", "0"),
        ("connect_timeout", "soon"),
        ("connect_timeout", "0"),
        ("request_timeout", "nan"),
        ("request_timeout", "inf"),
        ("retry.max_seconds", "-2"),
    ],
)
def test_a_malformed_number_is_named_with_the_option_and_the_value(option, value):
    msg = error_of({**BASE, option: value})
    assert f"option {option}={value!r}" in msg


@pytest.mark.parametrize(
    "value,expected",
    [
        ("true", True),
        ("TRUE", True),
        ("1", True),
        ("yes", True),
        ("false", False),
        ("0", False),
        ("No", False),
    ],
)
def test_booleans_accept_true_false_1_0_yes_no(value, expected):
    assert parse(create_table=value).create_table is expected
    assert parse(allow_nullable_into_non_nullable=value).allow_nullable_into_non_nullable is expected


@pytest.mark.parametrize("value", ["y", "on", "", "2"])
def test_a_bad_boolean_is_named(value):
    assert f"option create_table={value!r}" in error_of({**BASE, "create_table": value})


def test_a_bad_mode_lists_the_modes():
    msg = error_of({**BASE, "mode": "exactly_once"})
    assert "option mode='exactly_once'" in msg and "transaction, staging, dedup, none" in msg


@pytest.mark.parametrize("txn", ["has space", "", "x" * 129, "a/b", "semi;colon"])
def test_a_bad_transactional_id_is_refused(txn):
    assert "option transactional_id=" in error_of({**BASE, "transactional_id": txn})


@pytest.mark.parametrize("option", ["order_by", "partition_by", "engine"])
def test_sql_expression_options_refuse_a_semicolon(option):
    assert f"option {option}=" in error_of({**BASE, option: "id; DROP TABLE x"})


def test_a_setting_with_a_bad_name_is_refused():
    assert "setting.bad-name" in error_of({**BASE, "setting.bad-name": "1"})


def test_an_empty_table_part_is_refused():
    assert "option table=" in error_of({**BASE, "table": "db."})


def test_the_known_options_list_is_lower_case_as_spark_delivers_keys():
    assert all(k == k.lower() for k in WRITER_OPTIONS.known_keys())


def test_txn_id_and_decision_log_uri_serve_the_writer():
    s = parse(streaming=True, checkpointLocation="/chk/", transactional_id="t")
    assert s.txn_id() == s.transactional_id
    assert s.decision_log_uri("other") == "/chk"
    b = parse()
    assert b.decision_log_uri() == b.decision_log
    assert b.decision_log_uri("job-1") == b.decision_log  # the log adds clickhouse_tx/<job> itself
    assert parse(decision_log="/x").decision_log_uri("job-1") == "/x"


# ------------------------------------------------------------------ table_column routing


def routing_error_of(**extra: str) -> str:
    with pytest.raises(ConfigurationError) as e:
        parse(**extra).check_routing()
    return str(e.value)


def test_table_column_without_tables_is_refused_naming_both_options():
    msg = routing_error_of(table_column="dest")
    assert "table_column='dest'" in msg and "option tables" in msg


def test_tables_without_table_column_is_refused():
    assert "option tables is only used with option table_column" in routing_error_of(tables="a,b")


@pytest.mark.parametrize("mode", ["staging", "dedup", "none"])
def test_table_column_outside_transaction_mode_is_refused_as_transaction_only(mode: str):
    msg = routing_error_of(table_column="dest", tables="a", mode=mode)
    assert f"mode={mode!r}" in msg and "mode 'transaction' only" in msg


def test_routing_in_transaction_mode_and_no_routing_at_all_pass_the_routing_check():
    parse(table_column="dest", tables="a").check_routing()
    parse().check_routing()


def test_an_empty_entry_in_tables_is_named():
    assert "option tables='a,,b'" in error_of({**BASE, "table_column": "dest", "tables": "a,,b"})


def test_tables_resolve_bare_names_in_the_database_and_reach_the_target_deduplicated():
    o = parse(table_column="dest", tables=" a , other.b ,db.a", password=SECRET)
    assert o.tables == (("db", "a"), ("other", "b"))
    t = o.target()
    assert (t.route_column, t.route_tables) == ("dest", (("db", "a"), ("other", "b")))
    assert (t.database, t.table) == ("db", "events")  # registry and markers stay here
    assert SECRET not in repr(t) and pickle.loads(pickle.dumps(t)) == t
    assert [(r.database, r.table, r.route_column) for r in o.route_targets()] == [
        ("db", "a", None),
        ("other", "b", None),
    ]


def test_retry_options_become_the_coordinators_retry_policy():
    # Reproduced: retry.attempts / retry.max_seconds were parsed but nothing read them.
    from clickhouse_tx.retry import RetryPolicy
    from spark_datasource.sink.writer import coordinator_for

    o = parse(**{"retry.attempts": "2", "retry.max_seconds": "7.5"})
    assert o.retry_policy() == RetryPolicy(max_attempts=2, max_total_s=7.5)
    co = coordinator_for(o, "job-1")
    assert co.retry == RetryPolicy(max_attempts=2, max_total_s=7.5)
    assert co.ops.retry == co.retry


def test_retry_options_also_bound_the_clients_retries_of_reads():
    # Reproduced by the chaos run: a read of the layout records whose reply was lost
    # failed the prepare (and the local job) though repeating a read changes nothing.
    from clickhouse_tx.retry import RetryPolicy

    o = parse(**{"retry.attempts": "9", "retry.max_seconds": "12"})
    assert o.target().read_retry == RetryPolicy(max_attempts=9, max_total_s=12.0)
    assert parse().target().read_retry == o.retry_policy().__class__()


def test_strict_precision_is_a_boolean_option_off_by_default():
    assert parse().strict_precision is False
    assert parse(strict_precision="true").strict_precision is True
    assert "option strict_precision='maybe'" in error_of({**BASE, "strict_precision": "maybe"})


def test_bad_rows_dead_letter_needs_a_table_and_an_exactly_once_mode_and_is_refused_otherwise():
    assert parse().dead_letter_table is None
    assert parse(bad_rows="dead_letter", dead_letter_table="dlq").dead_letter_table == ("db", "dlq")
    assert parse(bad_rows="DEAD_LETTER", dead_letter_table="x.dlq").dead_letter_table == ("x", "dlq")
    assert "needs the option dead_letter_table" in error_of({**BASE, "bad_rows": "dead_letter"})
    assert "needs bad_rows=dead_letter" in error_of({**BASE, "dead_letter_table": "dlq"})
    assert "expected fail or dead_letter" in error_of({**BASE, "bad_rows": "skip"})
    assert "modes 'transaction' (in the partition's transaction), 'dedup'" in error_of(
        {**BASE, "bad_rows": "dead_letter", "dead_letter_table": "dlq", "mode": "none"}
    )
    assert parse(bad_rows="dead_letter", dead_letter_table="dlq", mode="staging").dead_letter_table
    assert parse(bad_rows="dead_letter", dead_letter_table="dlq", mode="dedup").dead_letter_table


def test_a_streaming_visibility_defaults_to_partition_and_batch_is_taken_in_mode_staging():
    assert parse(streaming=True, checkpointLocation="/c").visibility == "partition"
    assert parse(streaming=True, checkpointLocation="/c", mode="staging", visibility="Batch").visibility == "batch"


def test_a_streaming_visibility_batch_outside_mode_staging_or_an_unknown_visibility_is_refused_on_the_driver():
    chk = {"checkpointLocation": "/c"}
    assert "only mode 'staging'" in error_of({**BASE, **chk, "visibility": "batch"}, streaming=True)
    assert "visibility='whole'" in error_of({**BASE, **chk, "mode": "staging", "visibility": "whole"}, streaming=True)
    assert "choose 'partition' or 'batch'" in error_of({**BASE, **chk, "visibility": "auto"}, streaming=True)


def test_a_batch_job_publishes_at_once_by_default_in_every_exactly_once_mode():
    for mode in ("transaction", "staging", "dedup"):
        assert parse(mode=mode).visibility == "auto"
        assert parse(mode=mode, visibility="batch").visibility == "batch"
        assert parse(mode=mode, visibility="partition").visibility == "partition"
        assert parse(mode=mode).commit_visibility() == "partition"  # the job stage publishes, not the mode


def test_a_batch_job_that_cannot_be_published_at_once_defaults_to_partition_and_refuses_batch():
    cases = {
        "with mode='none'": {"mode": "none"},
        "with table_column": {"table_column": "t", "tables": "a,b"},
        "for a resumable batch job": {"transactional_id": "job1", "decision_log": "/tmp/x"},
    }
    for reason, extra in cases.items():
        assert parse(**extra).visibility == "partition"
        assert reason in error_of({**BASE, **extra, "visibility": "batch"})
    assert "expected partition, batch or auto" in error_of({**BASE, "visibility": "whole"})


def test_an_idempotence_key_is_taken_by_batch_jobs_only_and_must_be_printable():
    assert parse().idempotence_key == ""
    assert parse(idempotence_key=" airflow-run-2026-11-26 ").idempotence_key == "airflow-run-2026-11-26"
    assert "expected 1-256 printable characters" in error_of({**BASE, "idempotence_key": "  "})
    assert "expected 1-256 printable characters" in error_of({**BASE, "idempotence_key": "x" * 257})
    assert "a streaming query is made idempotent by its checkpoint" in error_of(
        {**BASE, "checkpointLocation": "/c", "idempotence_key": "k"}, streaming=True
    )


def test_visibility_batch_with_shards_is_refused_on_the_driver():
    opts = {"table": "db.events", "mode": "staging", "visibility": "batch", "shards": "http://a:8123,http://b:8123"}
    msg = error_of(opts)
    assert "visibility=batch with shards" in msg


@pytest.mark.parametrize("value", ["1", "3", str(MIN_SESSION_TIMEOUT_S - 1)])
def test_a_session_timeout_below_the_floor_is_refused_naming_the_option_and_the_floor(value: str) -> None:
    msg = error_of({**BASE, "session_timeout": value})
    assert f"option session_timeout={value!r}" in msg and f"at least {MIN_SESSION_TIMEOUT_S} seconds" in msg


def test_the_session_timeout_floor_itself_is_accepted() -> None:
    assert parse(session_timeout=str(MIN_SESSION_TIMEOUT_S)).target().session_timeout_s == MIN_SESSION_TIMEOUT_S
