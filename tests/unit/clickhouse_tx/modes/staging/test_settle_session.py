"""What a restart makes of the ROLLBACK it sends into a session an earlier attempt left
(:func:`clickhouse_tx.modes.staging.tables.settle_session`), with the server's replies scripted.

The same path on the embedded server:
``tests/integration/clickhouse_tx/foreach/test_foreach_keys.py`` (an open transaction rolled back).
"""

from __future__ import annotations

from typing import Any

import pytest

from clickhouse_tx.client.codes import INVALID_TRANSACTION, SESSION_NOT_FOUND
from clickhouse_tx.errors import ServerError
from clickhouse_tx.modes.staging.tables import settle_session


class _Session:
    """A client whose ROLLBACK gets one scripted reply (an exception, or success)."""

    session_id = "keys_x"

    def __init__(self, reply: Exception | None) -> None:
        self.reply = reply

    def command(self, sql: str, **kwargs: Any) -> str:
        assert sql == "ROLLBACK"
        if self.reply is not None:
            raise self.reply
        return ""


def test_a_rolled_back_transaction_was_open() -> None:
    assert settle_session(_Session(None)) is True  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "reply",
    [
        ServerError("Session keys_x not found", code=SESSION_NOT_FOUND),
        ServerError("There is no current transaction. (INVALID_TRANSACTION)", code=INVALID_TRANSACTION),
    ],
)
def test_a_session_gone_or_without_a_transaction_has_nothing_open(reply: Exception) -> None:
    assert settle_session(_Session(reply)) is False  # type: ignore[arg-type]


def test_a_rollback_refused_by_a_failed_transaction_is_a_transaction_still_open_and_raises() -> None:
    failed = ServerError(
        "Cannot execute query because current transaction failed. Expecting ROLLBACK statement",
        code=INVALID_TRANSACTION,
    )
    with pytest.raises(ServerError, match="current transaction failed"):
        settle_session(_Session(failed))  # type: ignore[arg-type]
