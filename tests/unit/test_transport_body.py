"""What the transport puts on the wire for an INSERT of serialized record batches.

A recording HTTP server stands in for ClickHouse here, to read the request's framing.
The embedded server takes the same request in
``tests/integration/test_http_client.py::test_serialized_record_batches_go_in_as_one_insert_with_their_nulls_and_strings``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pyarrow as pa
import pytest

from clickhouse_tx._transport import ClickHouseHTTP
from clickhouse_tx.interfaces import Target

END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


class _Recorder(BaseHTTPRequestHandler):
    seen: list[tuple[dict[str, str], bytes | None]] = []

    def do_POST(self) -> None:  # noqa: N802 (the http.server hook's name)
        length = self.headers.get("Content-Length")
        body = self.rfile.read(int(length)) if length is not None else None
        self.seen.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.send_header("Connection", "close")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (the hook's signature)
        pass


@pytest.fixture
def recorder() -> Iterator[tuple[str, list[tuple[dict[str, str], bytes | None]]]]:
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", _Recorder.seen
    finally:
        server.shutdown()
        server.server_close()


def test_serialized_record_batches_go_with_a_content_length_as_the_schema_the_messages_and_the_end_marker(
    recorder: tuple[str, list[tuple[dict[str, str], bytes | None]]],
) -> None:
    url, seen = recorder
    batch = pa.record_batch({"a": pa.array(range(1000), pa.uint64()), "s": pa.array([f"r{i}" for i in range(1000)])})
    messages = [batch.slice(0, 600).serialize(), batch.slice(600).serialize()]
    client = ClickHouseHTTP(Target(url=url, database="d", table="t"))
    try:
        client.insert_arrow_messages("`d`.`t`", batch.schema, messages)
    finally:
        client.close()
    [(headers, body)] = seen
    expected = batch.schema.serialize().to_pybytes() + b"".join(m.to_pybytes() for m in messages) + END_OF_STREAM
    assert "transfer-encoding" not in headers  # not chunked: urllib3 would copy each message to frame it
    assert headers["content-length"] == str(len(expected))
    assert body == expected
    with pa.ipc.open_stream(body) as reader:
        assert reader.read_all().equals(pa.Table.from_batches([batch]))
