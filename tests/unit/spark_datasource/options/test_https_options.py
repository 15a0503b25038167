"""The HTTPS options parsed on the driver and carried, pickled, to the executors' Target."""

from __future__ import annotations

import pickle

import pytest

from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.interfaces import DEFAULT_TLS, TlsSettings
from spark_datasource.options.writer_options import WriterOptions

BASE = {"url": "https://ch.example:8443", "table": "db.events", "password": "s3cr3t-Pa55"}


def test_the_https_options_reach_the_target_the_executors_unpickle() -> None:
    opts = WriterOptions.parse(
        {**BASE, "VERIFY": "true", "ca_cert": " /etc/ca.pem ", "client_cert": "/c.pem", "client_cert_key": "/c.key"},
        streaming=False,
    )
    target = pickle.loads(pickle.dumps(opts.target()))
    assert target.tls == TlsSettings(True, "/etc/ca.pem", "/c.pem", "/c.key")
    assert all(t.tls == target.tls for t in [opts.target(), *opts.route_targets()])


def test_without_https_options_the_target_verifies_against_the_systems_cas() -> None:
    assert WriterOptions.parse(BASE, streaming=False).target().tls == DEFAULT_TLS == TlsSettings(True, None, None, None)
    assert WriterOptions.parse({**BASE, "ca_cert": "  "}, streaming=False).target().tls.ca_cert is None


def test_a_verify_value_that_is_not_a_boolean_is_refused_naming_the_option_and_never_the_password() -> None:
    with pytest.raises(ConfigurationError) as err:
        WriterOptions.parse({**BASE, "verify": "sometimes"}, streaming=False)
    assert "option verify='sometimes'" in str(err.value) and "s3cr3t" not in str(err.value)
