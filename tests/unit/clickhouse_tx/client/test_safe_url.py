"""One credential-free form of a URL (:func:`clickhouse_tx.client.http.safe_url`) for
everything that records or logs one."""

from __future__ import annotations

import dataclasses

import pytest

from clickhouse_tx.client.http import safe_url
from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.interfaces import WriteContext
from clickhouse_tx.protocol.coordinator import Coordinator
from spark_datasource.options.writer_options import WriterOptions
from tests.unit.fakes import TARGET, World, arrow_batches


@pytest.mark.parametrize(
    "url,safe",
    [
        ("http://alice:pw-1@h:8123/", "http://h:8123/"),
        ("https://h/?password=pw-1#frag", "https://h/"),
        ("http://alice:pw-1@[::1]:8123", "http://[::1]:8123"),
        ("http://alice:pw-1@h:notaport/", "<unparseable url>"),
    ],
)
def test_safe_url_drops_user_info_query_and_fragment(url: str, safe: str) -> None:
    assert safe_url(url) == safe
    assert "pw-1" not in safe_url(url)


def test_prepare_records_the_server_without_credentials_in_the_registry() -> None:
    world = World()
    base = world.coordinator()
    secret_target = dataclasses.replace(TARGET, url="http://alice:pw-1@fake:8123")
    c = Coordinator(
        base.txn_id,
        secret_target,
        world.ch,
        world.registry,
        world.log,
        retry=base.retry,
        sleep=lambda s: None,
        xid_factory=world.next_xid,
        clock=lambda: world.now[0],
    )
    p = c.prepare(WriteContext(c.txn_id, 0, 0, 0), arrow_batches(3))
    assert world.registry.entries[p.xid].server == "http://fake:8123"


@pytest.mark.parametrize("url", ["http://h:8123/?password=pw-1", "ftp://h/?password=pw-1", "http://alice:pw-1@h:8123"])
def test_a_refused_url_option_is_named_without_its_secret(url: str) -> None:
    with pytest.raises(ConfigurationError) as ei:
        WriterOptions.parse({"url": url, "database": "d", "table": "t"}, streaming=False)
    assert "pw-1" not in str(ei.value)
