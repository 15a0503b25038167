"""The server contract: every setting the protocol's INSERTs rely on, declared once.

ClickHouse changes what an INSERT does between releases, through the defaults of a
user's profile. Since 26.2 (``system.settings_changes``):

- ``async_insert`` is 1: an INSERT with its data in the request is queued, and inside a
  transaction the server refuses it (``Async inserts inside transactions are not
  supported``, code 48; executeQuery.cpp);
- ``deduplicate_insert = 'enable'`` supersedes ``insert_deduplicate``: ``insert_deduplicate
  = 0`` alone no longer turns deduplication off (only ``'backward_compatible_choice'``
  consults it);
- ``deduplicate_blocks_in_dependent_materialized_views`` is 1.

Since 26.1 ``deduplicate_insert_select = 'enable_when_possible'`` decides for ``INSERT ...
SELECT`` (a token counts as a stable SELECT). A user's profile may set any of these.
So no guarantee of the protocol rests on a default: every INSERT the project sends is
one of two kinds, and :func:`insert_settings` gives each its settings, which the client
(:class:`clickhouse_tx.client.http.ClickHouseHTTP`) puts on the request last, over the
target's ``setting.*`` and the caller's own:

``KEEP``
    Every block must land: transaction-mode and stage data, markers, registry and
    bookkeeping rows, key rows, the publishing ``INSERT ... SELECT``. Synchronous;
    deduplication off by every setting the server has; and a token unique to the INSERT
    (the caller's, else one drawn per call), so that even a server that deduplicates
    anyway compares this INSERT's blocks with nothing but themselves.
``DEDUPLICATE``
    A block equal by its token to one the table holds is dropped (mode ``dedup``'s
    chunks, its dead letters): synchronous, deduplication on by every setting the server
    has, the views' tables too; the caller names the token.

Which settings a server has is learned once per process and server
(:data:`PROBE_SQL`, :meth:`ServerTraits.from_names`): naming ``deduplicate_insert`` to a
server older than 26.2 fails the request (``UNKNOWN_SETTING``). Pure: no I/O here.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections.abc import Iterable, Mapping

from clickhouse_tx.errors import ConfigurationError


class InsertKind(enum.Enum):
    """What an INSERT may do with a block the table already holds."""

    KEEP = "keep"
    DEDUPLICATE = "deduplicate"


#: The settings a server may lack (newer than the oldest server the project supports).
VERSIONED = ("deduplicate_insert", "deduplicate_insert_select")

#: One read per process and server: which of :data:`VERSIONED` the server has.
PROBE_SQL = "SELECT name FROM system.settings WHERE name IN ({names:Array(String)})"


@dataclasses.dataclass(frozen=True)
class ServerTraits:
    """Which of the settings that arrived in later releases a server has."""

    #: 26.2+: ``deduplicate_insert`` (supersedes ``insert_deduplicate``).
    deduplicate_insert: bool = False
    #: 25.12+: ``deduplicate_insert_select`` (consulted first for ``INSERT ... SELECT``).
    deduplicate_insert_select: bool = False

    @classmethod
    def from_names(cls, names: Iterable[str]) -> ServerTraits:
        """The traits of a server whose ``system.settings`` holds ``names`` (of :data:`VERSIONED`)."""
        have = set(names)
        return cls(
            deduplicate_insert="deduplicate_insert" in have,
            deduplicate_insert_select="deduplicate_insert_select" in have,
        )


#: Every INSERT: synchronous. A queued INSERT is refused in a transaction, and outside
#: one its reply need not count the rows written, nor its block keep its token.
_EVERY_INSERT = {"async_insert": "0"}

#: An INSERT sent in a session (a transaction's): a statement the server cannot run in a
#: transaction fails it, rather than running outside it (``0`` would run it so).
_IN_SESSION = {"throw_on_unsupported_query_inside_transaction": "1"}

_KEEP = {
    "insert_deduplicate": "0",
    "deduplicate_blocks_in_dependent_materialized_views": "0",
}
_DEDUPLICATE = {
    "insert_deduplicate": "1",
    # A view's table drops a replayed block too (their windows are checked with the target's).
    "deduplicate_blocks_in_dependent_materialized_views": "1",
}

#: The settings the contract owns: a user's ``setting.<name>`` may not give them.
PINNED: frozenset[str] = frozenset(
    {*_EVERY_INSERT, *_IN_SESSION, *_KEEP, *_DEDUPLICATE, *VERSIONED, "insert_deduplication_token"}
)


def insert_settings(kind: InsertKind, traits: ServerTraits, *, token: str | None, in_session: bool) -> dict[str, str]:
    """The settings of one INSERT of ``kind`` to a server with ``traits`` (pure).

    Parameters
    ----------
    kind
        :attr:`InsertKind.KEEP` or :attr:`InsertKind.DEDUPLICATE`.
    traits
        What the server has (:class:`ServerTraits`).
    token
        The INSERT's ``insert_deduplication_token``. Required for ``DEDUPLICATE``; for
        ``KEEP``, ``None`` draws one unique to this call.
    in_session
        The INSERT runs in an HTTP session (a transaction's).

    Raises
    ------
    ValueError
        ``DEDUPLICATE`` without a token: nothing would name the block.
    """
    out = dict(_EVERY_INSERT)
    if in_session:
        out.update(_IN_SESSION)
    if kind is InsertKind.DEDUPLICATE:
        if not token:
            raise ValueError("an INSERT that may be deduplicated needs its insert_deduplication_token")
        out.update(_DEDUPLICATE)
        if traits.deduplicate_insert:
            out["deduplicate_insert"] = "enable"
    else:
        out.update(_KEEP)
        if traits.deduplicate_insert:
            out["deduplicate_insert"] = "disable"
        if traits.deduplicate_insert_select:
            out["deduplicate_insert_select"] = "disable"
        token = token or f"keep:{uuid.uuid4().hex}"
    out["insert_deduplication_token"] = token
    return out


def refuse_pinned(settings: Mapping[str, object], where: str) -> None:
    """Raise when a user's ``settings`` name a setting the contract owns (driver, options parsing).

    Raises
    ------
    ConfigurationError
        Naming the setting, ``where`` it was given (``"option setting.async_insert"``),
        and why the project sets it itself.
    """
    for name in settings:
        if str(name).lower() in PINNED:
            raise ConfigurationError(
                f"{where.format(name=name)}: the setting {name} is set by clickhouse-tx on every INSERT it "
                'sends (docs/compatibility.md, "The server contract"): the exactly-once guarantee rests '
                "on its value, so it cannot be given as an option; remove it"
            )


__all__ = ["PINNED", "PROBE_SQL", "VERSIONED", "InsertKind", "ServerTraits", "insert_settings", "refuse_pinned"]
