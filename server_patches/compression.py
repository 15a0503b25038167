"""Request bodies: HTTP framing (Content-Length or chunked), Content-Encoding, and
ClickHouse's own compressed blocks (``decompress=1``).

Bodies are decoded as they arrive, one chunk at a time, never whole in memory; this
runs on the handler's thread for every request with a body.
"""

from __future__ import annotations

import struct
import zlib
from typing import IO, Callable, Iterator, Mapping

from server_patches.errors import (
    BAD_ARGUMENTS,
    CANNOT_DECOMPRESS,
    NOT_IMPLEMENTED,
    TOO_LARGE_SIZE_COMPRESSED,
    UNKNOWN_COMPRESSION_METHOD,
    HTTPError,
)

Headers = Mapping[str, str]


def _raw_body(rfile: IO[bytes], headers: Headers) -> Iterator[bytes]:
    """The request body as it arrives: Content-Length or chunked, never whole in memory."""
    te = (headers.get("Transfer-Encoding") or "").lower()
    if "chunked" in te:
        while True:
            line = rfile.readline(65537)
            if not line:
                raise HTTPError(BAD_ARGUMENTS, "Unexpected end of chunked body")
            try:
                size = int(line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise HTTPError(BAD_ARGUMENTS, "Malformed chunked encoding") from None
            if size == 0:
                while rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                    pass
                return
            remaining = size
            while remaining:
                part = rfile.read(min(remaining, 1 << 20))
                if not part:
                    raise HTTPError(BAD_ARGUMENTS, "Unexpected end of chunked body")
                remaining -= len(part)
                yield part
            rfile.readline(3)
        return
    length = int(headers.get("Content-Length") or 0)
    while length > 0:
        part = rfile.read(min(length, 1 << 20))
        if not part:
            raise HTTPError(BAD_ARGUMENTS, "Unexpected end of request body")
        length -= len(part)
        yield part


def _decoder(encoding: str) -> Callable[[bytes], bytes] | None:
    enc = encoding.strip().lower()
    if enc in ("", "identity"):
        return None
    if enc in ("gzip", "x-gzip"):
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        return d.decompress
    if enc == "deflate":
        d = zlib.decompressobj(zlib.MAX_WBITS | 32)  # zlib or gzip header
        return d.decompress
    if enc == "zstd":
        import zstandard

        return zstandard.ZstdDecompressor().decompressobj().decompress
    if enc == "lz4":
        import lz4.frame

        d = lz4.frame.LZ4FrameDecompressor()
        return d.decompress
    if enc in ("br",):
        raise HTTPError(
            NOT_IMPLEMENTED, f"Content-Encoding {encoding} is not supported here; use gzip, deflate, zstd or lz4"
        )
    raise HTTPError(BAD_ARGUMENTS, f"Unknown Content-Encoding: {encoding}")


_BLOCK_HEADER = 16 + 9  # CityHash128 checksum, method byte, compressed and raw sizes
_MAX_BLOCK = 1 << 30


def native_blocks(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """Decode ClickHouse's own compression framing (``decompress=1``) block by block.

    The CityHash128 checksum is not verified (no CityHash in the standard library);
    a wrong method byte or inconsistent sizes are refused with the server's codes.
    """
    buf = bytearray()
    src = iter(chunks)

    def need(n: int) -> bool:
        while len(buf) < n:
            part = next(src, None)
            if part is None:
                return False
            buf.extend(part)
        return True

    while need(1):
        if not need(_BLOCK_HEADER):
            raise HTTPError(CANNOT_DECOMPRESS, "Cannot decompress: truncated compressed block header")
        method = buf[16]
        compressed, raw = struct.unpack_from("<II", buf, 17)
        if method not in (0x02, 0x82, 0x90):
            raise HTTPError(
                UNKNOWN_COMPRESSION_METHOD,
                f"Unknown compression method 0x{method:02x} in a decompress=1 body",
                "UNKNOWN_COMPRESSION_METHOD",
            )
        if compressed < 9 or compressed > _MAX_BLOCK or raw > _MAX_BLOCK:
            raise HTTPError(
                TOO_LARGE_SIZE_COMPRESSED,
                f"Compressed block size {compressed} (raw {raw}) is out of bounds",
                "TOO_LARGE_SIZE_COMPRESSED",
            )
        if not need(16 + compressed):
            raise HTTPError(CANNOT_DECOMPRESS, "Cannot decompress: truncated compressed block")
        payload = bytes(buf[16 + 9 : 16 + compressed])
        del buf[: 16 + compressed]
        try:
            if method == 0x02:
                out = payload
            elif method == 0x82:
                import lz4.block

                out = lz4.block.decompress(payload, uncompressed_size=raw)
            else:
                import zstandard

                out = zstandard.ZstdDecompressor().decompress(payload, max_output_size=raw)
        except Exception as exc:
            raise HTTPError(CANNOT_DECOMPRESS, f"Cannot decompress block: {exc}") from None
        if len(out) != raw:
            raise HTTPError(CANNOT_DECOMPRESS, f"Decompressed size {len(out)} != declared {raw}")
        yield out


def decoded_body(rfile: IO[bytes], headers: Headers, native: bool = False) -> Iterator[bytes]:
    """The request body, decoded: Content-Encoding first, then ``decompress=1`` blocks."""
    body = _http_decoded(rfile, headers)
    return native_blocks(body) if native else body


def _http_decoded(rfile: IO[bytes], headers: Headers) -> Iterator[bytes]:
    dec = _decoder(headers.get("Content-Encoding") or "")
    for chunk in _raw_body(rfile, headers):
        if dec is None:
            yield chunk
            continue
        try:
            out = dec(chunk)
        except Exception as exc:
            raise HTTPError(
                CANNOT_DECOMPRESS, f"Cannot decompress request body ({headers.get('Content-Encoding')}): {exc}"
            ) from None
        if out:
            yield out
