"""Transaction ids (xids) and the default txn_id of a query.

An xid is unique per partition *attempt* and readable::

    {txn}-b{batch}-p{partition}-a{attempt}-{8 hex random}

It only holds ``[A-Za-z0-9_-]``, so it is safe as an HTTP ``session_id``, in a file
name and inside a backtick-quoted table name (e.g. a staging table named from it).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
import re
import secrets
import uuid

from clickhouse_tx.errors import ConfigurationError

#: Longest sanitised txn part kept verbatim; longer ones are cut and given a hash suffix.
MAX_TXN_PART = 40
_UNSAFE = re.compile(r"[^A-Za-z0-9_]")
_XID = re.compile(
    r"^(?P<txn>[A-Za-z0-9_]+)-b(?P<batch>\d+)-p(?P<partition>\d+)"
    r"-a(?P<attempt>\d+)-(?P<rand>[0-9a-f]{8})$"
)


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
    return f"{clean[: MAX_TXN_PART - len(h) - 1]}_{h}"


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


#: Prefix of the registry key Spark's abort writes for one run's batch (:func:`run_fence_key`).
RUN_FENCE_PREFIX = "abort-fence/"


def run_fence_key(txn_id: str, batch: int, run: str) -> str:
    """The registry key that Spark's abort of ``batch`` in ``run`` writes, ABORTED, before it
    lists the batch: an attempt of that run that reads it after writing rolls itself back.
    Keyed by run, so a restarted query's replay of the batch is not fenced."""
    return f"{RUN_FENCE_PREFIX}{sanitize_txn(txn_id)}/{batch}/{run}"


def is_run_fence(key: str) -> bool:
    """True for a key made by :func:`run_fence_key` (never an xid)."""
    return key.startswith(RUN_FENCE_PREFIX)


def txn_id_for_spark_query(spark_query_id: str) -> str:
    """The default txn_id of a streaming query: ``q_<Spark's query id, hex>``.

    Spark keeps the query id in ``<checkpointLocation>/metadata`` for the checkpoint's
    whole life, so the id is the same on every restart, whatever the spelling of the
    location or the query name, and new when the checkpoint is started afresh (batch
    ids from 0 again must not meet the old decisions). Only ``[A-Za-z0-9_]``, 34
    characters: xids carry it verbatim.
    """
    try:
        return "q_" + uuid.UUID(spark_query_id.strip()).hex
    except (ValueError, AttributeError):
        raise ConfigurationError(f"Spark's query id {spark_query_id!r} (checkpoint metadata) is not a UUID") from None


_SCHEME = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]+):(?P<rest>.*)$", re.S)
# Hadoop's S3 connectors name the same objects as pyarrow's s3://.
_SCHEME_ALIASES = {"s3a": "s3", "s3n": "s3"}


def canonical_location(raw: str, cwd: str) -> str:
    """One spelling of a checkpoint location, for ``pyarrow.fs``; pure.

    A local path (or ``file:/p``, ``file:///p``, ``file://localhost/p``) becomes an
    absolute, normalised path (relative ones are joined to ``cwd``: the driver's Python
    worker runs in the JVM's working directory, against which Spark resolves them).
    Other URIs keep scheme and authority with a normalised path (``s3a``/``s3n``
    become ``s3``). Trailing and doubled slashes and ``.`` segments go.

    Raises
    ------
    ConfigurationError
        An empty location, a relative ``file:`` URI, or ``file://`` naming a host.
    """
    text = raw.strip()
    if not text:
        raise ConfigurationError("option checkpointLocation is empty")
    m = _SCHEME.match(text)
    if m is None:
        return _normal_path(posixpath.join(cwd, text))
    scheme, rest = m["scheme"].lower(), m["rest"]
    authority = ""
    if rest.startswith("//"):
        authority, _, path = rest[2:].partition("/")
        path = "/" + path
    else:
        path = rest
    if scheme == "file":
        if authority not in ("", "localhost") or not path.startswith("/"):
            raise ConfigurationError(
                f"option checkpointLocation={raw!r}: a file: URI must be absolute and local "
                "(file:///path or file:/path)"
            )
        return _normal_path(path)
    return f"{_SCHEME_ALIASES.get(scheme, scheme)}://{authority}{_normal_path(path)}"


def _normal_path(path: str) -> str:
    # normpath keeps a leading '//' (POSIX leaves it implementation-defined); Hadoop does not.
    return "/" + posixpath.normpath("/" + path).lstrip("/")


@dataclasses.dataclass(frozen=True)
class StoredQueryId:
    """The id record kept in ``<checkpointLocation>/clickhouse_tx/query.json``."""

    transactional_id: str
    spark_query_id: str

    def to_json(self) -> bytes:
        return json.dumps(
            {"transactional_id": self.transactional_id, "spark_query_id": self.spark_query_id}, sort_keys=True
        ).encode()

    @classmethod
    def from_json(cls, data: bytes, where: str) -> "StoredQueryId":
        try:
            doc = json.loads(data)
            return cls(str(doc["transactional_id"]), str(doc["spark_query_id"]))
        except (ValueError, KeyError, TypeError):
            raise ConfigurationError(
                f"{where} is not a clickhouse_tx query id record (expected JSON with "
                "transactional_id and spark_query_id); restore it from a backup, or remove it "
                "together with the checkpoint to start the query afresh"
            ) from None


@dataclasses.dataclass(frozen=True)
class IdChoice:
    """What :func:`choose_stream_txn_id` decided: the id, whether to store it, and why."""

    txn_id: str
    store: bool
    reason: str


def choose_stream_txn_id(
    *,
    explicit: str | None,
    stored: StoredQueryId | None,
    spark_query_id: str,
    where: str,
) -> IdChoice:
    """The transactional id of a streaming query, from what its checkpoint holds; pure.

    Runs on the driver each time the stream writer is built (query start and every
    commit). In order: the stored id wins (an explicit id must equal it); else an
    explicit id; else the id derives from Spark's query id. Anything else is refused
    rather than guessed.

    Parameters
    ----------
    explicit
        The ``transactional_id`` option, or None.
    stored
        The record in the checkpoint, or None on first use.
    spark_query_id
        The ``id`` of ``<checkpointLocation>/metadata``.
    where
        The checkpoint location, for messages.

    Raises
    ------
    ConfigurationError
        The checkpoint's Spark query id changed since the id was stored, or an explicit
        id differs from the stored one.
    """
    if stored is not None:
        if stored.spark_query_id != spark_query_id:
            raise ConfigurationError(
                f"checkpoint {where}: Spark's query id is {spark_query_id} but clickhouse_tx "
                f"stored {stored.spark_query_id} with transactional_id {stored.transactional_id!r}. "
                "Spark's metadata was recreated while clickhouse_tx/ was kept, so batch ids "
                "restart at 0 and would meet old decisions (rows silently skipped). Use a new "
                "checkpointLocation, or delete the whole checkpoint directory"
            )
        if explicit and explicit != stored.transactional_id:
            raise ConfigurationError(
                f"option transactional_id={explicit!r} differs from {stored.transactional_id!r}, "
                f"the id this query's checkpoint {where} was written under. Changing it would "
                "re-write batches committed under the old id. Remove the option (or set it to "
                f"{stored.transactional_id!r}); a different id needs a new checkpointLocation"
            )
        return IdChoice(stored.transactional_id, False, "stored in the checkpoint")
    if explicit:
        return IdChoice(explicit, True, "the transactional_id option")
    return IdChoice(txn_id_for_spark_query(spark_query_id), True, "derived from Spark's query id")
