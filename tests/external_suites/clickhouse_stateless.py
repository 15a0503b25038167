"""Run ClickHouse's own stateless tests of transactions against a server's HTTP interface.

Usage::

    python -m tests.external_suites.clickhouse_stateless CLICKHOUSE_CHECKOUT --url http://127.0.0.1:8123 \\
        [--pattern transaction --pattern txn ...] [--user U --password-env VAR] [--json FILE]

``CLICKHOUSE_CHECKOUT`` is a checkout of ClickHouse/ClickHouse; its
``tests/queries/0_stateless`` files whose names contain a pattern (default:
``transaction``, ``txn``, ``hermitage``, ``mvcc``) are run, each in a fresh database,
and their output compared byte for byte with the ``.reference`` file, as
``clickhouse-test`` does:

- ``.sql``: statement by statement in one HTTP session (clickhouse-client's one
  connection), see :mod:`tests.external_suites.sql_script`. A statement whose hint
  expects a server error must fail with one of its codes; the first unexpected error
  ends the test. A statement with a ``clientError`` hint fails in clickhouse-client
  itself (an INSERT whose VALUES the client parses) and the server sees that INSERT
  fail; over HTTP the server parses the data, so any error is accepted for it.
- ``.sh``: run by bash with its own ``*.lib`` files and ClickHouse's test variables
  (``CLICKHOUSE_URL``, ``CLICKHOUSE_CURL``, ...); ``$CLICKHOUSE_CLIENT`` is
  :mod:`tests.external_suites.client_shim`, which serves ``-q`` over HTTP.

A test is *not runnable* when it needs what an HTTP endpoint cannot give: the native
protocol (clickhouse-client options beyond ``-q``, ``clickhouse-local``, the TCP port)
or a ``cluster()``/``remote()`` of ClickHouse's test clusters. Such a test is listed
with its reason; a ``.sql`` test that fails first on a ``cluster()`` statement is
listed with that statement and whether all output before it matched.

Nothing of the checkout is copied into this repository or changed.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import uuid
from pathlib import Path

from tests.external_suites.client_shim import REFUSAL
from tests.external_suites.http_session import HttpSession, run_once
from tests.external_suites.sql_script import split_statements, substitute

DEFAULT_PATTERNS = ("transaction", "txn", "hermitage", "mvcc")
REPO_ROOT = Path(__file__).resolve().parents[2]
_CLUSTER = re.compile(r"\b(cluster|clusterAllReplicas|remote|remoteSecure)\s*\(", re.IGNORECASE)
_NATIVE = {
    "CLICKHOUSE_LOCAL": "clickhouse-local",
    "CLICKHOUSE_PORT_TCP": "the native TCP port",
    "CLICKHOUSE_CLIENT_BINARY": "the clickhouse-client binary",
    "CLICKHOUSE_BENCHMARK": "clickhouse-benchmark",
    "CLICKHOUSE_CLIENT_SECURE": "clickhouse-client over TLS",
    "CLICKHOUSE_KEEPER_CLIENT": "clickhouse-keeper-client",
}


@dataclasses.dataclass
class Result:
    name: str
    status: str  # passed | failed | not runnable | no reference
    reason: str = ""


@dataclasses.dataclass(frozen=True)
class Server:
    url: str
    auth: tuple[str, str] | None


def _diff(got: bytes, want: bytes) -> str:
    lines = difflib.unified_diff(
        want.decode(errors="replace").splitlines(),
        got.decode(errors="replace").splitlines(),
        "reference",
        "server",
        lineterm="",
    )
    return "\n".join(list(lines)[:40])


def _compare(name: str, got: bytes, want: bytes) -> Result:
    return Result(name, "passed") if got == want else Result(name, "failed", _diff(got, want))


def _unexpected(name: str, st_text: str, got: bytes, want: bytes, what: str) -> Result:
    """The first statement that did not do what the test expects, and how it differs."""
    prefix = want.startswith(got)
    where = f"{what}\n  statement: {st_text[:300]}\n  output before it matches the reference: {prefix}"
    if _CLUSTER.search(st_text):
        return Result(name, "not runnable", "needs cluster(): " + where)
    return Result(name, "failed", where)


def run_sql_test(path: Path, server: Server, database: str) -> Result:
    """One ``.sql`` test in its own session and database (made and dropped by the caller)."""
    want = path.with_suffix(".reference").read_bytes()
    session = HttpSession(server.url, database, auth=server.auth)
    got = bytearray()
    try:
        for st in split_statements(substitute(path.read_text(), database)):
            reply = session.run(st.text)
            got += reply.body
            if st.expected and st.expected.kind == "clientError" and reply.code is not None:
                continue
            if reply.code is None and st.expected:
                return _unexpected(path.stem, st.text, bytes(got), want, f"succeeded, expected {st.expected.codes}")
            if reply.code is not None and not (st.expected and st.expected.matches(reply.code, reply.name)):
                return _unexpected(path.stem, st.text, bytes(got), want, "error: " + reply.message[:400])
    finally:
        session.close()
    return _compare(path.stem, bytes(got), want)


def not_runnable_reason(script: str) -> str | None:
    """Why a shell test cannot run over HTTP, or None."""
    for var, what in _NATIVE.items():
        if var in script:
            return f"needs {what} (${var}): native protocol"
    if _CLUSTER.search(script):
        return "needs cluster()/remote() of ClickHouse's test clusters"
    return None


def _sh_env(server: Server, database: str, tmp: Path) -> dict[str, str]:
    u = urllib.parse.urlsplit(server.url)
    env = dict(os.environ)
    env.update(
        CLICKHOUSE_CLIENT=f"{sys.executable} -m tests.external_suites.client_shim",
        CLICKHOUSE_CURL="curl",
        CLICKHOUSE_HOST=u.hostname or "127.0.0.1",
        CLICKHOUSE_PORT_HTTP=str(u.port or 8123),
        CLICKHOUSE_PORT_HTTP_PROTO=u.scheme,
        CLICKHOUSE_URL=f"{server.url.rstrip('/')}/?database={database}",
        CLICKHOUSE_DATABASE=database,
        CLICKHOUSE_TEST_ZOOKEEPER_PREFIX=database,
        CLICKHOUSE_TMP=str(tmp),
        CHTX_STATELESS_URL=server.url,
        CHTX_STATELESS_DATABASE=database,
        PYTHONPATH=str(REPO_ROOT),
    )
    if server.auth:
        env.update(CHTX_STATELESS_USER=server.auth[0], CHTX_STATELESS_PASSWORD=server.auth[1])
        # curl reads the login from a private file in the test's scratch directory, not argv
        conf = tmp / "curl.conf"
        conf.touch(mode=0o600)
        conf.write_text(f'user = "{server.auth[0]}:{server.auth[1]}"\n')
        env["CLICKHOUSE_CURL"] = f"curl --config {conf}"
    return env


def run_sh_test(path: Path, server: Server, database: str) -> Result:
    """One ``.sh`` test, from a scratch copy of it and its ``*.lib`` files."""
    reason = not_runnable_reason(path.read_text())
    if reason:
        return Result(path.stem, "not runnable", reason)
    with tempfile.TemporaryDirectory(prefix="stateless_") as d:
        tests_dir = Path(d) / "queries" / "0_stateless"
        tests_dir.mkdir(parents=True)
        for lib in path.parent.glob("*.lib"):
            shutil.copy(lib, tests_dir)
        shutil.copy(path, tests_dir)
        (Path(d) / "queries" / "shell_config.sh").write_text("# the variables come from the environment\n")
        done = subprocess.run(
            ["bash", str(tests_dir / path.name)],
            cwd=d,
            env=_sh_env(server, database, Path(d)),
            capture_output=True,
            timeout=900,
        )
    stderr = done.stderr.decode(errors="replace")
    if REFUSAL in stderr:
        return Result(path.stem, "not runnable", "needs clickhouse-client: " + stderr.strip().splitlines()[-1])
    result = _compare(path.stem, done.stdout, path.with_suffix(".reference").read_bytes())
    if stderr.strip():
        result = Result(path.stem, "failed", (result.reason + "\nstderr:\n" + stderr[-2000:]).strip())
    return result


def run_test(path: Path, server: Server) -> Result:
    """One test in a database of its own, dropped afterwards."""
    if not path.with_suffix(".reference").exists():
        return Result(path.stem, "no reference", "the checkout has no .reference file for it")
    database = f"test_{uuid.uuid4().hex[:10]}"
    for db in (database, database + "_1"):
        run_once(server.url, f"CREATE DATABASE {db}", auth=server.auth)
    try:
        return run_sql_test(path, server, database) if path.suffix == ".sql" else run_sh_test(path, server, database)
    finally:
        for db in (database, database + "_1"):
            run_once(server.url, f"DROP DATABASE IF EXISTS {db}", auth=server.auth)


def select_tests(checkout: Path, patterns: list[str]) -> list[Path]:
    tests_dir = checkout / "tests" / "queries" / "0_stateless"
    if not tests_dir.is_dir():
        raise SystemExit(f"{tests_dir} does not exist: give the path of a ClickHouse checkout")
    return sorted(
        p for p in tests_dir.iterdir() if p.suffix in (".sql", ".sh") and any(pat in p.name for pat in patterns)
    )


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m tests.external_suites.clickhouse_stateless", description=__doc__)
    ap.add_argument("checkout", type=Path, help="a checkout of ClickHouse/ClickHouse")
    ap.add_argument("--url", required=True, help="the server's HTTP interface, e.g. http://127.0.0.1:8123")
    ap.add_argument("--pattern", action="append", help="a part of the test names to run (repeatable)")
    ap.add_argument("--user")
    ap.add_argument("--password-env", help="name of the environment variable holding the password")
    ap.add_argument("--json", type=Path, help="also write the results here")
    return ap


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    auth = (args.user, os.environ.get(args.password_env or "", "")) if args.user else None
    server = Server(args.url, auth)
    results = []
    for path in select_tests(args.checkout, args.pattern or list(DEFAULT_PATTERNS)):
        r = run_test(path, server)
        results.append(r)
        print(f"{r.status:13} {path.name}" + ("\n    " + r.reason.replace("\n", "\n    ") if r.reason else ""))
    counts = {s: sum(r.status == s for r in results) for s in ("passed", "failed", "not runnable", "no reference")}
    print(", ".join(f"{n} {s}" for s, n in counts.items()))
    if args.json:
        args.json.write_text(json.dumps([dataclasses.asdict(r) for r in results], indent=2) + "\n")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
