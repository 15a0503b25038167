"""``python -m clickhouse_tx <command>``: operator tools that need no Spark.

Commands
--------
verify
    Check a target table for exactly-once anomalies (:mod:`clickhouse_tx.verify.verifier`).
    Exit code 0 = clean, 1 = anomalies found, 2 = error (bad options, server down).
status
    Open transactions of the registry: counts per state and per query, in-doubt xids
    (a driver died between COMMITTING and COMMITTED), the oldest open age.
recover
    Finish in-doubt xids: roll decided ones forward (with ``--checkpoint``), roll the
    rest back (:func:`clickhouse_tx.admin.recovery.resolve_in_doubt`).
gc
    Remove what is older than ``--older-than`` seconds and nothing will use: prepares
    that no decision names (open transactions, stage tables), finished registry
    entries, leftover stage tables (:func:`clickhouse_tx.admin.recovery.gc_stale`). With
    ``--not-running`` (the operator says the named query is stopped), also the
    prepares of batches without a decision log, such as a query that never decided
    a batch (:func:`clickhouse_tx.admin.recovery.untouched_batch` says why that is safe).
check
    Before the first write: whether ``--mode`` can write into ``--table`` on this server
    as this user, one line per check (``ok  <check>`` or ``FAIL <check>: <what to
    change>``), by the driver's own checks (:mod:`clickhouse_tx.admin.preflight`).
    Exit code 0 = every check passed, 1 = some failed, 2 = error. Writes nothing into
    the table; creates the registry and the markers table a first write would create.

With ``--shards URL[|URL],URL...`` instead of ``--url`` (a sharded write's ``shards``
option), ``status``, ``recover`` and ``gc`` run on every shard in turn (each shard's
registry holds its own xids; the decision logs are shared), printing one block (one
JSON document with ``--json``) per shard, and ``verify`` checks the table's offsets
across the shards (:func:`clickhouse_tx.verify.shards.verify_shards`: the same offset
on two shards is a duplicate).

``recover`` and ``gc`` act on the xids of one ``--mode`` at a time, and only on the
queries they are given: ``--txn-id``, or else every query with a decision log under
``--checkpoint``. With neither they refuse (the registry is shared by every query of
the database). Exit code 0 = done, 1 = some xids failed (listed), 2 = error.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import TYPE_CHECKING, Any, Sequence

from clickhouse_tx.admin.cli_args import build_parser, password, tls_settings
from clickhouse_tx.errors import ClickHouseTxError
from clickhouse_tx.interfaces import Mode

if TYPE_CHECKING:  # imported where used: `python -m clickhouse_tx --help` stays quick
    from clickhouse_tx.interfaces import Target
    from clickhouse_tx.store.registry import KeeperMapRegistry

EXIT_CLEAN, EXIT_ANOMALIES, EXIT_ERROR = 0, 1, 2


class _ModeView:
    """The registry restricted to one commit mode (recovery must use that mode's I/O)."""

    def __init__(self, inner: Any, mode: Mode) -> None:
        self.inner = inner
        self.mode = mode

    def list_open(self, older_than_s: float | None = None) -> list[Any]:
        return [e for e in self.inner.list_open(older_than_s) if Mode(e.mode) is self.mode]

    def list_txn(self, txn_id: str) -> list[Any]:
        return [e for e in self.inner.list_txn(txn_id) if Mode(e.mode) is self.mode]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def _registry_and_target(args: argparse.Namespace) -> tuple[KeeperMapRegistry, Target]:
    from clickhouse_tx.client.sql import split_table
    from clickhouse_tx.client.tls import check_tls
    from clickhouse_tx.factory import build_registry
    from clickhouse_tx.interfaces import Target
    from clickhouse_tx.retry import RetryPolicy

    db, t = split_table(args.table)
    # An operator's command rides through a dropped connection the way the writer does:
    # its reads and idempotent DDL are retried (its writes resolve a lost reply by a lookup).
    target = Target(
        url=args.url.rstrip("/"),
        database=db,
        table=t,
        user=args.user,
        password=password(args),
        read_retry=RetryPolicy(),
        tls=tls_settings(args),
    )
    check_tls(target)
    kwargs = {"table": args.registry_table} if args.registry_table else {}
    return build_registry(target, **kwargs), target


def _status(args: argparse.Namespace) -> int:
    from clickhouse_tx.admin.bookkeeping import counts
    from clickhouse_tx.admin.recovery import status_summary

    registry, target = _registry_and_target(args)
    s = status_summary(registry)
    doc: dict[str, Any] = {
        "open_by_state": dict(s.open_by_state),
        "in_doubt": list(s.in_doubt),
        "oldest_open_age_s": s.oldest_open_age_s,
        "by_txn": dict(s.by_txn),
        "bookkeeping": counts(target, registry),
    }
    if args.txn_id:
        doc["by_txn"] = {k: v for k, v in doc["by_txn"].items() if k == args.txn_id}
    if args.json:
        print(json.dumps(doc, indent=1, sort_keys=True))
    else:
        total = sum(doc["open_by_state"].values())
        print(
            f"{total} open transactions: "
            + (", ".join(f"{k}={v}" for k, v in sorted(doc["open_by_state"].items())) or "none")
        )
        if doc["oldest_open_age_s"] is not None:
            print(f"oldest open: {doc['oldest_open_age_s']:.0f} s")
        for txn, n in sorted(doc["by_txn"].items()):
            print(f"  query {txn}: {n} open")
        if doc["in_doubt"]:
            print("in doubt (run recover): " + ", ".join(doc["in_doubt"]))
        print(_bookkeeping_line(doc["bookkeeping"]))
    return EXIT_CLEAN


def _bookkeeping_line(b: dict[str, Any]) -> str:
    """``status``'s line of record counts per bookkeeping table (growth shows here)."""
    lay, reg = b["layouts"], b["registry"]
    return (
        f"bookkeeping: layouts {sum(v for k, v in lay.items() if k not in ('batches', 'unsealed_batches'))} "
        f"(claims {lay['claims']}, chunk records {lay['chunk_records']}, seals {lay['seals']}, "
        f"first-run {lay['first_run']}, helper first attempts {lay['foreach_batch']}; "
        f"{lay['batches']} batches, {lay['unsealed_batches']} unsealed), "
        f"registry {reg['open']} open + {reg['finished']} finished + {reg['run_fences']} run fences, "
        f"helper key rows {b['key_rows']}, job rows {b['job_rows']}"
    )


def _txn_ids_to_touch(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    """The queries ``recover``/``gc`` may act on, and those with a decision log under ``--checkpoint``.

    Refuses (ClickHouseTxError) rather than act on every query of a shared registry:
    another query's decided xids must never be judged against this checkpoint. With
    ``gc --not-running``, a checkpoint without decision logs names the query its
    ``clickhouse_tx/query.json`` holds (a streaming query that never decided a batch).
    """
    from clickhouse_tx.store.decision_log import txn_ids_with_decisions
    from clickhouse_tx.store.query_identity import stored_txn_id

    found = txn_ids_with_decisions(args.checkpoint) if args.checkpoint else []
    not_running = bool(getattr(args, "not_running", False))
    stored = stored_txn_id(args.checkpoint) if args.checkpoint and not_running and not found else None
    if args.txn_id and args.checkpoint and args.txn_id not in found and args.txn_id != stored:
        raise ClickHouseTxError(
            f"--checkpoint {args.checkpoint} holds no decision log of txn id {args.txn_id!r} "
            f"(it holds: {', '.join(found) or 'none'}); pass that query's own checkpointLocation"
        )
    if args.txn_id:
        return [args.txn_id], found
    if not args.checkpoint:
        raise ClickHouseTxError(
            f"{args.command} needs --txn-id ID and/or --checkpoint CHK: the registry is shared by every "
            "query of the database, and without them it would act on all of them"
        )
    if stored:
        return [stored], found
    if not found:
        raise ClickHouseTxError(
            f"--checkpoint {args.checkpoint} holds no decision log (<checkpoint>/clickhouse_tx/<txn id>/): "
            "nothing to act on; name the query with --txn-id (gc of a query that never decided a batch: "
            "add --not-running once it is stopped)"
        )
    return found, found


def _gc_records(args: argparse.Namespace) -> dict[str, Any]:
    """``gc``'s retention pass (every query; no checkpoint needed): what it dropped."""
    from clickhouse_tx.admin.bookkeeping import gc_bookkeeping, parse_duration

    registry, target = _registry_and_target(args)
    return dataclasses.asdict(gc_bookkeeping(target, registry, parse_duration(args.retention)))


def _recover_or_gc(args: argparse.Namespace) -> int:
    from clickhouse_tx.admin.recovery import gc_stale, resolve_in_doubt
    from clickhouse_tx.factory import build_mode_io
    from clickhouse_tx.store.decision_log import FileDecisionLog

    if args.command == "gc" and not (args.txn_id or args.checkpoint):
        return _print_gc(
            {"records": _gc_records(args), "prepares": "not touched: name the queries with --txn-id or --checkpoint"},
            args,
        )
    if args.command == "gc" and (args.mode is None or args.older_than is None):
        raise ClickHouseTxError("gc of the prepares of --txn-id/--checkpoint needs --mode and --older-than")
    txn_ids, logged = _txn_ids_to_touch(args)
    registry, target = _registry_and_target(args)
    view = _ModeView(registry, args.mode)
    checkpoint = args.checkpoint

    def log_for(txn_id: str) -> FileDecisionLog | None:
        # Only a query whose decisions are under the checkpoint: another's log would be
        # empty here, and an empty log would let gc roll back that query's decided xids.
        return FileDecisionLog(checkpoint, txn_id) if checkpoint and txn_id in logged else None

    mode_io = build_mode_io(args.mode)
    if args.command == "recover":
        rep = resolve_in_doubt(target, mode_io, view, log_for, txn_ids=txn_ids)
    else:
        rep = gc_stale(
            target,
            mode_io,
            view,
            log_for,
            args.older_than,
            txn_ids=txn_ids,
            not_running=args.not_running,
        )
    doc: dict[str, Any] = {
        "committed": list(rep.committed),
        "rolled_back": list(rep.rolled_back),
        "skipped": list(rep.skipped),
        "errors": dict(rep.errors),
        "forgotten": list(rep.forgotten),
        "dropped_stages": list(rep.dropped),
    }
    if args.command == "gc":
        doc["records"] = _gc_records(args)
    if args.json:
        print(json.dumps(doc, indent=1, sort_keys=True))
        return EXIT_ANOMALIES if rep.errors else EXIT_CLEAN
    print(
        f"{args.command}: committed {len(rep.committed)}, rolled back {len(rep.rolled_back)}, "
        f"skipped {len(rep.skipped)}, forgotten {len(rep.forgotten)}, "
        f"stages dropped {len(rep.dropped)}, errors {len(rep.errors)}"
    )
    for xid, err in sorted(rep.errors.items()):
        print(f"  {xid}: {err}")
    if "records" in doc:
        _print_gc({"records": doc["records"]}, args)
    return EXIT_ANOMALIES if rep.errors else EXIT_CLEAN


def _print_gc(doc: dict[str, Any], args: argparse.Namespace) -> int:
    """Print what gc's retention pass dropped (JSON with ``--json``); exit code clean."""
    if args.json:
        print(json.dumps(doc, indent=1, sort_keys=True))
        return EXIT_CLEAN
    r = doc["records"]
    print(
        f"gc records older than {args.retention}: layout records {r['layout_records']} "
        f"({len(r['layout_batches'])} batches), run fences {r['run_fences']}, "
        f"helper key rows {r['key_rows']}, job rows {r['job_rows']}"
    )
    if "prepares" in doc:
        print(f"prepares: {doc['prepares']}")
    return EXIT_CLEAN


def _verify(args: argparse.Namespace) -> int:
    from clickhouse_tx.verify.verifier import verify

    report = verify(
        args.url,
        args.table,
        segment_col=args.segment_col,
        txn_id=args.txn_id,
        checkpoint=args.checkpoint,
        markers=False if args.no_markers else None,
        **_offset_checks(args),
    )
    return _report(args, report)


def _offset_checks(args: argparse.Namespace) -> dict[str, Any]:
    """The arguments ``verify`` and ``verify --shards`` share: the offset columns, what
    to expect, the credentials."""
    from clickhouse_tx.verify.offsets import parse_expected

    return {
        "topic_col": args.topic_col or None,
        "partition_col": args.partition_col,
        "offset_col": args.offset_col,
        "expected": parse_expected(args.expected),
        "user": args.user,
        "password": password(args),
        "tls": tls_settings(args),
    }


def _report(args: argparse.Namespace, report: Any) -> int:
    """Write a verify report as ``--json`` asks (``-``: stdout), its summary unless quiet; the exit code."""
    if args.json == "-":
        json.dump(report.to_json(), sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif args.json:
        with open(args.json, "w") as fh:
            json.dump(report.to_json(), fh, indent=1)
    if not args.quiet and args.json != "-":
        print(report.summary())
    return EXIT_CLEAN if report.clean else EXIT_ANOMALIES


def _shard_urls(args: argparse.Namespace) -> list[str]:
    """One URL per shard: the first replica that answers (the first one if none does)."""
    from clickhouse_tx.interfaces import Target
    from clickhouse_tx.sharding.io import answers
    from clickhouse_tx.sharding.placement import parse_shard_urls

    probe = Target(
        url="", database="default", table="", user=args.user, password=password(args), tls=tls_settings(args)
    )
    out = []
    for replicas in parse_shard_urls(args.shards):
        out.append(next((u for u in replicas if len(replicas) == 1 or answers(probe, u)), replicas[0]))
    return out


def _each_shard(args: argparse.Namespace) -> int:
    """``status``/``recover``/``gc`` on every shard in turn; the worst exit code."""
    from clickhouse_tx.client.http import safe_url

    worst = EXIT_CLEAN
    for i, url in enumerate(_shard_urls(args)):
        if not args.json:
            print(f"shard {i} ({safe_url(url)}):")
        one = argparse.Namespace(**{**vars(args), "url": url, "shards": None})
        worst = max(worst, _status(one) if args.command == "status" else _recover_or_gc(one))
    return worst


def _verify_shards(args: argparse.Namespace) -> int:
    from clickhouse_tx.verify.shards import verify_shards

    report = verify_shards(_shard_urls(args), args.table, **_offset_checks(args))
    return _report(args, report)


def _check(args: argparse.Namespace) -> int:
    """``check``: every check's line on stdout; with ``--shards``, on every replica of every shard."""
    from clickhouse_tx.admin.preflight import Plan, run_checks
    from clickhouse_tx.client.http import safe_url
    from clickhouse_tx.client.sql import split_table
    from clickhouse_tx.interfaces import Target
    from clickhouse_tx.sharding.placement import parse_shard_urls

    db, t = split_table(args.table)
    urls = [u for shard in parse_shard_urls(args.shards) for u in shard] if args.shards else [args.url]
    worst = EXIT_CLEAN
    for url in urls:
        if args.shards:
            print(f"{safe_url(url)}:")
        target = Target(
            url=url.rstrip("/"),
            database=db,
            table=t,
            user=args.user,
            password=password(args),
            session_timeout_s=args.session_timeout,
            tls=tls_settings(args),
        )
        plan = Plan(target, args.mode, visibility=args.visibility, registry_table=args.registry_table)
        for result in run_checks(plan):
            print(("  " if args.shards else "") + result.line(), flush=True)
            worst = worst if result.ok else EXIT_ANOMALIES
    return worst


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns the process exit code."""
    args = build_parser().parse_args(argv)
    try:
        if args.command == "check":
            return _check(args)
        if args.shards:
            return _verify_shards(args) if args.command == "verify" else _each_shard(args)
        if args.command == "verify":
            return _verify(args)
        if args.command == "status":
            return _status(args)
        if args.command in ("recover", "gc"):
            return _recover_or_gc(args)
    except (ClickHouseTxError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
