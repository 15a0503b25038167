"""The transaction registry: xid -> state, in a ClickHouse ``KeeperMap`` table.

KeeperMap stores each row as one ZooKeeper/Keeper node, so the registry is as
durable and linearizable as Keeper itself, and it needs nothing but SQL over the
same HTTP interface the data goes through (the pattern of clickhouse-kafka-connect's
state table). The library creates the table when it is missing.

How the compare-and-set works (and why it is one)
--------------------------------------------------
With ``keeper_map_strict_mode=1`` (sent with every write):

- ``INSERT`` of a key that exists fails (``Node exists``): :meth:`register` can
  never overwrite an entry, so an xid fenced as ``aborted`` can never register late.
- ``ALTER TABLE ... UPDATE ... WHERE xid = X AND state IN (...)`` reads the
  matching nodes together with their Keeper versions and writes them back with a
  version check in one Keeper ``multi``: if anybody changed the node in between,
  the write fails (``Bad version``) and nothing changes. The ``WHERE`` makes the
  update conditional on the expected state, the version check makes
  read-check-write atomic: that is a CAS.

``ALTER ... UPDATE`` returns no row count, so the caller cannot tell "I changed it"
from "it was not in an expected state". Every write therefore also sets
``cas_token`` to a fresh random value; reading the row back afterwards says who won:
our token means our write landed, anything else means it did not. This also
resolves a write whose reply was lost. ``tests/integration/clickhouse_tx/store/test_registry.py`` races
threads on one transition and checks exactly one wins.

Reads are plain SELECTs (KeeperMap is not transactional: no ``implicit_transaction``).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
import uuid
from typing import Any, Callable, Mapping, Sequence

from clickhouse_tx.client import sql as q
from clickhouse_tx.client.codes import TABLE_ALREADY_EXISTS, KeeperError, is_keeper_error
from clickhouse_tx.client.http import ClickHouseHTTP, safe_url
from clickhouse_tx.errors import AlreadyRegisteredError, OutcomeUnknownError, ServerError
from clickhouse_tx.interfaces import Mode, RegistryEntry, Target
from clickhouse_tx.retry import RetryPolicy, is_transient_or_unknown, retry_call

DEFAULT_TABLE = "clickhouse_tx_registry"

#: States after which nothing moves an xid (``TxState.COMMITTED/ABORTED`` values).
FINISHED_STATES = ("committed", "aborted")

_COLUMNS: tuple[tuple[str, str], ...] = (
    ("xid", "String"),
    ("txn_id", "String"),
    ("batch", "UInt64"),
    ("partition", "UInt32"),
    ("attempt", "UInt32"),
    ("mode", "String"),
    ("server", "String"),
    ("table", "String"),
    ("state", "String"),
    ("payload", "String"),  # JSON object
    ("created_ms", "UInt64"),
    ("updated_ms", "UInt64"),
    ("cas_token", "String"),  # random per write: tells the CAS winner (see module doc)
)
_NAMES = [c for c, _ in _COLUMNS]
_SELECT = ", ".join(q.quote_identifier(c) for c in _NAMES)
_STRICT = {"keeper_map_strict_mode": "1"}
# A CAS that keeps losing to other writers whose states stay expected is retried this often.
_CAS_ROUNDS = 16


def keeper_path_for(database: str, table: str) -> str:
    """The KeeperMap root of a registry table: readable, Keeper-safe, unique per name."""
    raw = f"{database}.{table}"
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", raw)
    digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
    return f"/clickhouse_tx/{safe}-{digest}"


# Tables this process has created or seen: Spark reuses Python workers, and every
# task builds a fresh registry, so without this each task repeats the DDL round trip.
_CREATED: set[tuple[str, str]] = set()


class KeeperMapRegistry:
    """Durable, linearizable xid -> state map (implements :class:`RegistryIO`).

    Parameters
    ----------
    target_or_client
        Where the registry lives: a :class:`Target` (a client is built lazily) or a
        ready :class:`ClickHouseHTTP` (must not be bound to a session).
    table, database
        Registry table; the database defaults to the target's.
    keeper_path
        KeeperMap root path (under the server's ``keeper_map_path_prefix``);
        default derived from database and table.
    clock
        Wall clock for ``created_ms``/``updated_ms``.
    retry
        Budget of the read-back that decides a write whose reply or Keeper connection
        was lost: a transient or outcome-unknown failure of that read is retried within
        it, logged at WARNING (without it the write's outcome would stay unknown, and a
        write is never repeated blindly). Every other call is retried by its caller (the
        coordinator's ``TxOps.call``): one retry loop per call, not one inside another.

    Notes
    -----
    Used on executors (:meth:`register`, once per partition attempt) and on the
    driver (everything else). Picklable: only the Target travels; the HTTP client is
    rebuilt on first use.
    """

    def __init__(
        self,
        target_or_client: Target | ClickHouseHTTP,
        table: str = DEFAULT_TABLE,
        database: str | None = None,
        *,
        keeper_path: str | None = None,
        clock: Callable[[], float] = time.time,
        retry: RetryPolicy | None = None,
    ) -> None:
        if isinstance(target_or_client, ClickHouseHTTP):
            if target_or_client.session_id is not None:
                raise ValueError("the registry needs a client without a session_id")
            self.target = target_or_client.target
            # A given client, else a threading.local holding one client per thread.
            self._client: Any = target_or_client
        else:
            self.target = target_or_client
            self._client = None
        self.database = database if database is not None else self.target.database
        self.table = table
        self.keeper_path = keeper_path or keeper_path_for(self.database, table)
        self.clock = clock
        self.retry = retry or RetryPolicy()
        self._ready = False
        self._fq = q.qualified(self.database, self.table)

    def __repr__(self) -> str:
        return f"KeeperMapRegistry({self.database}.{self.table}, server={safe_url(self.target.url)!r})"

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["_client"] = None
        d["_ready"] = False
        return d

    @property
    def client(self) -> ClickHouseHTTP:
        # One client per thread: the coordinator commits partitions in parallel and a
        # requests.Session is not meant to be shared between threads.
        if self._client is None:
            self._client = threading.local()
        client = getattr(self._client, "http", None)
        if client is None:
            client = self._client.http = ClickHouseHTTP(self.target, database=self.database)
        return client

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    # ------------------------------------------------------------------ table

    def ensure_table(self) -> None:
        """Create the KeeperMap table if it is missing (idempotent, race-safe)."""
        key = (self.target.url, self._fq)
        if self._ready or key in _CREATED:
            self._ready = True
            return
        cols = ", ".join(f"{q.quote_identifier(c)} {t}" for c, t in _COLUMNS)
        ddl = (
            f"CREATE TABLE IF NOT EXISTS {self._fq} ({cols}) "
            f"ENGINE = KeeperMap({q.quote_string(self.keeper_path)}) "
            f"PRIMARY KEY {q.quote_identifier('xid')}"
        )
        try:
            # Its own loop: the callers of register() retry only what was not sent (the
            # INSERT after this must not be repeated), but repeating this DDL is harmless.
            retry_call(
                lambda: self.client.command(ddl),
                self.retry,
                retry_on=is_transient_or_unknown,
                what=f"creating the registry table {self.table}",
            )
        except ServerError as e:
            if e.code != TABLE_ALREADY_EXISTS:  # a concurrent creator won: fine
                raise
        self._ready = True
        _CREATED.add(key)

    # ------------------------------------------------------------------ RegistryIO

    def register(self, entry: RegistryEntry) -> None:
        """Create ``entry`` (in its given state, normally INITIALIZED).

        Raises
        ------
        AlreadyRegisteredError
            The xid exists, in any state: an ABORTED tombstone fences a late
            registration, and an xid is never registered twice.
        OutcomeUnknownError
            The reply was lost and reading back could not tell.
        """
        self.ensure_table()
        token = uuid.uuid4().hex
        now = self._now_ms()
        values = [
            q.quote_string(entry.xid),
            q.quote_string(entry.txn_id),
            str(int(entry.batch)),
            str(int(entry.partition)),
            str(int(entry.attempt)),
            q.quote_string(Mode(entry.mode).value),
            q.quote_string(entry.server),
            q.quote_string(entry.table),
            q.quote_string(str(entry.state)),
            q.quote_string(json.dumps(dict(entry.payload or {}), sort_keys=True)),
            str(int(entry.created_ms or now)),
            str(int(entry.updated_ms or now)),
            q.quote_string(token),
        ]
        sql = f"INSERT INTO {self._fq} ({_SELECT}) VALUES ({', '.join(values)})"
        for _ in range(2):
            try:
                self.client.command(sql, settings=_STRICT)
                return
            except OutcomeUnknownError:
                pass  # reply or Keeper connection lost: our insert may have landed; read back
            except ServerError as e:
                if not is_keeper_error(e, KeeperError.NODE_EXISTS):
                    raise
            current, cur_token = self._get_with_token(entry.xid)
            if current is not None:
                if cur_token == token:
                    return  # it was our own insert whose reply got lost
                raise AlreadyRegisteredError(
                    f"xid is already registered (state {current.state}); not registering again", xid=entry.xid
                )
        raise OutcomeUnknownError("registration reply lost twice; state unknown", xid=entry.xid)

    def transition(
        self, xid: str, expected: Sequence[str], new: str, payload: Mapping[str, object] | None = None
    ) -> bool:
        """Compare-and-set ``state``: ``expected`` -> ``new``; True iff this call changed it.

        ``payload``, when given, replaces the stored payload in the same write.

        Raises
        ------
        OutcomeUnknownError
            Every round lost a race to writers that kept the state expected, or
            replies were lost and the read-back could not decide.
        """
        expected = [str(s) for s in expected]
        if not expected:
            return False
        self.ensure_table()
        token = uuid.uuid4().hex
        sql = self._cas_sql(f"= {q.quote_string(xid)}", expected, new, payload, token)
        for _ in range(_CAS_ROUNDS):
            self._cas_write(sql)
            current, cur_token = self._get_with_token(xid)
            if current is None:
                return False
            if cur_token == token:
                return True
            if current.state not in expected:
                return False
            # Still in an expected state but not ours: we lost a race to a writer that
            # moved it between two expected states. Try again on the fresh version.
        raise OutcomeUnknownError(f"CAS to {new} kept losing races", xid=xid)

    def _cas_write(self, sql: str) -> bool:
        """Run one compare-and-set ``sql``; False if a concurrent change refused it whole.

        Bad version: another writer changed a node between our read and write, and
        nothing of ours was written. True: it landed or its reply was lost, which the
        caller's read-back of the tokens tells apart. Any other error is raised.
        """
        try:
            self.client.command(sql, settings=_STRICT)
        except OutcomeUnknownError:
            pass  # reply or Keeper connection lost: the read-back tells what landed
        except ServerError as e:
            if not is_keeper_error(e, KeeperError.BAD_VERSION):
                raise
            return False
        return True

    def _cas_sql(
        self, xid_condition: str, expected: Sequence[str], new: str, payload: Mapping[str, object] | None, token: str
    ) -> str:
        """``ALTER ... UPDATE state, cas_token WHERE xid <condition> AND state IN expected``."""
        sets = [
            f"{q.quote_identifier('state')} = {q.quote_string(str(new))}",
            f"{q.quote_identifier('cas_token')} = {q.quote_string(token)}",
            f"{q.quote_identifier('updated_ms')} = {self._now_ms()}",
        ]
        if payload is not None:
            sets.append(
                f"{q.quote_identifier('payload')} = {q.quote_string(json.dumps(dict(payload), sort_keys=True))}"
            )
        return (
            f"ALTER TABLE {self._fq} UPDATE {', '.join(sets)} "
            f"WHERE {q.quote_identifier('xid')} {xid_condition} "
            f"AND {q.quote_identifier('state')} IN {q.quote_strings(expected)}"
        )

    def transition_many(
        self, xids: Sequence[str], expected: Sequence[str], new: str, payload: Mapping[str, object] | None = None
    ) -> list[str]:
        """One compare-and-set over many xids: the ones this call moved to ``new``.

        Driver, once or twice per batch commit. One ``ALTER ... WHERE xid IN (...)``
        (strict mode: each key's write is version-checked, and the multi-request fails
        whole on a concurrent change) and one read of the tokens. Xids not returned were
        not moved by this call (another state, a lost race, a lost reply): the caller
        decides each of those with :meth:`transition`/:meth:`get`.
        """
        xids = list(dict.fromkeys(xids))
        expected = [str(e) for e in expected]
        if not xids or not expected:
            return []
        self.ensure_table()
        token = uuid.uuid4().hex
        sql = self._cas_sql(f"IN {q.quote_strings(xids)}", expected, new, payload, token)
        if not self._cas_write(sql):
            return []  # a concurrent writer changed one of them: nothing of ours landed
        rows = self._read_back(f"SELECT xid, cas_token FROM {self._fq} WHERE xid IN {q.quote_strings(xids)}", {})
        return [str(r["xid"]) for r in rows if r["cas_token"] == token]

    def get(self, xid: str) -> RegistryEntry | None:
        """The entry of ``xid`` or None."""
        return self.get_many([xid]).get(xid)

    def get_many(self, xids: Sequence[str]) -> dict[str, RegistryEntry]:
        """The entries of ``xids`` that exist, by xid: one point read."""
        return {e.xid: e for e in self._select(f"xid IN {q.quote_strings(xids)}", {})}

    def create_record(
        self,
        key: str,
        body: str,
        *,
        txn_id: str,
        batch: int,
        partition: int = 0,
        attempt: int = 0,
        mode: Mode = Mode.NONE,
    ) -> str:
        """Store ``body`` under ``key`` unless the key exists; the body stored afterwards.

        A record is a finished (``committed``) entry that nothing else acts on, holding
        ``body`` in its payload: the registry's atomic create-if-absent used as a
        compare-and-set arbiter (decisions on object stores, dedup batch layouts).
        Whoever's create wins, every caller gets the winner's body.
        """
        # a record writes nothing anywhere: no server, no table
        entry = RegistryEntry(key, txn_id, batch, partition, attempt, mode, "", "", "committed", {"body": body})
        try:
            self.register(entry)
            return body
        except AlreadyRegisteredError:
            stored = self.record(key)
            if stored is None:
                raise
            return stored

    def record(self, key: str) -> str | None:
        """The body a :meth:`create_record` stored under ``key``, or None."""
        return self.records(key).get(key)

    def records(self, *keys: str) -> dict[str, str]:
        """The bodies :meth:`create_record` stored under ``keys`` (absent ones left out): one point read."""
        return {x: str(e.payload["body"]) for x, e in self.get_many(keys).items()}

    def list_batch(self, txn_id: str, batch: int) -> list[RegistryEntry]:
        """Every entry of (``txn_id``, ``batch``), in (partition, attempt, xid) order."""
        return self._select("txn_id = {t:String} AND batch = {b:UInt64}", {"t": txn_id, "b": int(batch)})

    def list_txn(self, txn_id: str) -> list[RegistryEntry]:
        """Every entry of one query (``txn_id``)."""
        return self._select("txn_id = {t:String}", {"t": txn_id})

    def list_open(self, older_than_s: float | None = None) -> list[RegistryEntry]:
        """Entries not finished (neither committed nor aborted).

        ``older_than_s``: only those not updated for at least that long (GC candidates).
        """
        where = "state NOT IN {fin:Array(String)}"
        params: dict[str, object] = {"fin": list(FINISHED_STATES)}
        if older_than_s is not None:
            where += " AND updated_ms <= {cut:UInt64}"
            params["cut"] = max(0, self._now_ms() - int(older_than_s * 1000))
        return self._select(where, params)

    def list_open_all_modes(self, older_than_s: float | None = None) -> list[RegistryEntry]:
        """:meth:`list_open`: this registry is never restricted to one mode."""
        return self.list_open(older_than_s)

    def forget(self, xids: Sequence[str], committed: Sequence[str] = ()) -> None:
        """Delete the finished entries among ``xids`` and the COMMITTING ones among ``committed``.

        Driver, once per done batch (``committed``: its xids whose COMMIT took effect,
        whose CAS to COMMITTED nothing would read), and ``gc``. KeeperMap filters on
        anything but the key read every key: the registry keeps only the xids in flight.
        """
        xid, state = q.quote_identifier("xid"), q.quote_identifier("state")
        which = f"{state} IN {q.quote_strings(FINISHED_STATES)}"
        if committed:
            which += f" OR {xid} IN {q.quote_strings(committed)} AND {state} = 'committing'"
        if keys := list(dict.fromkeys([*xids, *committed])):
            self.ensure_table()
            sql = f"ALTER TABLE {self._fq} DELETE WHERE {xid} IN {q.quote_strings(keys)} AND ({which})"
            self.client.command(sql, settings=_STRICT)

    def purge_finished(self, older_than_s: float) -> None:
        """Delete committed/aborted entries not updated for ``older_than_s`` (housekeeping).

        Keep ``older_than_s`` well above the longest time an executor may still try
        to register an attempt: a purged ABORTED tombstone no longer fences it.
        """
        self.ensure_table()
        cut = max(0, self._now_ms() - int(older_than_s * 1000))
        self.client.command(
            f"ALTER TABLE {self._fq} DELETE WHERE state IN {q.quote_strings(FINISHED_STATES)} AND updated_ms <= {cut}",
            settings=_STRICT,
        )

    # ------------------------------------------------------------------ helpers

    def _get_with_token(self, xid: str) -> tuple[RegistryEntry | None, str | None]:
        self.ensure_table()
        rows = self._read_back(f"SELECT {_SELECT} FROM {self._fq} WHERE xid = {{x:String}}", {"x": xid})
        if not rows:
            return None, None
        return _entry(rows[0]), rows[0]["cas_token"]

    def _select(self, where: str, params: Mapping[str, object]) -> list[RegistryEntry]:
        self.ensure_table()
        rows = self.client.query_json(
            f"SELECT {_SELECT} FROM {self._fq} WHERE {where} ORDER BY partition, attempt, xid", params=params
        )
        return [_entry(r) for r in rows]

    def _read_back(self, sql: str, params: Mapping[str, object]) -> list[dict[str, Any]]:
        """The read that decides a write whose outcome is unknown (the caller cannot repeat the
        write blindly), retried within ``self.retry`` while it fails or its reply is lost."""
        return retry_call(
            lambda: self.client.query_json(sql, params=params),
            self.retry,
            retry_on=is_transient_or_unknown,
            what=f"registry read-back of {self.table}",
        )


def _entry(row: Mapping[str, Any]) -> RegistryEntry:
    payload_text = str(row.get("payload") or "")
    payload = json.loads(payload_text) if payload_text else {}
    return RegistryEntry(
        xid=str(row["xid"]),
        txn_id=str(row["txn_id"]),
        batch=int(row["batch"]),
        partition=int(row["partition"]),
        attempt=int(row["attempt"]),
        mode=Mode(str(row["mode"])),
        server=str(row["server"]),
        table=str(row["table"]),
        state=str(row["state"]),
        payload=payload,
        created_ms=int(row["created_ms"]),
        updated_ms=int(row["updated_ms"]),
    )


__all__ = ["KeeperMapRegistry", "AlreadyRegisteredError", "DEFAULT_TABLE", "keeper_path_for"]
