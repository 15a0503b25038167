"""Wire details of the HTTP client: request bodies, JSON values, labels (private).

How :class:`clickhouse_tx.client.http.ClickHouseHTTP` frames what it sends (a streamed
Arrow IPC body, a body of parts of known length) and reads what comes back (64-bit
integers quoted in JSON), and the short label of a statement its errors carry.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, cast

import pyarrow as pa

#: The Arrow IPC stream's end marker: continuation token, then a zero metadata length.
END_OF_STREAM = b"\xff\xff\xff\xff\x00\x00\x00\x00"


class PendingBytes(io.RawIOBase):
    """A write-only file that keeps what was written until :meth:`take` collects it.

    The Arrow IPC stream writer writes into it; the request-body generator hands the
    bytes to ``requests`` after each record batch, so memory holds one batch at most.
    """

    def __init__(self) -> None:
        super().__init__()
        self._chunks: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, b: bytes | bytearray | memoryview) -> int:  # type: ignore[override]
        data = bytes(b)
        self._chunks.append(data)
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._chunks)
        self._chunks.clear()
        return out


class SizedBody:
    """A request body of parts whose total length is known before it is sent.

    ``requests`` sends it with a ``Content-Length`` and hands each part to the socket
    as it is. A body of unknown length goes chunked, and urllib3 then copies every
    part into a new ``bytes`` to frame it: one more pass over the data.
    """

    def __init__(self, parts: Sequence[memoryview]) -> None:
        self._parts = parts
        self._size = sum(p.nbytes for p in parts)

    def __iter__(self) -> Iterator[bytes]:
        # requests' stubs say bytes; the socket takes any buffer, a memoryview uncopied.
        return iter(cast("Sequence[bytes]", self._parts))

    def __len__(self) -> int:
        return self._size


def arrow_stream_body(schema: pa.Schema, batches: Iterator[pa.RecordBatch], counter: list[int]) -> Iterator[bytes]:
    """An Arrow IPC stream of ``batches`` as body parts, one record batch in memory at a time.

    Empty batches are skipped; ``counter[0]`` adds the rows sent (read it after the request).
    """
    sink = PendingBytes()
    writer = pa.ipc.new_stream(sink, schema)
    pending = sink.take()
    if pending:
        yield pending
    for batch in batches:
        if batch.num_rows == 0:
            continue
        writer.write_batch(batch)
        counter[0] += batch.num_rows
        chunk = sink.take()
        if chunk:
            yield chunk
    writer.close()
    tail = sink.take()
    if tail:
        yield tail


_BIG_INT = re.compile(r"^(?:Nullable\()?U?Int(?:64|128|256)\)?$")
_BIG_INT_ARRAY = re.compile(r"^Array\((?:Nullable\()?U?Int(?:64|128|256)\)?\)$")


def converter(ch_type: str) -> Callable[[Any], Any] | None:
    """How to turn a JSON value of ``ch_type`` into Python (64-bit+ ints arrive quoted)."""
    if _BIG_INT.match(ch_type):
        return lambda v: int(v) if isinstance(v, str) else v
    if _BIG_INT_ARRAY.match(ch_type):
        return lambda v: [int(x) if isinstance(x, str) else x for x in v] if isinstance(v, list) else v
    return None


def setting_text(v: object) -> str:
    if isinstance(v, bool):
        return "1" if v else "0"
    return str(v)


def statement_label(sql: str) -> str:
    """A short label of a statement for error messages (first words, no values)."""
    words = sql.strip().split()
    return " ".join(words[:3])[:80] if words else "request"
