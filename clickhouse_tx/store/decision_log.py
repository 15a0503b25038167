"""The coordinator's decision log in the Spark checkpoint directory, over ``pyarrow.fs``.

Paths (one directory per txn_id, :func:`clickhouse_tx.store.checkpoint_paths.decision_dir`)::

    <root>/clickhouse_tx/<txn_id>/<batch>.v<version>.json   the Decision, write-once
    <root>/clickhouse_tx/<txn_id>/<batch>.done              all chosen xids committed
    <root>/clickhouse_tx/<txn_id>/_compacted/<W>            batches <= W without files are done

Reads cost a bounded number of filesystem calls whatever the number of batches: a
batch's versions are consecutive (1, 2, ...), so :meth:`FileDecisionLog.read` probes
the names it expects and never lists the directory (only :meth:`batches`, for
recovery and verification, and the periodic compaction do).

Every store publishes a version atomically and at most once; the semantics relied on
(:attr:`FileDecisionLog.semantics`):

``posix-link``
    Local filesystem: the file is written and fsynced under a temporary name, then
    hard-linked to its final name (``link`` fails if the name exists, unlike
    ``rename``, which would replace it).
``posix-exclusive-create``
    Local filesystem refusing hard links (some FUSE, SMB and object-store mounts):
    the final name is created with ``O_CREAT | O_EXCL`` and written and fsynced in
    place. Exclusive, but a writer killed mid-write leaves a torn file that
    :meth:`~FileDecisionLog.read` reports (no COMMIT can have followed it).
``hdfs-rename``
    HDFS: a temporary file is renamed to the final name; HDFS's rename refuses an
    existing destination.
``registry-cas``
    Object stores (S3, GCS) and any other store: a PUT is atomic but not exclusive,
    so the version is first claimed by an atomic create-if-absent in a KeeperMap
    table (:class:`~clickhouse_tx.store.decision_arbiter.RegistryArbiter`); only the claim's
    winner PUTs, and the claim holds the whole decision, so a reader finding a claim
    without its file (the winner died between the two) writes the file from it.

Retention: a done batch older than the newest ``retain_batches`` done batches is
deleted (every ``compact_every`` batches, from :meth:`~FileDecisionLog.mark_done`);
the highest deleted batch W is recorded first, and a read of a batch <= W that has
no file answers "done, nothing to commit". Spark replays only batches after the
last one in its commit log, which is among the newest done ones: keep
``retain_batches`` >= 1 (default 100, Spark's ``minBatchesToRetain``).
"""

from __future__ import annotations

import dataclasses
import errno
import logging
import os
import re
import uuid
from typing import Iterable

import pyarrow.fs as pafs

from clickhouse_tx.errors import ConfigurationError, DecisionConflictError, TornDecisionError
from clickhouse_tx.interfaces import Decision
from clickhouse_tx.store import checkpoint_paths
from clickhouse_tx.store.decision_arbiter import Arbiter

log = logging.getLogger(__name__)

_VERSION = re.compile(r"^(?P<batch>\d+)\.v(?P<version>\d+)\.json$")
_DONE = re.compile(r"^(?P<batch>\d+)\.done$")
_COMPACTED_DIR = "_compacted"
_OBJECT_STORES = {"s3", "gcs"}
#: Version names checked per ``get_file_info`` call (replacements are rare: one call).
_PROBE = 4
#: ``link`` errors that mean "this filesystem has no hard links", not "name taken".
_NO_LINKS = {errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK, errno.ENOSYS, errno.EACCES}
DEFAULT_RETAIN_BATCHES = 100
DEFAULT_COMPACT_EVERY = 10


def publication_semantics(fs: pafs.FileSystem) -> str:
    """How a decision version is published exclusively on ``fs``: ``posix-link``,
    ``hdfs-rename`` or ``registry-cas`` (which needs an :class:`Arbiter`; module doc)."""
    if isinstance(fs, pafs.LocalFileSystem):
        return "posix-link"
    if fs.type_name == "hdfs":
        return "hdfs-rename"
    return "registry-cas"


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
    arbiter:
        Atomic create-if-absent for stores without one (object stores); required to
        write there (:func:`clickhouse_tx.factory.build_coordinator` passes a
        :class:`~clickhouse_tx.store.decision_arbiter.RegistryArbiter`). Reading never needs it, except to repair a
        claimed version whose file is missing.
    retain_batches, compact_every:
        Keep the newest ``retain_batches`` done batches; compact when a batch that is
        a multiple of ``compact_every`` is marked done.
    filesystem:
        A ready ``(filesystem, root path)`` instead of opening ``root_uri``.
    """

    def __init__(
        self,
        root_uri: str,
        txn_id: str,
        *,
        arbiter: Arbiter | None = None,
        retain_batches: int = DEFAULT_RETAIN_BATCHES,
        compact_every: int = DEFAULT_COMPACT_EVERY,
        filesystem: tuple[pafs.FileSystem, str] | None = None,
    ) -> None:
        if not txn_id or "/" in txn_id or txn_id in (".", ".."):
            raise ValueError(f"txn_id {txn_id!r} is not a safe directory name")
        if retain_batches < 1 or compact_every < 1:
            raise ConfigurationError(
                f"decision log retain_batches ({retain_batches}) and compact_every ({compact_every}) "
                "must be >= 1: Spark replays the newest batch, whose decision must stay"
            )
        self.root_uri = root_uri
        self.txn_id = txn_id
        self.arbiter = arbiter
        self.retain_batches = retain_batches
        self.compact_every = compact_every
        self._fs, root = filesystem or checkpoint_paths.open_location(root_uri)
        self.directory = checkpoint_paths.decision_dir(root, txn_id)

    def __repr__(self) -> str:
        return f"FileDecisionLog({self.directory!r}, {self.semantics})"

    @property
    def semantics(self) -> str:
        """How a version is published exclusively on this store (see the module doc)."""
        return publication_semantics(self._fs)

    # -- names -------------------------------------------------------------------------
    def _version_path(self, batch: int, version: int) -> str:
        return f"{self.directory}/{batch}.v{version}.json"

    def _done_path(self, batch: int) -> str:
        return f"{self.directory}/{batch}.done"

    def _claim_key(self, batch: int, version: int) -> str:
        return f"decision:{self.txn_id}:{batch}:v{version}"

    def _names(self, directory: str | None = None) -> list[str]:
        infos = self._fs.get_file_info(pafs.FileSelector(directory or self.directory, allow_not_found=True))
        return [i.base_name for i in infos if i.type == pafs.FileType.File]

    def _exists(self, path: str) -> bool:
        return bool(self._fs.get_file_info(path).type != pafs.FileType.NotFound)

    # -- publishing --------------------------------------------------------------------
    def _publish(self, path: str, data: bytes) -> bool:
        """Write ``data`` at ``path`` atomically; False if ``path`` already existed.

        Only for names nobody else writes with other bytes (done markers, watermarks)
        on object stores: decisions go through :meth:`_publish_decision`.
        """
        self._fs.create_dir(path.rsplit("/", 1)[0], recursive=True)
        if isinstance(self._fs, pafs.LocalFileSystem):
            return self._publish_local(path, data)
        if self._exists(path):
            return False
        if self.semantics == "hdfs-rename":
            tmp = f"{path}.tmp-{uuid.uuid4().hex}"
            self._put(tmp, data)
            try:
                self._fs.move(tmp, path)  # HDFS rename fails on an existing destination
            except OSError:
                self._fs.delete_file(tmp)
                if self._exists(path):
                    return False
                raise
            return True
        self._put(path, data)
        return True

    def _put(self, path: str, data: bytes) -> None:
        with self._fs.open_output_stream(path) as out:
            out.write(data)

    def _publish_local(self, path: str, data: bytes) -> bool:
        tmp = f"{path}.tmp-{uuid.uuid4().hex}"
        _write_new(tmp, data)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno not in _NO_LINKS:
                raise
            return self._publish_exclusive(path, data)
        finally:
            os.unlink(tmp)
        _fsync_dir(os.path.dirname(path))  # the new name must survive a machine crash
        return True

    def _publish_exclusive(self, path: str, data: bytes) -> bool:
        """``posix-exclusive-create``: the filesystem refused a hard link."""
        try:
            _write_new(path, data)
        except FileExistsError:
            return False
        _fsync_dir(os.path.dirname(path))
        return True

    def _publish_decision(self, decision: Decision, body: bytes) -> bool:
        path = self._version_path(decision.batch, decision.version)
        if self.semantics != "registry-cas":
            return self._publish(path, body)
        if self.arbiter is None:
            raise ConfigurationError(
                f"the decision log {self.directory} is on {self._fs.type_name!r}, where a write "
                "is not exclusive: it needs an arbiter (build the coordinator with "
                "clickhouse_tx.factory.build_coordinator, which uses the registry's compare-and-set)"
            )
        won = self.arbiter.claim(self._claim_key(decision.batch, decision.version), body)
        if won != body:
            return False
        self._fs.create_dir(self.directory, recursive=True)
        self._put(path, body)  # only the claim's winner writes, and always the claimed bytes
        return True

    # -- DecisionLogIO -----------------------------------------------------------------
    def write(self, decision: Decision) -> None:
        """Publish ``decision`` as its version; raise DecisionConflictError if it exists.

        Driver, once per new decision version (v1 before a batch's first COMMIT).
        Version N > 1 needs version N - 1: reads rely on consecutive versions.
        """
        if decision.txn_id != self.txn_id:
            raise ValueError(f"decision of txn_id {decision.txn_id!r} written to the log of {self.txn_id!r}")
        if decision.version < 1:
            raise ValueError(f"decision version must be >= 1, got {decision.version}")
        b, v = decision.batch, decision.version
        if v > 1 and not self._exists(self._version_path(b, v - 1)):
            raise ValueError(f"decision v{v} of batch {b} written before v{v - 1}")
        if v == 1 and b <= self._watermark():
            raise DecisionConflictError(f"batch {b} is done and compacted in {self.directory}")
        body = dataclasses.replace(decision, done=False).to_bytes()
        if not self._publish_decision(decision, body):
            raise DecisionConflictError(f"decision v{v} of batch {b} already exists in {self.directory}")

    def read(self, batch: int) -> Decision | None:
        """The highest version for ``batch`` (with ``done`` set if marked), or None.

        Driver, at every batch commit and abort. Probes the expected names: one
        ``get_file_info`` call and one open for a batch of up to 3 versions, one more
        call for a batch without any (the compaction watermark), whatever the number
        of batches in the log.
        """
        version, done = self._probe(batch)
        if version == 0:
            if batch <= self._watermark():
                return Decision(txn_id=self.txn_id, batch=batch, chosen=(), version=0, done=True)
            return None
        path = self._version_path(batch, version)
        with self._fs.open_input_stream(path) as f:
            raw = f.read()
        try:
            decision = Decision.from_bytes(raw)
        except (ValueError, KeyError) as exc:
            raise TornDecisionError(
                f"{path} is incomplete ({len(raw)} bytes): its writer died mid-write, before "
                "any COMMIT could follow it; delete the file and restart the query"
            ) from exc
        if decision.txn_id != self.txn_id or decision.batch != batch:
            raise ValueError(f"{path} holds txn_id={decision.txn_id!r} batch={decision.batch}")
        return dataclasses.replace(decision, done=done) if done else decision

    def _probe(self, batch: int) -> tuple[int, bool]:
        """(highest version with a file, done marker present), without listing."""
        done_path = self._done_path(batch)
        version, done, start = 0, False, 1
        while True:
            paths = [self._version_path(batch, v) for v in range(start, start + _PROBE)]
            infos = self._fs.get_file_info(paths + ([done_path] if start == 1 else []))
            if start == 1:
                done = infos.pop().type != pafs.FileType.NotFound
            found = [v for v, i in zip(range(start, start + _PROBE), infos) if i.type != pafs.FileType.NotFound]
            version = max(found, default=version)
            if len(found) < _PROBE:
                break
            start += _PROBE
        if self.arbiter is not None and self.semantics == "registry-cas" and not done:
            version = self._repair(batch, version)
        return version, done

    def _repair(self, batch: int, version: int) -> int:
        """Write files of claimed versions whose winner died before its PUT."""
        assert self.arbiter is not None  # called only with an arbiter (registry-cas)
        while (body := self.arbiter.get(self._claim_key(batch, version + 1))) is not None:
            version += 1
            self._fs.create_dir(self.directory, recursive=True)
            self._put(self._version_path(batch, version), body)
        return version

    def mark_done(self, batch: int) -> None:
        """Idempotent: marking a done batch again is a no-op.

        Driver, once per batch after its last COMMIT; every ``compact_every`` batches
        it also compacts the log (:meth:`compact`).
        """
        self._publish(self._done_path(batch), b"done\n")
        if batch % self.compact_every == 0:
            try:
                self.compact()
            except Exception as exc:  # housekeeping never fails a commit
                log.warning("compaction of %s failed (the next one retries): %s", self.directory, exc)

    def batches(self) -> Iterable[int]:
        """Batch ids with at least one decision version file, ascending (lists the directory)."""
        return sorted({int(m["batch"]) for n in self._names() if (m := _VERSION.match(n))})

    # -- retention ---------------------------------------------------------------------
    def _watermark(self) -> int:
        """Highest compacted batch (-1: none); one listing of a directory of 1-2 files."""
        names = self._names(f"{self.directory}/{_COMPACTED_DIR}")
        return max((int(n) for n in names if n.isdigit()), default=-1)

    def compact(self) -> list[int]:
        """Delete the done batches older than the newest ``retain_batches`` done ones.

        Never deletes a batch that is not done. Records the highest deleted batch
        before deleting anything, so a crash mid-way leaves files that reads still
        find and the next compaction deletes. Returns the deleted batches.
        """
        names = self._names()
        done = sorted({int(m["batch"]) for n in names if (m := _DONE.match(n))}, reverse=True)
        drop = set(done[self.retain_batches :])
        if not drop:
            return []
        mark = max(drop)
        self._publish(f"{self.directory}/{_COMPACTED_DIR}/{mark}", b"")
        keys = []
        for n in names:
            m = _VERSION.match(n) or _DONE.match(n)
            if m and int(m["batch"]) in drop:
                if "version" in m.groupdict():
                    keys.append(self._claim_key(int(m["batch"]), int(m["version"])))
                self._fs.delete_file(f"{self.directory}/{n}")
        if self.arbiter is not None and keys:
            self.arbiter.forget(keys)
        for n in self._names(f"{self.directory}/{_COMPACTED_DIR}"):
            if n.isdigit() and int(n) < mark:  # never the highest: marks only grow
                self._fs.delete_file(f"{self.directory}/{_COMPACTED_DIR}/{n}")
        return sorted(drop)


def txn_ids_with_decisions(root_uri: str) -> list[str]:
    """The transactional ids with at least one decision under ``root_uri`` (sorted).

    Driver (a streaming query's first use of its checkpoint, looking for logs of an
    earlier id) and operator side (``recover``/``gc``/``verify`` given a checkpoint):
    once per call, one listing of ``<root>/clickhouse_tx`` and one per log found.
    """
    fs, root = checkpoint_paths.open_location(root_uri)
    return [
        t
        for t in checkpoint_paths.txn_dirs(fs, root)
        if list(FileDecisionLog(root_uri, t, filesystem=(fs, root)).batches())
    ]


def _write_new(path: str, data: bytes) -> None:
    """Create ``path`` exclusively, write ``data`` and fsync (FileExistsError if taken)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: str) -> None:
    dfd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
