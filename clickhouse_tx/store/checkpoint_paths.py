"""Where clickhouse-tx keeps its files below a checkpoint location, and how it opens one.

Every file the library writes beside a query lives in one subdirectory of the root
it is given (a streaming query's ``checkpointLocation``, or an explicit
``decision_log``), never among Spark's own files::

    <root>/clickhouse_tx/query.json          the streaming query's transactional id
    <root>/clickhouse_tx/<txn_id>/...         one decision log per transactional id
    <root>/clickhouse_tx/metrics.jsonl        one JSON line per finished batch

This module is the only place that spells those names and the only opener of a
location with ``pyarrow.fs`` (:func:`open_location`); the decision log, the query
identity, the metrics, the verifier and the operator commands all go through it.
Pure path arithmetic except :func:`open_location` and :func:`txn_dirs`.
"""

from __future__ import annotations

import os
from typing import cast

import pyarrow.fs as pafs

__all__ = [
    "SUBDIR",
    "QUERY_RECORD",
    "METRICS_FILE",
    "open_location",
    "library_dir",
    "decision_dir",
    "query_record_path",
    "metrics_path",
    "txn_dirs",
]

#: The library's subdirectory of a checkpoint location or decision log root.
SUBDIR = "clickhouse_tx"
#: The streaming query's id record, in :data:`SUBDIR`.
QUERY_RECORD = "query.json"
#: Per-batch metrics, in :data:`SUBDIR` (per-object stores add a suffix per batch).
METRICS_FILE = "metrics.jsonl"


def open_location(uri: str) -> tuple[pafs.FileSystem, str]:
    """The filesystem and root path of a location: a local path or any ``pyarrow.fs`` URI.

    A path without a scheme is local and made absolute against the working directory;
    ``file://``, ``hdfs://``, ``s3://``, ``gs://`` go to ``pyarrow.fs.FileSystem.from_uri``.
    Runs wherever a location is read or written (driver, operator commands); cheap for
    local paths, one client construction for remote ones.
    """
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    fs, path = pafs.FileSystem.from_uri(uri)
    return cast(pafs.FileSystem, fs), str(path)


def library_dir(root: str) -> str:
    """``<root>/clickhouse_tx``: everything of the library below ``root`` (an opened path)."""
    return f"{root.rstrip('/')}/{SUBDIR}"


def decision_dir(root: str, txn_id: str) -> str:
    """``<root>/clickhouse_tx/<txn_id>``: the decision log of one transactional id."""
    return f"{library_dir(root)}/{txn_id}"


def query_record_path(root: str) -> str:
    """``<root>/clickhouse_tx/query.json``: the streaming query's stored transactional id."""
    return f"{library_dir(root)}/{QUERY_RECORD}"


def metrics_path(root: str) -> str:
    """``<root>/clickhouse_tx/metrics.jsonl``: the batch metrics beside the decision logs."""
    return f"{library_dir(root)}/{METRICS_FILE}"


def txn_dirs(fs: pafs.FileSystem, root: str) -> list[str]:
    """Names of the subdirectories of ``<root>/clickhouse_tx`` (sorted; one listing).

    Every subdirectory is a transactional id's decision log (possibly empty); files
    beside them (the query record, metrics) are not listed.
    """
    infos = fs.get_file_info(pafs.FileSelector(library_dir(root), allow_not_found=True))
    return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)
