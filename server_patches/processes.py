"""Start, watch and stop the background processes of the embedded stack.

Every process is started in its own session (``start_new_session=True``) so that a
crash of the launcher (a CLI call, a pytest run) does not take the servers with it,
and so that stopping it can signal its whole process group. A pid alone can be
reused by the kernel after the process dies; a :class:`ProcessRef` also records the
process start time, so a stale pid from ``stack.json`` is never mistaken for (or
signalled as) the process we started.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any, Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class ProcessRef:
    """A process we started: its pid and its start time (clock ticks since boot)."""

    pid: int
    start_ticks: int

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "start_ticks": self.start_ticks}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "ProcessRef":
        return cls(pid=int(d["pid"]), start_ticks=int(d["start_ticks"]))


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of ``/proc/<pid>/stat`` after the command name, or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    # The command name is in parentheses and may itself contain spaces or ")".
    return raw[raw.rindex(")") + 2 :].split()


def start_ticks_of(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None if it does not exist."""
    fields = _stat_fields(pid)
    if fields is None:
        return None
    return int(fields[19])  # field 22 of stat; fields[0] is field 3 (state)


def _reap(pid: int) -> None:
    """Collect the exit status if ``pid`` is our child, so it does not stay a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    except OSError as e:  # pragma: no cover - defensive
        if e.errno != errno.ECHILD:
            raise


def is_alive(ref: ProcessRef | None) -> bool:
    """True while the process we started (same pid *and* start time) is running.

    A zombie (exited, not yet reaped) counts as dead.
    """
    if ref is None:
        return False
    _reap(ref.pid)
    fields = _stat_fields(ref.pid)
    if fields is None:
        return False
    if fields[0] in ("Z", "X"):
        return False
    return int(fields[19]) == ref.start_ticks


def spawn(
    argv: Sequence[str], *, log_file: Path, env: Mapping[str, str] | None = None, cwd: Path | None = None
) -> ProcessRef:
    """Start ``argv`` in a new session with stdout and stderr appended to ``log_file``.

    Raises
    ------
    FileNotFoundError
        If the program does not exist (the caller turns this into a clear message).
    """
    log_file.parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "ab") as out:
        proc = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=dict(env) if env is not None else None,
            cwd=str(cwd) if cwd else None,
            start_new_session=True,
            close_fds=True,
        )
    ticks = start_ticks_of(proc.pid)
    if ticks is None:
        # Exited before we could look: keep a ref that is_alive() reports dead.
        proc.wait()
        ticks = -1
    # Keep the Popen object from warning "still running" at interpreter exit; the
    # process outlives us on purpose and is reaped by is_alive()/stop().
    proc.returncode = 0
    return ProcessRef(proc.pid, ticks)


def _signal_group(ref: ProcessRef, sig: int) -> None:
    """Send ``sig`` to the process group we created for ``ref`` (or to it alone)."""
    if not is_alive(ref):
        return
    try:
        if os.getpgid(ref.pid) == ref.pid:
            os.killpg(ref.pid, sig)
        else:
            os.kill(ref.pid, sig)
    except ProcessLookupError:
        pass


def wait_gone(ref: ProcessRef, timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for the process to exit; True if it is gone."""
    deadline = time.monotonic() + timeout_s
    while True:
        if not is_alive(ref):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def stop(ref: ProcessRef | None, timeout_s: float = 15.0) -> None:
    """SIGTERM the process group, wait up to ``timeout_s``, then SIGKILL and wait."""
    if ref is None or not is_alive(ref):
        return
    _signal_group(ref, signal.SIGTERM)
    if wait_gone(ref, timeout_s):
        return
    kill(ref)


def kill(ref: ProcessRef | None, timeout_s: float = 10.0) -> None:
    """SIGKILL the process group and wait until the process is gone (a crash)."""
    if ref is None or not is_alive(ref):
        return
    _signal_group(ref, signal.SIGKILL)
    if not wait_gone(ref, timeout_s):
        raise RuntimeError(f"process {ref.pid} survived SIGKILL for {timeout_s} s")


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the kernel's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """True if ``port`` can be bound on ``host`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


def log_tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file, or a note that it is empty/missing."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return f"(no log file {path})"
    text = data[-64 * 1024 :].decode("utf-8", "replace")
    tail = "\n".join(text.splitlines()[-lines:])
    return tail if tail.strip() else f"(log file {path} is empty)"
