"""Timestamp lookups (``ListOffsets`` by timestamp) for the dev broker's front.

librdkafka's mock broker answers ``ListOffsets`` for -1 (latest) and -2 (earliest)
only: for a timestamp it answers offset -1, as if no record were that recent. Kafka
answers the offset of the first record whose timestamp is at or after it (KIP-79),
which is what ``kafka_py``'s ``startingTimestamp`` and friends ask for. The front
(:mod:`server_patches.kafka_front`) forwards the request, then replaces the answer of
every partition asked by timestamp with the one this module finds by reading the
partition from the mock (``Fetch`` v4), record batch by record batch (a batch whose
``maxTimestamp`` is below the timestamp is skipped without decoding its records).

Uncompressed batches are searched record by record; in a compressed batch the first
offset of the batch stands for all its records (the tests produce uncompressed).
Control batches (transaction markers) hold no records. ``LogAppendTime`` batches use
the batch's timestamp for each record. Stdlib only; runs on the front's event loop.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Iterator

_FETCH, _FETCH_VERSION = 1, 4
_CONTROL, _LOG_APPEND_TIME, _COMPRESSION = 0x20, 0x08, 0x07
_BATCH_HEADER = 61
#: ListOffsets versions the front patches (v1-v5: not flexible); it advertises no higher.
LIST_OFFSETS, MAX_LIST_OFFSETS_VERSION = 2, 5


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


class _Cursor:
    """Reads Kafka's big-endian fields from a bytes buffer, in order."""

    def __init__(self, data: bytes, at: int = 0) -> None:
        self.data, self.at = data, at

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return int(value)

    def string(self) -> str:
        n = self.take(">h")
        text = self.data[self.at : self.at + max(0, n)].decode("utf-8", "replace")
        self.at += max(0, n)
        return text

    def varint(self) -> int:
        shift = result = 0
        while True:
            byte = self.data[self.at]
            self.at += 1
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return (result >> 1) ^ -(result & 1)  # zigzag
            shift += 7


def requested_timestamps(body: bytes, version: int) -> dict[tuple[str, int], int]:
    """(topic, partition) -> timestamp of a ListOffsets v1-v5 request body (after the header)."""
    c = _Cursor(body)
    c.take(">i")  # replica id
    if version >= 2:
        c.take(">b")  # isolation level
    asked: dict[tuple[str, int], int] = {}
    for _ in range(c.take(">i")):
        topic = c.string()
        for _ in range(c.take(">i")):
            partition = c.take(">i")
            if version >= 4:
                c.take(">i")  # current leader epoch
            asked[(topic, partition)] = c.take(">q")
    return asked


def patch_list_offsets(body: bytes, version: int, found: dict[tuple[str, int], tuple[int, int]]) -> bytes:
    """A ListOffsets v1-v5 response body with ``found`` (topic, partition) -> (timestamp, offset) put in."""
    c = _Cursor(body)
    out = bytearray()
    if version >= 2:
        out += struct.pack(">i", c.take(">i"))
    topics = c.take(">i")
    out += struct.pack(">i", topics)
    for _ in range(topics):
        topic = c.string()
        out += _string(topic)
        parts = c.take(">i")
        out += struct.pack(">i", parts)
        for _ in range(parts):
            partition, error, stamp, offset = c.take(">i"), c.take(">h"), c.take(">q"), c.take(">q")
            if error == 0 and (topic, partition) in found:
                stamp, offset = found[(topic, partition)]
            out += struct.pack(">ihqq", partition, error, stamp, offset)
            if version >= 4:
                out += struct.pack(">i", c.take(">i"))
    return bytes(out) + body[c.at :]


def _fetch_request(correlation: int, topic: str, partition: int, offset: int) -> bytes:
    body = struct.pack(">iiiib", -1, 0, 1, 4 * 1024 * 1024, 0) + struct.pack(">i", 1) + _string(topic)
    body += struct.pack(">i", 1) + struct.pack(">iqi", partition, offset, 4 * 1024 * 1024)
    payload = struct.pack(">hhih", _FETCH, _FETCH_VERSION, correlation, 5) + b"front" + body
    return struct.pack(">i", len(payload)) + payload


def _fetch_answer(body: bytes) -> tuple[int, int, bytes]:
    """(error, high watermark, record bytes) of a one-partition Fetch v4 response body."""
    c = _Cursor(body)
    c.take(">i")  # throttle
    c.take(">i")  # one topic
    c.string()
    c.take(">i")  # one partition
    c.take(">i")
    error, high = c.take(">h"), c.take(">q")
    c.take(">q")  # last stable offset
    aborted = c.take(">i")
    c.at += 16 * max(0, aborted)
    size = c.take(">i")
    return error, high, body[c.at : c.at + max(0, size)]


def _batches(records: bytes) -> Iterator[tuple[int, int, int, int, bytes]]:
    """(base offset, last offset, attributes, max timestamp, batch) of each whole batch."""
    at = 0
    while at + _BATCH_HEADER <= len(records):
        base, length = struct.unpack_from(">qi", records, at)
        end = at + 12 + length
        if end > len(records):
            return  # cut off by the fetch size: fetched again from its offset
        attributes, last_delta, _, max_stamp = struct.unpack_from(">hiqq", records, at + 21)
        yield base, base + last_delta, attributes, max_stamp, records[at:end]
        at = end


def _first_at_or_after(batch: bytes, base: int, attributes: int, max_stamp: int, ts: int) -> tuple[int, int] | None:
    """(offset, timestamp) of the batch's first record with a timestamp >= ``ts``."""
    if attributes & _LOG_APPEND_TIME or attributes & _COMPRESSION:
        return (base, max_stamp) if max_stamp >= ts else None
    (base_stamp,) = struct.unpack_from(">q", batch, 27)
    c = _Cursor(batch, _BATCH_HEADER)
    for _ in range(struct.unpack_from(">i", batch, 57)[0]):
        length = c.varint()
        start = c.at
        c.take(">b")  # attributes
        stamp, delta = base_stamp + c.varint(), c.varint()
        if stamp >= ts:
            return base + delta, stamp
        c.at = start + length
    return None


async def find_offset(backend: tuple[str, int], topic: str, partition: int, ts: int) -> tuple[int, int]:
    """(timestamp, offset) of the first record of ``topic[partition]`` at or after ``ts``,
    or (-1, -1) when there is none (Kafka's answer), read from the mock at ``backend``."""
    reader, writer = await asyncio.open_connection(*backend)
    try:
        offset, correlation = 0, 0
        while True:
            correlation += 1
            writer.write(_fetch_request(correlation, topic, partition, offset))
            (size,) = struct.unpack(">i", await reader.readexactly(4))
            frame = await reader.readexactly(size)
            error, high, records = _fetch_answer(frame[4:])
            before = offset
            if error or offset >= high or not records:
                return -1, -1  # also a log whose start was deleted (OFFSET_OUT_OF_RANGE at 0)
            for base, last, attributes, max_stamp, batch in _batches(records):
                if last < offset or attributes & _CONTROL or max_stamp < ts:
                    offset = max(offset, last + 1)
                    continue
                hit = _first_at_or_after(batch, base, attributes, max_stamp, ts)
                if hit is not None and hit[0] >= offset:
                    return hit[1], hit[0]
                offset = max(offset, last + 1)
            if offset == before:
                return -1, -1  # a batch larger than the fetch: give up rather than loop
    finally:
        writer.close()
