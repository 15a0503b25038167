"""What the transport puts on the wire for an INSERT of serialized record batches.

A recording HTTP server stands in for ClickHouse here, to read the request's framing.
The embedded server takes the same request in
``tests/integration/clickhouse_tx/client/test_http_client.py::test_serialized_record_batches_go_in_as_one_insert_with_their_nulls_and_strings``.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pyarrow as pa
import pytest

from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.errors import ReplyLostError, RowsNotWrittenError
from clickhouse_tx.interfaces import Target


class _RecordingServer(ThreadingHTTPServer):
    """Keeps each POST's headers (lower-cased) and body; a body without a length is None.

    Answers success with ``X-ClickHouse-Summary`` counting ``written_rows`` (None: no summary).
    The client's probe of ``system.settings`` (once per server and process) is answered
    with ``setting_names`` and kept apart, in ``probes``; ``paths`` keeps each POST's URL.
    """

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Recorder)
        self.seen: list[tuple[dict[str, str], bytes | None]] = []
        self.paths: list[str] = []
        self.probes = 0
        self.setting_names: list[str] = []
        self.written_rows: int | None = 1000


class _Recorder(BaseHTTPRequestHandler):
    server: _RecordingServer

    def do_POST(self) -> None:  # noqa: N802 (the http.server hook's name)
        length = self.headers.get("Content-Length")
        body = self.rfile.read(int(length)) if length is not None else None
        if body is not None and b"system.settings" in body:
            self.server.probes += 1
            self._answer("\n".join(self.server.setting_names).encode())
            return
        self.server.seen.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.server.paths.append(self.path)
        self.send_response(200)
        if self.server.written_rows is not None:
            self.send_header("X-ClickHouse-Summary", json.dumps({"written_rows": str(self.server.written_rows)}))
        self.send_header("Content-Length", "0")
        self.send_header("Connection", "close")
        self.end_headers()

    def _answer(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the hook's signature)
        pass


@pytest.fixture
def recorder() -> Iterator[_RecordingServer]:
    server = _RecordingServer()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _ipc_stream(schema: pa.Schema, batches: list[pa.RecordBatch]) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema) as writer:
        for b in batches:
            writer.write_batch(b)
    return sink.getvalue().to_pybytes()


def test_serialized_record_batches_go_with_a_content_length_as_the_bytes_of_an_arrow_stream_of_them(
    recorder: _RecordingServer,
) -> None:
    batch = pa.record_batch({"a": pa.array(range(1000), pa.uint64()), "s": pa.array([f"r{i}" for i in range(1000)])})
    pieces = [batch.slice(0, 600), batch.slice(600)]
    client = ClickHouseHTTP(Target(url=f"http://127.0.0.1:{recorder.server_address[1]}", database="d", table="t"))
    try:
        client.insert_arrow_messages("`d`.`t`", batch.schema, [p.serialize() for p in pieces], rows=1000)
    finally:
        client.close()
    [(headers, body)] = recorder.seen
    expected = _ipc_stream(batch.schema, pieces)
    assert "transfer-encoding" not in headers  # not chunked: urllib3 would copy each message to frame it
    assert headers["content-length"] == str(len(expected))
    assert body == expected
    with pa.ipc.open_stream(body) as reader:
        assert reader.read_all().equals(pa.Table.from_batches([batch]))


def _insert_1000(recorder: _RecordingServer, *, may_deduplicate: bool = False, **target: Any) -> int:
    batch = pa.record_batch({"a": pa.array(range(1000), pa.uint64())})
    url = f"http://127.0.0.1:{recorder.server_address[1]}"
    client = ClickHouseHTTP(Target(url=url, database="d", table="t", **target))
    settings = {"insert_deduplication_token": "chunk-1"} if may_deduplicate else None
    try:
        return client.insert_arrow_stream(
            "`d`.`t`", batch.schema, iter([batch]), settings=settings, may_deduplicate=may_deduplicate
        )
    finally:
        client.close()


def _url_settings(path: str) -> dict[str, str]:
    return dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(path).query))


def test_an_insert_carries_the_server_contracts_settings_over_the_targets_own(recorder: _RecordingServer) -> None:
    recorder.setting_names = ["deduplicate_insert", "deduplicate_insert_select"]
    _insert_1000(recorder, settings={"async_insert": "1", "max_insert_block_size": "5"})
    _insert_1000(recorder, may_deduplicate=True)
    keep, dedup = (_url_settings(p) for p in recorder.paths)
    assert recorder.probes == 1  # once per server and process
    assert keep["max_insert_block_size"] == "5"  # the target's own stay
    assert (keep["async_insert"], keep["insert_deduplicate"], keep["deduplicate_insert"]) == ("0", "0", "disable")
    assert keep["deduplicate_insert_select"] == "disable" and keep["insert_deduplication_token"].startswith("keep:")
    assert (dedup["async_insert"], dedup["insert_deduplicate"], dedup["deduplicate_insert"]) == ("0", "1", "enable")
    assert dedup["insert_deduplication_token"] == "chunk-1"


def test_a_server_older_than_26_2_is_sent_no_setting_it_does_not_have(recorder: _RecordingServer) -> None:
    recorder.setting_names = []
    _insert_1000(recorder, may_deduplicate=True)
    sent = _url_settings(recorder.paths[0])
    assert "deduplicate_insert" not in sent and "deduplicate_insert_select" not in sent
    assert (sent["async_insert"], sent["insert_deduplicate"]) == ("0", "1")


@pytest.mark.parametrize("written", [0, 999])
def test_an_insert_answered_with_success_that_wrote_fewer_rows_than_sent_raises_naming_both_counts(
    recorder: _RecordingServer, written: int
) -> None:
    recorder.written_rows = written
    with pytest.raises(RowsNotWrittenError, match=f"wrote {written} of the 1000 rows sent") as err:
        _insert_1000(recorder)
    assert (err.value.sent, err.value.written) == (1000, written)


def test_a_deduplicating_insert_may_write_no_row_but_not_part_of_its_block(recorder: _RecordingServer) -> None:
    recorder.written_rows = 0
    assert _insert_1000(recorder, may_deduplicate=True) == 1000
    recorder.written_rows = 400
    with pytest.raises(RowsNotWrittenError):
        _insert_1000(recorder, may_deduplicate=True)


def test_rows_written_into_materialized_views_as_well_count_as_written(recorder: _RecordingServer) -> None:
    recorder.written_rows = 3000  # the target's rows and two views' copies
    assert _insert_1000(recorder) == 1000


def test_a_success_reply_without_a_summary_leaves_the_insert_outcome_unknown(recorder: _RecordingServer) -> None:
    recorder.written_rows = None
    with pytest.raises(ReplyLostError, match="no X-ClickHouse-Summary"):
        _insert_1000(recorder)
