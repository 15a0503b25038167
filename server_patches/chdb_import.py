"""Import chdb without the throwaway engine its package import starts.

``import chdb`` opens an in-memory engine to read its version and closes it again
(``chdb/__init__.py``). Closing an engine shuts down ClickHouse's process-wide
``StreamingStorageRegistry``, and a registry once shut down refuses every later
registration: every streaming table (Kafka, RabbitMQ, S3Queue, ...) of the engine
the server opens afterwards in that process fails its startup with
``Shutdown was called. (LOGICAL_ERROR)``. Its ``CREATE TABLE`` then answers that
error although the table was made, and an engine whose data holds such a table
cannot start at all (``Error initializing EmbeddedServer``).

:func:`load` imports the package with that one version probe answered without an
engine, so the server's engine is the first and only one of its process. Called
once per process, by :mod:`server_patches.engine` at import.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

_RTLD_DEEPBIND = 0x8
#: What chdb's package import asks its probe engine, and how it reads the answer.
_PROBE_SQL = "SELECT version();"


class _Result:
    def bytes(self) -> bytes:
        return b'"unknown"\n'  # chdb.engine_version; the server reads SELECT version() itself


class _Probe:
    """Stands in for the probe connection: answers the version query, holds no engine."""

    def query(self, sql: str, fmt: str = "CSV", **_: Any) -> _Result:
        if sql != _PROBE_SQL:
            raise RuntimeError(f"chdb's import probe asked {sql!r}, not {_PROBE_SQL!r} (server_patches.chdb_import)")
        return _Result()

    def close(self) -> None:
        pass


class _ExtensionWithoutProbe(ModuleType):
    """chdb's extension module, except that its first argument-less ``connect()`` (the
    package import's probe) opens no engine. Everything else goes to the extension."""

    def __init__(self, real: ModuleType) -> None:
        super().__init__(real.__name__, real.__doc__)
        self._real = real
        self._probed = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def connect(self, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs and not self._probed:
            self._probed = True
            return _Probe()
        return self._real.connect(*args, **kwargs)


def load() -> ModuleType:
    """The ``chdb`` package, imported without starting and closing an engine.

    When chdb was imported already (by another module of this process), that import
    stands and is returned as it is.
    """
    if "chdb" in sys.modules:
        return sys.modules["chdb"]
    spec = importlib.util.find_spec("chdb")
    if spec is None or spec.origin is None:
        raise ImportError("the embedded server needs chdb: pip install 'clickhouse-tx[devstack]'")
    pkg_dir = os.path.dirname(spec.origin)
    so = os.path.join(pkg_dir, "_chdb.abi3.so")
    cwd = os.getcwd()
    os.chdir(pkg_dir)  # as chdb's own import: the extension finds its helper libraries here
    try:
        ctypes.CDLL(so, mode=sys.getdlopenflags() | _RTLD_DEEPBIND)
        ext_spec = importlib.util.spec_from_file_location("chdb._chdb", so)
        if ext_spec is None or ext_spec.loader is None:
            raise ImportError(f"cannot load chdb's extension {so}")
        real = importlib.util.module_from_spec(ext_spec)
        ext_spec.loader.exec_module(real)
    finally:
        os.chdir(cwd)
    sys.modules["chdb._chdb"] = _ExtensionWithoutProbe(real)
    import chdb

    return chdb
