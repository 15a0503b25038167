"""``python -m server_patches up|down|status|kill|restart --dir DIR``: the embedded stack from a shell.

``up --shards N --replicas R`` starts N × R ClickHouse servers on the one ZooKeeper
and adds ``clickhouse_urls`` (shards, then replicas) and ``shards_option`` (the
writer's ``shards`` option) to the JSON. ``kill``/``restart --shard I --replica J``
SIGKILL (and start again) one ClickHouse server, for crash tests.

``up`` prints the stack as one JSON line (what ``DIR/stack.json`` holds) and returns
once everything answers; the servers keep running after it exits. ``down`` stops
them; the data stays unless ``--purge``. ``status`` exits 0 when everything recorded
runs, 3 when something does not (the LSB "not running" code), 1 on errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Sequence

from server_patches import crashes, stack, stack_files
from server_patches.zookeeper import ZooKeeperError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m server_patches", description="Run the embedded ClickHouse + ZooKeeper (+ Kafka) stack."
    )
    sub = p.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start the stack (idempotent) and print it as JSON")
    up.add_argument("--dir", required=True, help="stack directory (data, logs, stack.json)")
    up.add_argument("--kafka", action="store_true", help="also start the dev Kafka broker")
    up.add_argument("--port", type=int, help="ClickHouse HTTP port (default: previous or free)")
    up.add_argument("--zk-port", type=int, help="ZooKeeper client port (default: previous or free)")
    up.add_argument(
        "--tcp-port", type=int, help="ClickHouse native port, e.g. 9000 (default: previous or free); see docs/server.md"
    )
    up.add_argument("--user", help="require this ClickHouse user")
    up.add_argument(
        "--password-env", metavar="VAR", help="name of the environment variable holding the user's password"
    )
    up.add_argument(
        "--max-session-timeout",
        type=int,
        help="longest session_timeout a client may ask for, seconds (default: config.d/sessions.xml)",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=stack_files.DEFAULT_START_TIMEOUT_S,
        help="seconds to wait for each component to answer",
    )
    up.add_argument(
        "--compatibility",
        metavar="X.Y",
        help="ClickHouse's compatibility setting in the engine's default profile, e.g. 25.8: "
        "the settings defaults of that version (default: as before, else none); see docs/server.md",
    )
    up.add_argument("--shards", type=int, help="ClickHouse shards (default: as before, else 1)")
    up.add_argument("--replicas", type=int, help="ClickHouse servers per shard (default: as before, else 1)")
    for name, what in (("kill", "SIGKILL one ClickHouse server"), ("restart", "SIGKILL one server and start it")):
        one = sub.add_parser(name, help=what)
        one.add_argument("--dir", required=True)
        one.add_argument("--shard", type=int, default=0)
        one.add_argument("--replica", type=int, default=0)
    down = sub.add_parser("down", help="stop every process of the stack")
    down.add_argument("--dir", required=True)
    down.add_argument("--purge", action="store_true", help="also delete data, logs and stack.json")
    down.add_argument(
        "--timeout", type=float, default=stack_files.DEFAULT_STOP_TIMEOUT_S, help="seconds between SIGTERM and SIGKILL"
    )
    status = sub.add_parser("status", help="print which components are alive")
    status.add_argument("--dir", required=True)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "up":
            before = stack.stack_status(args.dir)
            info = stack.start_stack(
                args.dir,
                kafka=args.kafka,
                port=args.port,
                zk_port=args.zk_port,
                tcp_port=args.tcp_port,
                user=args.user,
                password_env=args.password_env,
                max_session_timeout=args.max_session_timeout,
                timeout_s=args.timeout,
                shards=args.shards,
                replicas=args.replicas,
                compatibility=args.compatibility,
            )
            out = info.to_json()
            out["already_running"] = bool(before.get("running")) and (
                not args.kafka or bool(before.get("kafka_bootstrap"))
            )
            print(json.dumps(out, sort_keys=True), flush=True)
            return 0
        if args.command == "down":
            stopped = stack.stop_stack(args.dir, purge=args.purge, timeout_s=args.timeout)
            print(json.dumps({"dir": args.dir, "stopped": stopped, "purged": args.purge}), flush=True)
            return 0
        if args.command in ("kill", "restart"):
            action = crashes.kill_clickhouse if args.command == "kill" else crashes.restart_clickhouse
            action(args.dir, shard=args.shard, replica=args.replica)
            member = stack_files.member_name(args.shard, args.replica)
            print(json.dumps({"dir": args.dir, args.command: member}), flush=True)
            return 0
        st = stack.stack_status(args.dir)
        print(json.dumps(st, sort_keys=True), flush=True)
        return 0 if st["running"] else 3
    except (stack_files.StackError, ZooKeeperError) as e:
        print(f"server_patches {args.command}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
