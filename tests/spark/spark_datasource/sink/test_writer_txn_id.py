"""One query, one transactional id (real Spark, the embedded stack).

A streaming query's id is read from its checkpoint, so an explicit id that differs is
refused before any task writes; a batch job's id is fresh per job, so a second job with
the same ``transactional_id`` writes its rows. The SIGKILL cases (the checkpoint
respelled after a crash between COMMIT and Spark's commit log) are in
``tests/torture/test_checkpoint_spelling.py``.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from kafka import KafkaProducer

from tests.helpers.spark_streams import assert_exactly, create_target, make_topic, start_query, target_rows
from tests.helpers.spark_writes import (
    actual_totals,
    create_events_table,
    events,
    expected_totals,
    open_registry_entries,
    run_sql,
    table_names,
    writer_options,
)


def registered_txn_ids(url: str, database: str) -> set[str]:
    if "clickhouse_tx_registry" not in table_names(url, database):
        return set()
    # KeeperMap is not transactional: a plain read
    return set(run_sql(url, f"SELECT DISTINCT txn_id FROM `{database}`.clickhouse_tx_registry FORMAT TSV").split())


def test_a_second_batch_job_with_the_same_transactional_id_writes_its_rows(
    sp, clickhouse_url: str, database: str
) -> None:
    create_events_table(clickhouse_url, database, "events", "transaction")
    opts = writer_options(clickhouse_url, database, "events", "transaction", transactional_id="nightly")
    for _ in range(2):
        events(sp, 10_000, 2).write.format("clickhouse_tx").options(**opts).mode("append").save()
    n, ids, ks, lengths = expected_totals(10_000)
    assert actual_totals(clickhouse_url, database, "events") == (2 * n, 2 * ids, 2 * ks, 2 * lengths)
    assert open_registry_entries(clickhouse_url, database) == 0


def test_an_explicit_transactional_id_different_from_the_stored_one_is_refused_before_any_task_writes(
    sp, stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path
) -> None:
    topic, expected = make_topic(stack, kafka_bootstrap, partitions=2, per_partition=200)
    create_target(clickhouse_url, database)
    common = dict(
        bootstrap=kafka_bootstrap,
        topic=topic,
        url=clickhouse_url,
        database=database,
        chk=tmp_path / "chk",
        name=f"txnid_{uuid.uuid4().hex[:6]}",
        available_now=True,
    )
    q = start_query(sp, **common)
    q.awaitTermination(300)
    assert q.exception() is None
    producer = KafkaProducer(bootstrap_servers=kafka_bootstrap)
    for i in range(200, 300):
        producer.send(topic, value=f"0:{i}".encode(), partition=0)
        expected.add((0, i, f"0:{i}"))
    producer.flush()
    producer.close()

    with pytest.raises(Exception) as refused:
        q = start_query(sp, transactional_id="other_id", **common)
        q.awaitTermination(300)
        if q.exception():
            raise q.exception()
    assert "transactional_id='other_id' differs from" in str(refused.value)
    assert len(target_rows(clickhouse_url, database)) == 400  # nothing of the new records
    assert "other_id" not in registered_txn_ids(clickhouse_url, database)
    record = json.loads((tmp_path / "chk" / "clickhouse_tx" / "query.json").read_text())
    assert record["transactional_id"].startswith("q_")  # the derived id is kept, unchanged

    q = start_query(sp, **common)  # without the option: the stored id goes on
    q.awaitTermination(300)
    assert q.exception() is None
    assert_exactly(clickhouse_url, database, expected)
