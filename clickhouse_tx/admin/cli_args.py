"""The command line of ``python -m clickhouse_tx``: its subcommands, their arguments, the password.

What each command does is :mod:`clickhouse_tx.__main__`. Parsing needs nothing but the
standard library and the ``Mode`` enum, so ``--help`` stays quick.
"""

from __future__ import annotations

import argparse
import os

from clickhouse_tx.errors import ClickHouseTxError
from clickhouse_tx.interfaces import Mode, TlsSettings


def add_connection(p: argparse.ArgumentParser) -> None:
    """Where the server is (``--url`` or ``--shards``) and who connects."""
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="ClickHouse HTTP endpoint, e.g. http://127.0.0.1:8123")
    where.add_argument(
        "--shards",
        metavar="URL[|URL],URL...",
        help="every shard of a sharded table (the writer's shards option): ',' between shards, '|' between replicas",
    )
    p.add_argument("--user", default="default")
    p.add_argument(
        "--password-env",
        metavar="VAR",
        help="name of the environment variable holding the password (never pass it on the command line)",
    )
    tls = p.add_argument_group("HTTPS (an https:// url; the writer's options of the same names)")
    tls.add_argument(
        "--ca-cert",
        metavar="PEM",
        help="CAs trusted to sign the server's certificate instead of the system's ('certifi': the certifi bundle)",
    )
    tls.add_argument("--client-cert", metavar="PEM", help="client certificate, for a server that requires one")
    tls.add_argument("--client-cert-key", metavar="PEM", help="its unencrypted key, unless --client-cert holds it")
    tls.add_argument(
        "--no-verify", dest="verify", action="store_false", help="accept any server certificate (verify=false)"
    )


def password(args: argparse.Namespace) -> str:
    """The password from the variable ``--password-env`` names (never from the command line)."""
    if not args.password_env:
        return ""
    if args.password_env not in os.environ:
        raise ClickHouseTxError(f"--password-env names {args.password_env!r}, which is not set")
    return os.environ[args.password_env]


def tls_settings(args: argparse.Namespace) -> TlsSettings:
    """The HTTPS settings of ``--ca-cert``, ``--client-cert``, ``--client-cert-key``, ``--no-verify``."""
    return TlsSettings(args.verify, args.ca_cert, args.client_cert, args.client_cert_key)


def mode_arg(value: str) -> Mode:
    """A ``--mode`` value as the ``Mode`` enum (the one list of modes)."""
    try:
        return Mode(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid mode {value!r} (choose from {', '.join(m.value for m in Mode)})"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m clickhouse_tx``: ``verify``, ``status``, ``recover``, ``gc``, ``check``."""
    ap = argparse.ArgumentParser(prog="python -m clickhouse_tx", description="clickhouse-tx operator tools")
    sub = ap.add_subparsers(dest="command", required=True)
    v = sub.add_parser(
        "verify",
        help="check a table for duplicate, missing, overlapping offsets",
        description="Exit code: 0 clean, 1 anomalies, 2 error.",
    )
    add_connection(v)
    v.add_argument("--table", required=True, help="database.table to check")
    v.add_argument("--topic-col", default="topic", help="column holding the Kafka topic ('' for none)")
    v.add_argument("--partition-col", default="partition")
    v.add_argument("--offset-col", default="offset")
    v.add_argument(
        "--segment-col",
        default=None,
        help="a column constant per committed insert (e.g. an ingestion time): "
        "enables the overlap/backward checks between inserts",
    )
    v.add_argument(
        "--expected", default=None, help='JSON (or a JSON file) of end offsets: {"topic": {"0": 1000, "1": [10, 900]}}'
    )
    v.add_argument("--txn-id", default=None, help="restrict marker/decision checks to this transactional id")
    v.add_argument(
        "--checkpoint", default=None, help="the query's checkpointLocation: check its decision logs against the markers"
    )
    v.add_argument("--no-markers", action="store_true", help="skip the markers table checks")
    v.add_argument("--json", default=None, metavar="FILE", help="write the report as JSON ('-' for stdout)")
    v.add_argument("--quiet", action="store_true", help="print nothing but errors")
    for name, helptext in (
        ("status", "open transactions of the registry"),
        ("recover", "finish in-doubt transactions left by dead drivers"),
        ("gc", "roll back stale prepares that no decision names"),
    ):
        c = sub.add_parser(name, help=helptext)
        add_connection(c)
        c.add_argument("--table", required=True, help="database.table: the target (the registry lives in its database)")
        c.add_argument("--registry-table", default=None, help="registry table (default clickhouse_tx_registry)")
        c.add_argument(
            "--txn-id",
            default=None,
            help="only this query's transactions (recover/gc: default "
            "every query with a decision log under --checkpoint)",
        )
        c.add_argument("--json", action="store_true", help="print the result as JSON")
        if name != "status":
            c.add_argument(
                "--mode",
                required=name == "recover",  # gc: only with the queries its prepares pass acts on
                type=mode_arg,
                metavar="{" + ",".join(m.value for m in Mode) + "}",
                help="act on the xids of this commit mode",
            )
            c.add_argument(
                "--checkpoint",
                default=None,
                help="the query's checkpointLocation (its decision logs); without it, "
                "xids whose fate depends on a decision are skipped",
            )
        if name == "gc":
            add_gc(c)
    add_check(sub)
    return ap


def add_gc(c: argparse.ArgumentParser) -> None:
    """``gc``'s own options: the prepares' age, the bookkeeping records' retention, ``--not-running``."""
    c.add_argument(
        "--older-than",
        type=float,
        default=None,
        metavar="SECONDS",
        help="only prepares older than this; must exceed the longest batch (needed with --txn-id/--checkpoint)",
    )
    c.add_argument(
        "--retention",
        default="3d",
        metavar="DURATION",
        help="drop the bookkeeping records (dedup layouts, run fences, helper key rows, "
        "job rows) older than this whose batch is committed, of every query, without "
        "a checkpoint (e.g. 3d, 12h, 600s; default 3d)",
    )
    c.add_argument(
        "--not-running",
        action="store_true",
        help="the named query (--txn-id, or the one --checkpoint holds) is stopped: "
        "also roll back the prepares of batches no decision log records, "
        "e.g. of a query that never decided a batch (never for a batch with "
        "a committing or committed xid)",
    )


def add_check(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``check``: whether a mode can write into a table, before the first write."""
    c = sub.add_parser(
        "check",
        help="before the first write: can this mode write into this table?",
        description="One line per check, 'ok  <check>' or 'FAIL <check>: <what to change>'. "
        "Exit code: 0 every check passed, 1 some failed, 2 error.",
    )
    add_connection(c)
    c.add_argument("--table", required=True, help="database.table: the target")
    c.add_argument(
        "--mode",
        required=True,
        type=mode_arg,
        metavar="{" + ",".join(m.value for m in Mode) + "}",
        help="the commit mode the writer will use",
    )
    c.add_argument(
        "--visibility",
        choices=("partition", "batch"),
        default="partition",
        help="the writer's visibility option (batch: mode staging only)",
    )
    c.add_argument(
        "--session-timeout",
        type=int,
        default=3600,
        metavar="SECONDS",
        help="the writer's session_timeout option (default 3600)",
    )
    c.add_argument("--registry-table", default=None, help="registry table (default clickhouse_tx_registry)")


__all__ = ["add_check", "add_connection", "add_gc", "build_parser", "mode_arg", "password", "tls_settings"]
