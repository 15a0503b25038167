"""Batch and streaming writes over HTTPS, through the TLS front before the embedded server.

One front requires a client certificate of the generated CA on every connection, so a
write that lands through it proves that the driver and every executor connected with
``ca_cert``, ``client_cert`` and ``client_cert_key``: the executors build their client
from the pickled ``Target`` alone. What the tests read back goes over plain HTTP.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from tests.helpers.https import HttpsFront
from tests.helpers.spark_streams import assert_exactly, new_stream, start_query
from tests.helpers.spark_writes import (
    actual_totals,
    create_events_table,
    events,
    expected_totals,
    open_registry_entries,
    scalar,
    table_names,
    writer_options,
)

PASSWORD = "never-shown-0c7e"


def _mutual(f: HttpsFront) -> dict[str, str]:
    return {"ca_cert": f.files.ca, "client_cert": f.files.client_cert, "client_cert_key": f.files.client_key}


def _batch(sp, url: str, database: str, n: int, **extra: str) -> None:
    txn = f"https-{uuid.uuid4().hex[:6]}"
    options = writer_options(url, database, "events", "transaction", transactional_id=txn, **extra)
    events(sp, n, 4).write.format("clickhouse_tx").options(**options).mode("append").save()


def test_a_batch_write_through_a_front_requiring_a_client_certificate_lands_each_row_once(
    sp, clickhouse_url: str, database: str, mtls_front: HttpsFront
) -> None:
    create_events_table(clickhouse_url, database, "events", "transaction")
    _batch(sp, mtls_front.url, database, 20_000, **_mutual(mtls_front))
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(20_000)
    assert open_registry_entries(clickhouse_url, database) == 0


@pytest.mark.parametrize(
    ("tls", "named"),
    [({"ca_cert": "other_ca"}, "option ca_cert"), ({"ca_cert": "ca"}, "client_cert")],
    ids=["untrusted_ca", "no_client_certificate"],
)
def test_a_batch_write_refused_by_tls_fails_on_the_driver_naming_the_option_before_any_task_writes(
    sp, clickhouse_url: str, database: str, mtls_front: HttpsFront, tls: dict[str, str], named: str
) -> None:
    create_events_table(clickhouse_url, database, "events", "transaction")
    options = {k: getattr(mtls_front.files, v) for k, v in tls.items()}
    with pytest.raises(Exception) as err:
        _batch(sp, mtls_front.url, database, 1000, password=PASSWORD, **options)
    assert named in str(err.value) and PASSWORD not in str(err.value)
    assert scalar(clickhouse_url, f"SELECT count() FROM `{database}`.events") == 0
    assert table_names(clickhouse_url, database) == ["events"]  # no registry, no markers: nothing began


def test_a_batch_write_with_verify_false_lands_its_rows_through_an_untrusted_certificate(
    sp, clickhouse_url: str, database: str, front: HttpsFront
) -> None:
    create_events_table(clickhouse_url, database, "events", "transaction")
    _batch(sp, front.url, database, 5000, verify="false")
    assert actual_totals(clickhouse_url, database, "events") == expected_totals(5000)


def test_a_streaming_write_through_a_front_requiring_a_client_certificate_writes_each_record_once(
    sp, stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path, mtls_front: HttpsFront
) -> None:
    expected, common = new_stream(stack, kafka_bootstrap, clickhouse_url, database, tmp_path / "chk", "https", 400)
    q = start_query(sp, available_now=True, max_offsets=300, **{**common, "url": mtls_front.url}, **_mutual(mtls_front))
    q.awaitTermination(600)
    assert q.exception() is None
    assert_exactly(clickhouse_url, database, expected)
    assert open_registry_entries(clickhouse_url, database) == 0


def test_a_streaming_write_to_a_server_whose_ca_is_not_trusted_stops_naming_ca_cert_and_writes_nothing(
    sp, stack, kafka_bootstrap: str, clickhouse_url: str, database: str, tmp_path: Path, mtls_front: HttpsFront
) -> None:
    _, common = new_stream(stack, kafka_bootstrap, clickhouse_url, database, tmp_path / "chk", "https_bad", 50)
    files = mtls_front.files
    tls = {"ca_cert": files.other_ca, "client_cert": files.client_cert, "client_cert_key": files.client_key}
    q = start_query(sp, available_now=True, **{**common, "url": mtls_front.url}, **tls)
    with pytest.raises(Exception, match="option ca_cert"):
        q.awaitTermination(600)
    assert scalar(clickhouse_url, f"SELECT count() FROM `{database}`.events") == 0
