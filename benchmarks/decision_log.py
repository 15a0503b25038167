"""Cost of one decision read as the log grows (local filesystem, no servers).

    python -m benchmarks.decision_log --batches 100 5000 --json benchmarks/results/decision_log.json

For each log size it writes that many done batches (compaction off), then times
``read`` of the newest batch (what every commit does) and ``batches()`` (a full
listing: what every read cost before reads probed names).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from typing import Any

from benchmarks.results_file import write_result
from clickhouse_tx.interfaces import Decision, Mode, Prepared
from clickhouse_tx.store.decision_log import FileDecisionLog


def _fill(log: FileDecisionLog, n: int) -> None:
    for b in range(n):
        p = Prepared(
            xid=f"x{b}",
            txn_id=log.txn_id,
            batch=b,
            partition=0,
            attempt=0,
            mode=Mode.TRANSACTION,
            server="h",
            table="d.t",
            rows=1,
            checksum=1,
        )
        log.write(Decision(txn_id=log.txn_id, batch=b, chosen=(p,)))
        log.mark_done(b)


def _ms(fn, repeat: int) -> float:
    t = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - t) / repeat * 1000


def measure(n: int, repeat: int) -> dict[str, Any]:
    """Milliseconds per read and per full listing with ``n`` done batches in the log."""
    with tempfile.TemporaryDirectory() as d:
        log = FileDecisionLog(d, "bench", compact_every=10**9)
        _fill(log, n)
        return {
            "batches": n,
            "read_ms": round(_ms(lambda: log.read(n - 1), repeat), 3),
            "listing_ms": round(_ms(lambda: list(log.batches()), repeat), 3),
        }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, nargs="+", default=[100, 5000])
    ap.add_argument("--repeat", type=int, default=200)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    rows = [measure(n, args.repeat) for n in args.batches]
    for r in rows:
        print(f"{r['batches']:>6} done batches: read {r['read_ms']:.3f} ms, full listing {r['listing_ms']:.3f} ms")
    if args.json:
        write_result(args.json, {"benchmark": "decision_log", "repeat": args.repeat, "results": rows})


if __name__ == "__main__":
    main()
