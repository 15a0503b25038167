"""The coordinator's decision log in the Spark checkpoint directory, over ``pyarrow.fs``.

Layout (one directory per txn_id)::

    <root>/clickhouse_tx/<txn_id>/<batch>.v<version>.json   the Decision, write-once
    <root>/clickhouse_tx/<txn_id>/<batch>.done              all chosen xids committed

A version is published atomically and at most once: on a local filesystem the
file is written and fsynced under a temporary name, then hard-linked to its final
name (``link`` fails if the name exists, unlike ``rename``, which would replace it);
on object stores (S3, GCS), where a PUT is atomic and there is no rename, the final
name is written directly after an existence check; elsewhere (HDFS) a temporary
file is moved to the final name after the same check.
"""

from __future__ import annotations

import dataclasses
import os
import re
import uuid
from typing import Iterable

import pyarrow.fs as pafs

from clickhouse_tx.errors import DecisionConflictError
from clickhouse_tx.interfaces import Decision

_VERSION = re.compile(r"^(?P<batch>\d+)\.v(?P<version>\d+)\.json$")
_DONE = re.compile(r"^(?P<batch>\d+)\.done$")
_OBJECT_STORES = {"s3", "gcs"}


def _filesystem(root_uri: str) -> tuple[pafs.FileSystem, str]:
    if "://" not in root_uri:
        return pafs.LocalFileSystem(), os.path.abspath(root_uri)
    return pafs.FileSystem.from_uri(root_uri)


class FileDecisionLog:
    """:class:`~clickhouse_tx.interfaces.DecisionLogIO` for one txn_id under ``root_uri``.

    Runs on the driver, in every (fresh) writer's ``commit``/``abort``; holds no
    state beyond the filesystem handle, so every call sees what earlier drivers wrote.

    Parameters
    ----------
    root_uri:
        The query's ``checkpointLocation``: a local path, ``file://``, ``hdfs://``,
        ``s3://``... (anything ``pyarrow.fs.FileSystem.from_uri`` opens).
    txn_id:
        Names the subdirectory; must be a safe name (see :func:`clickhouse_tx.ids.sanitize_txn`).
    """

    def __init__(self, root_uri: str, txn_id: str) -> None:
        if not txn_id or "/" in txn_id or txn_id in (".", ".."):
            raise ValueError(f"txn_id {txn_id!r} is not a safe directory name")
        self.root_uri = root_uri
        self.txn_id = txn_id
        self._fs, root = _filesystem(root_uri)
        self.directory = f"{root.rstrip('/')}/clickhouse_tx/{txn_id}"

    def __repr__(self) -> str:
        return f"FileDecisionLog({self.directory!r})"

    # -- names -------------------------------------------------------------------------
    def _version_path(self, batch: int, version: int) -> str:
        return f"{self.directory}/{batch}.v{version}.json"

    def _done_path(self, batch: int) -> str:
        return f"{self.directory}/{batch}.done"

    def _names(self) -> list[str]:
        infos = self._fs.get_file_info(pafs.FileSelector(self.directory, allow_not_found=True))
        return [i.base_name for i in infos if i.type == pafs.FileType.File]

    def _exists(self, path: str) -> bool:
        return self._fs.get_file_info(path).type != pafs.FileType.NotFound

    # -- publishing --------------------------------------------------------------------
    def _publish(self, path: str, data: bytes) -> bool:
        """Write ``data`` at ``path`` atomically; False if ``path`` already existed."""
        self._fs.create_dir(self.directory, recursive=True)
        if isinstance(self._fs, pafs.LocalFileSystem):
            return self._publish_local(path, data)
        if self._exists(path):
            return False
        if self._fs.type_name in _OBJECT_STORES:
            with self._fs.open_output_stream(path) as out:
                out.write(data)
            return True
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        with self._fs.open_output_stream(tmp) as out:
            out.write(data)
        self._fs.move(tmp, path)
        return True

    def _publish_local(self, path: str, data: bytes) -> bool:
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        dfd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(dfd)  # the new name must survive a machine crash, not only the bytes
        finally:
            os.close(dfd)
        return True

    # -- DecisionLogIO -----------------------------------------------------------------
    def write(self, decision: Decision) -> None:
        """Publish ``decision`` as its version; raise DecisionConflictError if it exists."""
        if decision.txn_id != self.txn_id:
            raise ValueError(f"decision of txn_id {decision.txn_id!r} written to the log of {self.txn_id!r}")
        if decision.version < 1:
            raise ValueError(f"decision version must be >= 1, got {decision.version}")
        body = dataclasses.replace(decision, done=False).to_bytes()
        if not self._publish(self._version_path(decision.batch, decision.version), body):
            raise DecisionConflictError(
                f"decision v{decision.version} of batch {decision.batch} already exists in {self.directory}")

    def read(self, batch: int) -> Decision | None:
        """The highest version for ``batch`` (with ``done`` set if marked), or None."""
        versions = [int(m["version"]) for n in self._names()
                    if (m := _VERSION.match(n)) and int(m["batch"]) == batch]
        if not versions:
            return None
        path = self._version_path(batch, max(versions))
        with self._fs.open_input_stream(path) as f:
            decision = Decision.from_bytes(f.read())
        if decision.txn_id != self.txn_id or decision.batch != batch:
            raise ValueError(f"{path} holds txn_id={decision.txn_id!r} batch={decision.batch}")
        if self._exists(self._done_path(batch)):
            decision = dataclasses.replace(decision, done=True)
        return decision

    def mark_done(self, batch: int) -> None:
        """Idempotent: marking a done batch again is a no-op."""
        self._publish(self._done_path(batch), b"done\n")

    def batches(self) -> Iterable[int]:
        """Batch ids with at least one decision version, ascending."""
        return sorted({int(m["batch"]) for n in self._names() if (m := _VERSION.match(n))})
