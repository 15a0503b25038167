"""``python -m clickhouse_tx check``: whether a commit mode can write into a table, before the first write.

Runs on an operator's machine (no Spark). Each check is one line of the report; the
checks the driver runs before a write are the driver's own functions, called here one
by one so that every failure is reported, not only the first: the mode's ``validate``
(engine, ``Distributed``, deduplication windows of the target and its views, views,
markers table), and the :class:`~clickhouse_tx.modes.base.ModeBase` checks it is made
of (transactions, read-only replica). The checks the driver leaves to the first write
are added here: the server contract's settings against the user's profile, the
session timeout cap, KeeperMap, grants.

Nothing is written to the target. What a first write creates anyway is created: the
KeeperMap registry (``keeper map``) and, once every check of the mode's ``validate``
passes, the markers table (docs/deployment.md, "Before the first write").
"""

from __future__ import annotations

import dataclasses
import itertools
import uuid
from collections.abc import Iterator

import pyarrow as pa

from clickhouse_tx.admin import grants as gr
from clickhouse_tx.client import contract
from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.client.tls import check_tls
from clickhouse_tx.conversion.schema import TableInfo, describe_table
from clickhouse_tx.errors import ClickHouseTxError
from clickhouse_tx.interfaces import CommitModeIO, Mode, Target
from clickhouse_tx.modes import mode_io_for
from clickhouse_tx.modes.base import ModeBase
from clickhouse_tx.store.registry import DEFAULT_TABLE as REGISTRY_TABLE
from clickhouse_tx.store.registry import KeeperMapRegistry

_AUTH_ERRORS = {"AUTHENTICATION_FAILED", "REQUIRED_PASSWORD", "WRONG_PASSWORD", "UNKNOWN_USER"}
#: ClickHouse's refusals of a setting a request carries: a profile constraint, readonly.
SETTING_REFUSALS = {452: "SETTING_CONSTRAINT_VIOLATION", 164: "READONLY"}
INVALID_SESSION_TIMEOUT = 374
#: What to change when the registry cannot be made, by code; else Keeper is missing.
_KEEPER_MAP_FIXES = {
    164: "the user is read-only; a first write creates this table: give the user a profile without readonly",
    497: "grant the user CREATE TABLE, SELECT, INSERT, ALTER UPDATE, ALTER DELETE on the database",
}


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """One line of the report: a check, whether it passed, and what to change if not."""

    name: str
    ok: bool
    detail: str = ""
    #: The driver's error behind a failure, when there is one (to tell a repeat of it).
    cause: str = dataclasses.field(default="", compare=False)

    def line(self) -> str:
        """``ok  <check>`` (a note in brackets), or ``FAIL <check>: <what to change>``."""
        if self.ok:
            return f"ok  {self.name}" + (f" ({self.detail})" if self.detail else "")
        return f"FAIL {self.name}: {self.detail}"


def passed(name: str, note: str = "") -> CheckResult:
    return CheckResult(name, True, note)


def failed(name: str, fix: str, cause: str = "") -> CheckResult:
    return CheckResult(name, False, fix, cause)


def _error_text(e: ClickHouseTxError) -> str:
    """The error's message and code, never a credential (the client's messages name the
    server by :func:`~clickhouse_tx.client.http.safe_url`)."""
    if e.code is None:
        return e.message
    return f"{e.message} (code {e.code}{' ' + e.name if e.name else ''})"


# ---------------------------------------------------------------------- server


def check_server(client: ClickHouseHTTP, target: Target) -> CheckResult:
    """``SELECT version()``: the server answers, with these credentials and certificates."""
    where = f"ClickHouse at {client.server} as user {target.user!r}"
    try:
        check_tls(target)
        version = client.command("SELECT version()", idempotent=True).strip()
    except ClickHouseTxError as e:
        if e.name in _AUTH_ERRORS:
            return failed("server", f"authentication failed for {where}: check --user and --password-env")
        return failed("server", f"cannot query {where}: {_error_text(e)}")
    return passed("server", f"ClickHouse {version}")


# ---------------------------------------------------------------------- the server contract


def contract_kinds(mode: Mode) -> list[contract.InsertKind]:
    """The kinds of INSERT mode ``mode`` sends: KEEP always, DEDUPLICATE for ``dedup``'s chunks."""
    kinds = [contract.InsertKind.KEEP]
    if mode is Mode.DEDUP:
        kinds.append(contract.InsertKind.DEDUPLICATE)
    return kinds


def _read_back_sql(names: list[str]) -> str:
    return "SELECT " + ", ".join(f"toString(getSetting('{n}')) AS s{i}" for i, n in enumerate(names))


def _same(sent: str, read: str) -> bool:
    """A setting read back as sent (a Bool reads back as ``true``/``false``)."""
    norm = {"true": "1", "false": "0"}
    return norm.get(read.lower(), read.lower()) == norm.get(sent.lower(), sent.lower())


def _refusal(e: ClickHouseTxError, sent: dict[str, str]) -> str:
    """What to change when the server refused one of ``sent``: name the setting and the fix."""
    name = next((n for n in sent if n in e.message), "one of " + ", ".join(sorted(sent)))
    why = "the user's profile is read-only" if e.code == 164 else "a constraint of the user's profile forbids it"
    return (
        f"the server refuses the setting {name}={sent.get(name, '?')} ({why}; {_error_text(e)}). clickhouse-tx "
        "sends it on every INSERT (docs/compatibility.md, 'The server contract'): allow it in the "
        "user's settings profile (remove its constraint or make it changeable; readonly = 0, or 2 "
        "to change settings only)"
    )


def check_contract(client: ClickHouseHTTP, mode: Mode) -> CheckResult:
    """The contract's settings of every INSERT kind of ``mode`` are accepted and read back as sent.

    One ``SELECT getSetting(...)`` per kind, carrying the kind's settings as URL settings
    the way an INSERT carries them (after the target's own), so the user's profile
    judges them exactly as it will judge the writer's INSERTs.
    """
    name = "server contract settings"
    try:
        traits = client.server_traits()
        for kind in contract_kinds(mode):
            sent = contract.insert_settings(
                kind, traits, token="clickhouse_tx_check", in_session=mode is Mode.TRANSACTION
            )
            names = list(sent)
            try:
                row = client.query_json(_read_back_sql(names), settings=sent)[0]
            except ClickHouseTxError as e:
                if e.code in SETTING_REFUSALS:
                    return failed(name, _refusal(e, sent))
                raise
            read = [str(row[f"s{i}"]) for i in range(len(names))]
            wrong = [f"{n}={r} (sent {sent[n]})" for n, r in zip(names, read) if not _same(sent[n], r)]
            if wrong:
                return failed(
                    name,
                    f"the server reads back {', '.join(wrong)}: the user's profile overrides what "
                    "clickhouse-tx sends on every INSERT; allow these settings in the profile",
                )
    except ClickHouseTxError as e:
        return failed(name, f"could not read the settings back: {_error_text(e)}")
    return passed(name, ", ".join(k.value for k in contract_kinds(mode)) + " INSERTs")


# ---------------------------------------------------------------------- the table and the mode


def check_table(client: ClickHouseHTTP, target: Target) -> tuple[CheckResult, TableInfo | None]:
    """The table exists (:func:`~clickhouse_tx.conversion.schema.describe_table`, the driver's read)."""
    name = f"table {target.database}.{target.table}"
    try:
        info = describe_table(client, target.database, target.table)
    except ClickHouseTxError as e:
        return failed(name, _error_text(e)), None
    return passed(name, info.engine), info


def needs_transactions(mode: Mode, visibility: str) -> bool:
    """Mode ``transaction``, and ``visibility=batch``, run every write in a ClickHouse transaction."""
    return mode is Mode.TRANSACTION or visibility == "batch"


def check_transactions(mode_io: ModeBase, target: Target, mode: Mode, visibility: str) -> CheckResult:
    """The server runs transactions (:meth:`ModeBase.require_transactions`, the driver's probe).

    For the modes that do not need them it says how a batch job is published instead.
    """
    needed_by = "option visibility=batch" if visibility == "batch" else f"mode {mode.value!r}"
    try:
        # The words validate uses, so that its refusal is seen as this one.
        instead = "" if visibility == "batch" else "or use mode 'staging'"
        mode_io.require_transactions(target, needed_by, instead=instead)
    except ClickHouseTxError as e:
        if needs_transactions(mode, visibility):
            return failed("transactions", _error_text(e), cause=_error_text(e))
        return passed("transactions", "off: a batch job is published one partition at a time")
    return passed("transactions")


def check_session_timeout(target: Target) -> CheckResult:
    """The server allows sessions of the writer's ``session_timeout`` (capped by ``max_session_timeout``).

    One ``SELECT 1`` in a fresh session of that timeout: the server refuses a longer one
    than its cap (``INVALID_SESSION_TIMEOUT``). The session holds nothing and expires.
    """
    name = f"session timeout {target.session_timeout_s} s"
    session = f"clickhouse_tx_check_{uuid.uuid4().hex}"
    try:
        with ClickHouseHTTP(target, session_id=session, session_timeout=target.session_timeout_s) as c:
            c.command("SELECT 1")
    except ClickHouseTxError as e:
        if e.code == INVALID_SESSION_TIMEOUT:
            return failed(
                name,
                f"{_error_text(e)}: raise max_session_timeout in the server's config to at least "
                f"{target.session_timeout_s} (server_patches/config.d/sessions.xml), or give the writer a "
                "smaller session_timeout option (and --session-timeout here)",
            )
        return failed(name, _error_text(e))
    return passed(name)


def check_keeper_map(target: Target, registry_table: str | None) -> CheckResult:
    """Keeper and ``keeper_map_path_prefix``: the registry is created when missing (as by a
    first write) and read (:class:`~clickhouse_tx.store.registry.KeeperMapRegistry`)."""
    registry = KeeperMapRegistry(target, table=registry_table or REGISTRY_TABLE)
    try:
        registry.get("clickhouse_tx_check")
    except ClickHouseTxError as e:
        fix = _KEEPER_MAP_FIXES.get(
            e.code or 0,
            "the server needs Keeper (a <zookeeper> section) and <keeper_map_path_prefix> "
            "(server_patches/config.d/keeper_map.xml)",
        )
        where = f"{registry.database}.{registry.table}"
        return failed("keeper map", f"the registry {where} cannot be created or read ({_error_text(e)}): {fix}")
    return passed("keeper map", f"registry {registry.database}.{registry.table}")


def check_grants(client: ClickHouseHTTP, target: Target, mode: Mode) -> CheckResult:
    """The user holds every privilege mode ``mode`` needs (:func:`~clickhouse_tx.admin.grants.needed`)."""
    try:
        grants, tree = gr.read_grants(client)
    except ClickHouseTxError as e:
        return passed("grants", f"not checked: system.grants could not be read: {_error_text(e)}")
    lacking = gr.missing(gr.needed(mode, target), grants, tree)
    if lacking:
        shown = ", ".join(str(n) for n in lacking)
        return failed("grants", f"user {target.user!r} lacks {shown}: {gr.grant_statement(lacking, target.user)}")
    return passed("grants")


def check_read_only(mode_io: ModeBase, target: Target, info: TableInfo) -> CheckResult:
    """A replicated target's replica here is writable (:meth:`ModeBase.refuse_read_only`)."""
    try:
        mode_io.refuse_read_only(target, info)
    except ClickHouseTxError as e:
        text = _error_text(e)
        return failed("writable replica", f"{text}; try again once the replica has its Keeper session", cause=text)
    return passed("writable replica", "not replicated" if not info.is_replicated else "")


def null_schema(info: TableInfo) -> pa.Schema:
    """Every column an INSERT may give, as Arrow ``null``: what ``validate`` takes when no
    data is at hand (a null fits any column, so the data's own schema is not judged here)."""
    cols = [c for c in info.columns if c.default_kind.upper() not in ("MATERIALIZED", "ALIAS")]
    return pa.schema([pa.field(c.name, pa.null()) for c in cols])


def check_mode(mode_io: CommitModeIO, target: Target, info: TableInfo, mode: Mode) -> CheckResult:
    """The mode's own ``validate``, as the driver runs it: engine, ``Distributed``,
    deduplication windows of the target and its views, views; then the markers table."""
    name = f"mode {mode.value}"
    try:
        mode_io.validate(target, null_schema(info))
    except ClickHouseTxError as e:
        return failed(name, _error_text(e))
    return passed(name)


# ---------------------------------------------------------------------- all of them


@dataclasses.dataclass(frozen=True)
class Plan:
    """What ``check`` is asked: the target, the mode, the writer options that change the checks."""

    target: Target
    mode: Mode
    visibility: str = "partition"
    registry_table: str | None = None


def _server_checks(client: ClickHouseHTTP, plan: Plan, mode_io: ModeBase) -> Iterator[CheckResult]:
    """What the server and the user must allow, whatever the table."""
    yield check_contract(client, plan.mode)
    if plan.mode is not Mode.NONE:
        yield check_transactions(mode_io, plan.target, plan.mode, plan.visibility)
    if needs_transactions(plan.mode, plan.visibility):
        yield check_session_timeout(plan.target)
    if plan.mode is not Mode.NONE:
        yield check_keeper_map(plan.target, plan.registry_table)
    yield check_grants(client, plan.target, plan.mode)


def _table_checks(
    client: ClickHouseHTTP, plan: Plan, mode_io: ModeBase, validating: CommitModeIO
) -> Iterator[CheckResult]:
    """What the table must be; the mode's ``validate`` last, since it also creates the markers table."""
    result, info = check_table(client, plan.target)
    yield result
    if info is None:
        return  # the checks below read the table
    yield check_read_only(mode_io, plan.target, info)
    yield check_mode(validating, plan.target, info, plan.mode)


def run_checks(plan: Plan) -> Iterator[CheckResult]:
    """Every check of ``plan``, one result each, as they finish (the CLI prints each at once).

    Runs where ``python -m clickhouse_tx check`` runs. A server that does not answer ends
    the run after its line: every other check would fail the same way.

    Yields
    ------
    CheckResult
        In order: server, contract settings, transactions, session timeout, KeeperMap,
        grants, table, writable replica, the mode's ``validate``. A ``validate`` failure
        already reported by an earlier line (transactions, read-only replica) refers to it.
    """
    validating = mode_io_for(plan.mode, visibility=plan.visibility)
    mode_io = validating
    assert isinstance(mode_io, ModeBase)  # every mode's I/O is one: its driver checks are ModeBase's
    with ClickHouseHTTP(plan.target) as client:
        server = check_server(client, plan.target)
        yield server
        if not server.ok:
            return
        earlier: dict[str, str] = {}
        server_side = _server_checks(client, plan, mode_io)
        for result in itertools.chain(server_side, _table_checks(client, plan, mode_io, validating)):
            # validate repeats the driver's probes: its refusal names the line that said it first.
            seen = next((name for name, cause in earlier.items() if cause in result.detail), None)
            if not result.ok and result.name == f"mode {plan.mode.value}" and seen:
                result = failed(result.name, f"as '{seen}' above")
            if not result.ok and result.cause:
                earlier[result.name] = result.cause
            yield result


__all__ = [
    "CheckResult",
    "Plan",
    "check_contract",
    "check_grants",
    "check_keeper_map",
    "check_mode",
    "check_read_only",
    "check_server",
    "check_session_timeout",
    "check_table",
    "check_transactions",
    "contract_kinds",
    "null_schema",
    "run_checks",
]
