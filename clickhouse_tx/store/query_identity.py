"""A streaming query's transactional id, kept in its checkpoint (I/O over ``pyarrow.fs``).

Runs on the driver each time the stream writer is built: at query start, before any
task writes, and again before every micro-batch commit. It reads Spark's
``<checkpointLocation>/metadata`` (``{"id": ...}``, written by Spark when the query is
created, before the writer is first built) and this library's record
``<checkpointLocation>/clickhouse_tx/query.json``; the choice itself is the pure
:func:`clickhouse_tx.ids.choose_stream_txn_id`. The record is written once, on first
use, and read back so that a concurrent first writer's record wins over ours.
"""

from __future__ import annotations

import json
import logging
import uuid

import pyarrow.fs as pafs

from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.ids import StoredQueryId, choose_stream_txn_id
from clickhouse_tx.store import checkpoint_paths

log = logging.getLogger(__name__)


def _read(fs: pafs.FileSystem, path: str) -> bytes | None:
    if fs.get_file_info(path).type != pafs.FileType.File:
        return None
    with fs.open_input_stream(path) as f:
        data: bytes = f.read()
        return data


def spark_query_id(checkpoint: str) -> str:
    """The ``id`` in Spark's ``<checkpoint>/metadata``.

    Raises
    ------
    ConfigurationError
        No metadata there: the location as seen from Python is not the one Spark uses
        (a relative path resolved against another working directory, a path Spark puts
        on its default filesystem, e.g. HDFS), or the file is not Spark's.
    """
    fs, root = checkpoint_paths.open_location(checkpoint)
    path = f"{root.rstrip('/')}/metadata"
    data = _read(fs, path)
    if data is None:
        raise ConfigurationError(
            f"Spark's query metadata is not at {checkpoint}/metadata (option checkpointLocation, "
            "as Python resolves it). Give checkpointLocation as an absolute URI that Spark and "
            "pyarrow read alike (file:///..., hdfs://namenode/..., s3://...)"
        )
    try:
        return str(json.loads(data.decode("utf-8").splitlines()[0])["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise ConfigurationError(f'{path} is not Spark\'s query metadata ({{"id": ...}})') from None


def stored_txn_id(checkpoint: str) -> str | None:
    """The transactional id stored in ``<checkpoint>/clickhouse_tx/query.json``, if any.

    Operator side, once per ``gc --not-running`` call on a checkpoint without decision
    logs: a streaming query writes this record when it starts, before its first batch.
    """
    fs, root = checkpoint_paths.open_location(checkpoint)
    path = checkpoint_paths.query_record_path(root)
    data = _read(fs, path)
    return None if data is None else StoredQueryId.from_json(data, path).transactional_id


def _store(fs: pafs.FileSystem, path: str, record: StoredQueryId) -> StoredQueryId:
    """Write ``record`` unless one exists; return the record the file holds afterwards."""
    fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
    if _read(fs, path) is None:
        if fs.type_name in ("s3", "gcs"):  # a PUT is atomic; there is no rename
            with fs.open_output_stream(path) as out:
                out.write(record.to_json())
        else:
            tmp = f"{path}.tmp-{uuid.uuid4().hex}"
            with fs.open_output_stream(tmp) as out:
                out.write(record.to_json())
            fs.move(tmp, path)
    data = _read(fs, path)
    return record if data is None else StoredQueryId.from_json(data, path)


def resolve_stream_txn_id(*, checkpoint: str, explicit: str | None) -> str:
    """The query's transactional id; stored in the checkpoint on first use.

    Parameters
    ----------
    checkpoint
        The canonical checkpoint location (:func:`clickhouse_tx.ids.canonical_location`).
    explicit
        The ``transactional_id`` option, or None.

    Raises
    ------
    ConfigurationError
        See :func:`spark_query_id` and :func:`clickhouse_tx.ids.choose_stream_txn_id`.
    """
    query_id = spark_query_id(checkpoint)
    fs, root = checkpoint_paths.open_location(checkpoint)
    path = checkpoint_paths.query_record_path(root)
    data = _read(fs, path)
    stored = None if data is None else StoredQueryId.from_json(data, path)
    choice = choose_stream_txn_id(explicit=explicit, stored=stored, spark_query_id=query_id, where=checkpoint)
    if not choice.store:
        return choice.txn_id
    kept = _store(fs, path, StoredQueryId(choice.txn_id, query_id))
    # A concurrent first use stored another record: apply the same rules to it.
    txn_id = choose_stream_txn_id(explicit=explicit, stored=kept, spark_query_id=query_id, where=checkpoint).txn_id
    log.info(
        "clickhouse_tx: checkpoint %s: transactional_id %r (%s), stored in %s", checkpoint, txn_id, choice.reason, path
    )
    return txn_id
