"""TLS and SASL for ``kafka_py``: option checks, secrets, the driver's credential probe.

The source talks to brokers through kafka-python, configured by the ``kafka.*``
options (``kafka.security.protocol``, ``kafka.ssl.cafile``, ``kafka.sasl.mechanism``,
...). This module adds what kafka-python leaves out:

- :func:`check_security` (driver, when the options are parsed): the protocol and
  mechanism are ones the source is tested with, a SASL listener has a user and a
  password, the TLS files exist; the passwords may come from the environment
  (:data:`SECRET_ENV`) instead of options.
- :func:`check_access` (driver, before the first metadata request of a read): one
  probe connection to a bootstrap server. kafka-python itself never reports a
  refused password (it reconnects forever) and reports an untrusted certificate as
  an ``SSLError`` retried like a dead broker; the probe turns both into a
  :class:`KafkaAuthenticationError` naming the option to fix, before any task runs.
- :func:`redact_secrets_in_logs` (wherever a consumer is built): kafka-python logs
  every request at DEBUG, the PLAIN token (which holds the password) included; a
  filter on its loggers masks the passwords this process uses.
"""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
import time
from typing import Any, Mapping

from clickhouse_tx.errors import ConfigurationError
from spark_datasource.kafka.errors import KafkaAuthenticationError

SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
#: Mechanisms tested end to end (GSSAPI and OAUTHBEARER need objects an option cannot carry).
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: kafka-python setting -> the environment variable it is read from when no option gives it.
SECRET_ENV = {"sasl_plain_password": "KAFKA_PY_SASL_PASSWORD", "ssl_password": "KAFKA_PY_SSL_PASSWORD"}
#: The option that sets each kafka-python setting (for error messages).
OPTION = {
    "sasl_plain_password": "kafka.sasl.plain.password",
    "sasl_plain_username": "kafka.sasl.plain.username",
    "ssl_password": "kafka.ssl.password",
    "ssl_cafile": "kafka.ssl.cafile",
    "ssl_certfile": "kafka.ssl.certfile",
    "ssl_keyfile": "kafka.ssl.keyfile",
    "ssl_crlfile": "kafka.ssl.crlfile",
}
_PROBE_TIMEOUT_S = 10.0
#: The logger librdkafka's consumers log to (``kafka.client=librdkafka``); masked like kafka-python's.
LIBRDKAFKA_LOGGER = "spark_datasource.kafka.librdkafka_fetch"


def _fail(option: str, problem: str) -> ConfigurationError:
    return ConfigurationError(f"kafka_py option {option!r}: {problem}")


def check_security(params: Mapping[str, object], environ: Mapping[str, str] | None = None) -> dict[str, object]:
    """The kafka-python ``params`` with passwords from the environment filled in, checked (driver).

    Raises
    ------
    ConfigurationError
        Naming the option: an unknown protocol or mechanism, a SASL listener without
        user or password, a TLS file that does not exist.
    """
    environ = os.environ if environ is None else environ
    out = dict(params)
    protocol = str(out.get("security_protocol") or "PLAINTEXT").upper()
    if protocol not in SECURITY_PROTOCOLS:
        raise _fail("kafka.security.protocol", f"expected one of {', '.join(SECURITY_PROTOCOLS)}, got {protocol!r}")
    out["security_protocol"] = protocol
    for setting, env in SECRET_ENV.items():
        if setting not in out and environ.get(env):
            out[setting] = environ[env]
    if protocol.startswith("SASL_"):
        _check_sasl(out)
    elif "sasl_mechanism" in out:
        raise _fail("kafka.sasl.mechanism", f"needs kafka.security.protocol SASL_PLAINTEXT or SASL_SSL, not {protocol}")
    for setting in ("ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_crlfile"):
        path = out.get(setting)
        if path and not os.access(str(path), os.R_OK):
            raise _fail(OPTION[setting], f"cannot read {path!r} on the driver")
    if out.get("ssl_keyfile") and not out.get("ssl_certfile"):
        raise _fail("kafka.ssl.keyfile", "is given without kafka.ssl.certfile (the client certificate)")
    return out


def _check_sasl(out: dict[str, object]) -> None:
    mechanism = str(out.get("sasl_mechanism") or "").upper()
    if mechanism not in SASL_MECHANISMS:
        raise _fail(
            "kafka.sasl.mechanism",
            f"expected one of {', '.join(SASL_MECHANISMS)} with {out['security_protocol']}, got {mechanism or None!r}",
        )
    out["sasl_mechanism"] = mechanism
    if not out.get("sasl_plain_username"):
        raise _fail("kafka.sasl.plain.username", f"is required with kafka.sasl.mechanism={mechanism}")
    if not out.get("sasl_plain_password"):
        raise _fail(
            "kafka.sasl.plain.password",
            f"is required with kafka.sasl.mechanism={mechanism} (or the environment variable "
            f"{SECRET_ENV['sasl_plain_password']} on the driver)",
        )


# ---------------------------------------------------------------- log redaction


class _SecretFilter(logging.Filter):
    """Masks known secrets in kafka-python's log records (it logs request bodies at DEBUG)."""

    def __init__(self) -> None:
        super().__init__()
        self.secrets: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.secrets:
            return True
        message = record.getMessage()
        hidden = message
        for secret in self.secrets:
            hidden = hidden.replace(secret, "***")
        if hidden != message:
            record.msg, record.args = hidden, None
        return True


_FILTER = _SecretFilter()
_FILTER_LOCK = threading.Lock()


def redact_secrets_in_logs(cfg: Mapping[str, object]) -> None:
    """Mask the passwords of ``cfg`` in every kafka-python and librdkafka log record of this process.

    Runs where a consumer is built (driver and executors), before it connects. A
    secret is masked as given and as it shows inside a ``bytes`` repr.
    """
    found = [str(cfg[k]) for k in SECRET_ENV if cfg.get(k)]
    if not found:
        return
    import kafka.conn  # noqa: F401 - make sure kafka-python's loggers exist

    with _FILTER_LOCK:
        for secret in found:
            _FILTER.secrets.update({secret, repr(secret.encode())[2:-1]})
        logging.getLogger(LIBRDKAFKA_LOGGER)
        for name in list(logging.root.manager.loggerDict):
            if name == "kafka" or name.startswith("kafka.") or name == LIBRDKAFKA_LOGGER:
                logger = logging.getLogger(name)
                if _FILTER not in logger.filters:
                    logger.addFilter(_FILTER)


# ---------------------------------------------------------------- the driver's probe


def check_access(cfg: Mapping[str, Any], bootstrap_servers: str) -> None:
    """Open one connection to a bootstrap server with ``cfg`` and authenticate (driver).

    Returns when a server accepts it, or when none answers at all (the caller's
    retries then report an unavailable broker). Runs once per metadata consumer of a
    read, only for ``SSL`` and ``SASL_*``.

    Raises
    ------
    KafkaAuthenticationError
        The broker refused the SASL credentials, or its certificate is not trusted, or
        the client key cannot be loaded: the message names the option to fix.
    """
    if str(cfg.get("security_protocol", "PLAINTEXT")) == "PLAINTEXT":
        return
    for server in bootstrap_servers.split(","):
        host, _, port = server.strip().rpartition(":")
        if _probe(cfg, host, int(port)):
            return


def _probe(cfg: Mapping[str, Any], host: str, port: int) -> bool:
    """True once ``host:port`` accepted the connection; False if it never answered."""
    from kafka.conn import BrokerConnection
    from kafka.errors import SaslAuthenticationFailedError

    errors: list[BaseException] = []

    class _Probe(BrokerConnection):
        """Keeps the errors its connection was closed with (kafka-python only logs them)."""

        def close(self, error: BaseException | None = None) -> None:
            if error is not None:
                errors.append(error)
            super().close(error)

    settings = {k: v for k, v in cfg.items() if k in BrokerConnection.DEFAULT_CONFIG}
    where = f"{host}:{port}"
    try:
        conn = _Probe(host, port, socket.AF_UNSPEC, **settings)
    except ssl.SSLError as e:
        raise _tls_error(e, where) from None
    deadline = time.monotonic() + _PROBE_TIMEOUT_S
    try:
        while time.monotonic() < deadline:
            if conn.connect_blocking(max(0.1, deadline - time.monotonic())):
                return True
            refused = [e for e in errors if isinstance(e, SaslAuthenticationFailedError)]
            if refused:
                raise KafkaAuthenticationError(
                    f"kafka_py option 'kafka.sasl.plain.password': the broker at {where} refused SASL "
                    f"{cfg.get('sasl_mechanism')} authentication of user {cfg.get('sasl_plain_username')!r} "
                    f"({refused[-1].args[0] if refused[-1].args else 'no reason given'}); check "
                    f"kafka.sasl.plain.username and kafka.sasl.plain.password"
                )
            time.sleep(0.1)  # kafka-python's reconnect backoff
    except ssl.SSLError as e:
        raise _tls_error(e, where) from None
    finally:
        conn.close()
    return False


def _tls_error(e: ssl.SSLError, where: str) -> KafkaAuthenticationError:
    reason = getattr(e, "verify_message", None) or e.reason or str(e)
    if isinstance(e, ssl.SSLCertVerificationError):
        option, fix = "kafka.ssl.cafile", "set kafka.ssl.cafile to the CA (PEM) that signed the broker's certificate"
        if "hostname" in str(reason).lower() or "ip address mismatch" in str(reason).lower():
            option, fix = "kafka.ssl.check.hostname", "the certificate does not name the broker's host"
        return KafkaAuthenticationError(
            f"kafka_py option {option!r}: the broker at {where} presented a certificate that is not trusted "
            f"({reason}); {fix}"
        )
    return KafkaAuthenticationError(
        f"kafka_py option 'kafka.ssl.keyfile': TLS to {where} could not be set up ({reason}); check "
        f"kafka.ssl.certfile, kafka.ssl.keyfile and kafka.ssl.password (the key's password)"
    )
