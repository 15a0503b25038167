"""The ClickHouse user and password of a run against servers one runs (``make test-external``).

Both come from the environment, ``CLICKHOUSE_TX_EXTERNAL_USER`` and
``CLICKHOUSE_TX_EXTERNAL_PASSWORD`` (docs/deployment.md, "Certify your deployment"), and
are read when a client is built, in whichever process builds it: the pytest process, a
child driver (which inherits the environment), a Spark job of the harness. Each kind of
client receives them through the product's own way in:

- a writer: its ``user`` and ``password`` options (:func:`writer_options`), which Spark
  hands to its Python workers with the other options;
- a :class:`clickhouse_tx.interfaces.Target`: its ``user`` and ``password`` fields
  (:func:`target_fields`);
- the command line: ``--user`` and ``--password-env`` naming the variable
  (:func:`cli_args`), so the password is in no argv;
- a plain ``requests`` call: HTTP basic authentication (:func:`http_auth`);
- a clickhouse-connect client: its ``username`` and ``password`` (:func:`clickhouse_connect_login`).

With neither variable set every function returns nothing, and the clients are built
exactly as before (the embedded stack's default user). The password is never put into
a URL, an argv, a repr or a message.
"""

from __future__ import annotations

import os
from typing import TypedDict

ENV_USER = "CLICKHOUSE_TX_EXTERNAL_USER"
ENV_PASSWORD = "CLICKHOUSE_TX_EXTERNAL_PASSWORD"


def _login() -> tuple[str, str] | None:
    """(user, password), or None when neither variable is set (the default user, no password).

    A password alone is the default user's, as ClickHouse reads it.
    """
    user = os.environ.get(ENV_USER) or None
    password = os.environ.get(ENV_PASSWORD, "")
    if user is None and not password:
        return None
    return (user or "default", password)


class Login(TypedDict, total=False):
    """The ``user`` and ``password`` keywords of ``Target``, ``ClickHouseReader`` and ``verify``."""

    user: str
    password: str


def target_fields() -> Login:
    """The ``Target`` fields ``user`` and ``password``; empty when unset (the field defaults).

    ``ClickHouseReader`` and ``clickhouse_tx.verify.verifier.verify`` take the same keywords.
    """
    login = _login()
    return {} if login is None else {"user": login[0], "password": login[1]}


def writer_options() -> dict[str, str]:
    """The ``clickhouse_tx`` writer options ``user`` and ``password``; empty when unset."""
    return {k: str(v) for k, v in target_fields().items()}


def cli_args() -> list[str]:
    """``--user U --password-env CLICKHOUSE_TX_EXTERNAL_PASSWORD`` for ``python -m clickhouse_tx``.

    The child process reads the password from the variable it inherits; empty when unset.
    """
    login = _login()
    if login is None:
        return []
    return ["--user", login[0], *(["--password-env", ENV_PASSWORD] if login[1] else [])]


def http_auth() -> tuple[str, str] | None:
    """``requests``' ``auth``: (user, password) for HTTP basic authentication, or None when unset."""
    return _login()


def clickhouse_connect_login() -> dict[str, str]:
    """``clickhouse_connect.get_client``'s ``username`` and ``password``; empty when unset."""
    login = _login()
    return {} if login is None else {"username": login[0], "password": login[1]}


__all__ = [
    "ENV_PASSWORD",
    "ENV_USER",
    "Login",
    "cli_args",
    "clickhouse_connect_login",
    "http_auth",
    "target_fields",
    "writer_options",
]
