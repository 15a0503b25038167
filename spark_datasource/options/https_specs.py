"""The ``clickhouse_tx`` writer's HTTPS options, each declared once.

Named and meant as clickhouse-connect's ``get_client`` arguments of the same names
(:class:`clickhouse_tx.interfaces.TlsSettings` holds them; :mod:`clickhouse_tx.client.tls`
builds the ``ssl.SSLContext``). Listed in :data:`spark_datasource.options.writer_specs.WRITER_OPTIONS`
after ``password``; their defaults are read from ``TlsSettings``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from clickhouse_tx.interfaces import TlsSettings
from spark_datasource.options.spec import BOOL, OptionSpec, Parser

__all__ = ["HTTPS_OPTIONS"]

_TLS = {f.name: f.default for f in dataclasses.fields(TlsSettings)}
#: A path (stripped); blank means not given.
_PATH: Parser[str | None] = Parser("a file path", lambda text: text.strip() or None)

HTTPS_OPTIONS: tuple[OptionSpec[Any], ...] = (
    OptionSpec(
        "verify",
        _TLS["verify"],
        BOOL,
        "With an `https://` url: check the server's certificate and host name. `false` accepts any certificate "
        "(a WARNING says so on the driver); not for production.",
        field="verify",
    ),
    OptionSpec(
        "ca_cert",
        _TLS["ca_cert"],
        _PATH,
        "With an `https://` url: a PEM file (or a directory of hashed PEM files) of the CAs trusted to sign the "
        "server's certificate, instead of the operating system's; `certifi`: the `certifi` package's public CAs. "
        "Read on the driver before any task writes and on each executor, at the same path.",
        field="ca_cert",
        blank_is_default=True,
        shown_default="the system's CAs",
    ),
    OptionSpec(
        "client_cert",
        _TLS["client_cert"],
        _PATH,
        "With an `https://` url: a client certificate (PEM, with any intermediates) for a server that requires one; "
        "the user still signs in with `user`/`password`.",
        field="client_cert",
        blank_is_default=True,
        shown_default="none",
    ),
    OptionSpec(
        "client_cert_key",
        _TLS["client_cert_key"],
        _PATH,
        "The unencrypted private key of `client_cert` (PEM), unless `client_cert` holds it.",
        field="client_cert_key",
        blank_is_default=True,
        shown_default="in `client_cert`",
    ),
)
