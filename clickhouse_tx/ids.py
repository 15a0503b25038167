"""Transaction ids (xids) and the default txn_id of a query.

An xid is unique per partition *attempt* and readable::

    {txn}-b{batch}-p{partition}-a{attempt}-{8 hex random}

It only holds ``[A-Za-z0-9_-]``, so it is safe as an HTTP ``session_id``, in a file
name and inside a backtick-quoted table name (e.g. a staging table named from it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import secrets

from clickhouse_tx.errors import ConfigurationError

#: Longest sanitised txn part kept verbatim; longer ones are cut and given a hash suffix.
MAX_TXN_PART = 40
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")
_XID = re.compile(r"^(?P<txn>[A-Za-z0-9_]+)-b(?P<batch>\d+)-p(?P<partition>\d+)"
                  r"-a(?P<attempt>\d+)-(?P<rand>[0-9a-f]{8})$")


def _short_hash(text: str, n: int = 8) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:n]


def sanitize_txn(txn_id: str) -> str:
    """Map ``txn_id`` to ``[A-Za-z0-9_]{1,40}``.

    Changed or cut names get a hash of the original appended, so two different
    txn_ids that sanitise alike still give different xid prefixes.
    """
    if not txn_id:
        raise ConfigurationError("txn_id must be a non-empty string")
    clean = _UNSAFE.sub("_", txn_id)
    if clean == txn_id and len(clean) <= MAX_TXN_PART:
        return clean
    h = _short_hash(txn_id)
    return f"{clean[:MAX_TXN_PART - len(h) - 1]}_{h}"


def new_xid(txn_id: str, batch: int, partition: int, attempt: int) -> str:
    """A fresh xid for one attempt of one partition of one batch (executor, per attempt)."""
    for name, v in (("batch", batch), ("partition", partition), ("attempt", attempt)):
        if not isinstance(v, int) or v < 0:
            raise ValueError(f"{name} must be a non-negative int, got {v!r}")
    return f"{sanitize_txn(txn_id)}-b{batch}-p{partition}-a{attempt}-{secrets.token_hex(4)}"


@dataclasses.dataclass(frozen=True)
class XidParts:
    """The fields an xid encodes."""

    txn: str
    batch: int
    partition: int
    attempt: int
    rand: str


def parse_xid(xid: str) -> XidParts:
    """Split an xid made by :func:`new_xid`; raise ``ValueError`` naming it otherwise."""
    m = _XID.match(xid)
    if not m:
        raise ValueError(f"not a clickhouse_tx xid: {xid!r}")
    return XidParts(m["txn"], int(m["batch"]), int(m["partition"]), int(m["attempt"]), m["rand"])


def default_txn_id(query_name: str | None, checkpoint_location: str | None) -> str:
    """The txn_id of a streaming query: ``<queryName>-<hash>`` or ``chk-<hash>``.

    Runs on the driver when options are parsed. The hash is of the checkpoint location,
    which is stable across restarts of the same query; it keeps a query restarted from
    scratch (same name, new checkpoint, batch ids from 0 again) from meeting its
    predecessor's decisions and markers.
    """
    if not checkpoint_location:
        raise ConfigurationError(
            "cannot derive txn_id: set option 'checkpointLocation' (or 'transactional_id')")
    h = _short_hash(checkpoint_location, 16)
    if query_name:
        name = re.sub(r"[^A-Za-z0-9_.\-]", "_", query_name)[:96] or "q"
        return f"{name}-{h}"
    return f"chk-{h}"
