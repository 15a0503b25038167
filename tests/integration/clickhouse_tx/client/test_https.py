"""The one HTTP client over HTTPS, through the TLS front before the embedded server.

The front (:mod:`server_patches.tls_front`) presents a server certificate of a CA the
tests generate (:mod:`tests.helpers.tls`); one front also requires a client certificate
of that CA. clickhouse-connect, given the same options, agrees with the client on what
is trusted.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import clickhouse_connect
import pyarrow as pa
import pytest

from clickhouse_tx.client.http import ClickHouseHTTP
from clickhouse_tx.client.sql import qualified
from clickhouse_tx.client.tls import check_tls
from clickhouse_tx.errors import ConfigurationError
from clickhouse_tx.interfaces import Target, TlsSettings
from spark_datasource.testing.credentials import Login, clickhouse_connect_login, target_fields
from tests.helpers.cli import run_cli
from tests.helpers.https import HttpsFront, connect_proxy

PASSWORD = "never-shown-5d81"


def _client(url: str, database: str, tls: TlsSettings, password: str | None = None) -> ClickHouseHTTP:
    """A client of ``url``: the run's user and password (make test-external), or ``password``."""
    login = target_fields() if password is None else Login(password=password)
    return ClickHouseHTTP(Target(url=url, database=database, table="t", tls=tls, **login))


def _round_trip(client: ClickHouseHTTP) -> int:
    """Create a table, stream 10,000 rows into it as Arrow, count them back."""
    client.command("CREATE TABLE t (id UInt64, s String) ENGINE = MergeTree ORDER BY id")
    batch = pa.record_batch({"id": pa.array(range(10_000), pa.uint64()), "s": [f"r{i}" for i in range(10_000)]})
    sent = client.insert_arrow_stream(qualified(client.database, "t"), batch.schema, iter([batch, batch.slice(0, 0)]))
    assert sent == 10_000
    return int(client.query_json("SELECT count() AS n FROM t")[0]["n"])


def test_a_client_trusting_the_generated_ca_queries_and_streams_arrow_over_https(
    front: HttpsFront, database: str
) -> None:
    with _client(front.url, database, TlsSettings(ca_cert=front.files.ca)) as client:
        assert _round_trip(client) == 10_000


@pytest.mark.parametrize("ca_cert", ["other", None, "certifi"], ids=["another_ca", "system_store", "certifi"])
def test_a_client_not_trusting_the_servers_ca_is_refused_with_an_error_naming_ca_cert_and_verify(
    front: HttpsFront, database: str, ca_cert: str | None
) -> None:
    tls = TlsSettings(ca_cert=front.files.other_ca if ca_cert == "other" else ca_cert)
    with _client(front.url, database, tls, PASSWORD) as client, pytest.raises(ConfigurationError) as err:
        client.query_json("SELECT 1")
    message = str(err.value)
    assert "not trusted" in message and "option ca_cert" in message and "verify=false" in message
    assert PASSWORD not in message and PASSWORD not in repr(err.value)


def test_through_an_https_proxy_tunnel_the_client_trusts_ca_cert_and_presents_client_cert(
    mtls_front: HttpsFront, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = mtls_front.files
    tls = TlsSettings(ca_cert=files.ca, client_cert=files.client_cert, client_cert_key=files.client_key)
    with connect_proxy() as (proxy, tunnels):
        monkeypatch.setenv("HTTPS_PROXY", proxy)
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        with _client(mtls_front.url, database, tls) as client:
            assert client.query_json("SELECT 41 + 1 AS n") == [{"n": 42}]
        untrusting = _client(mtls_front.url, database, TlsSettings(ca_cert=files.other_ca))
        with untrusting, pytest.raises(ConfigurationError, match="option ca_cert"):
            untrusting.query_json("SELECT 1")
    assert tunnels and set(tunnels) == {mtls_front.url.removeprefix("https://")}


def test_a_ca_file_rewritten_in_place_is_read_again_by_the_next_client(
    front: HttpsFront, database: str, tmp_path: Path
) -> None:
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(Path(front.files.other_ca).read_bytes())
    stale = _client(front.url, database, TlsSettings(ca_cert=str(bundle)))
    with stale, pytest.raises(ConfigurationError, match="not trusted"):
        stale.query_json("SELECT 1")
    bundle.write_bytes(Path(front.files.ca).read_bytes())
    os.utime(bundle, ns=(time.time_ns(), time.time_ns() + 1_000_000_000))  # a new version, whatever the clock's grain
    with _client(front.url, database, TlsSettings(ca_cert=str(bundle))) as renewed:
        assert renewed.query_json("SELECT 1 AS one") == [{"one": 1}]


def test_verify_false_accepts_the_untrusted_certificate_and_the_driver_check_logs_a_warning(
    front: HttpsFront, database: str, caplog: pytest.LogCaptureFixture
) -> None:
    target = Target(url=front.url, database=database, table="t", tls=TlsSettings(verify=False), **target_fields())
    with caplog.at_level(logging.WARNING, logger="clickhouse_tx.client.tls"):
        check_tls(target)
    assert any("verify=false" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    with ClickHouseHTTP(target) as client:
        assert _round_trip(client) == 10_000


def test_a_server_requiring_a_client_certificate_accepts_client_cert_and_client_cert_key(
    mtls_front: HttpsFront, database: str
) -> None:
    files = mtls_front.files
    tls = TlsSettings(ca_cert=files.ca, client_cert=files.client_cert, client_cert_key=files.client_key)
    with _client(mtls_front.url, database, tls) as client:
        assert _round_trip(client) == 10_000


def test_a_server_requiring_a_client_certificate_refuses_a_client_without_one_naming_client_cert(
    mtls_front: HttpsFront, database: str
) -> None:
    client = _client(mtls_front.url, database, TlsSettings(ca_cert=mtls_front.files.ca), PASSWORD)
    with client, pytest.raises(ConfigurationError) as err:
        client.query_json("SELECT 1")
    assert "client_cert" in str(err.value) and PASSWORD not in str(err.value)


def test_clickhouse_connect_given_the_same_options_trusts_what_the_client_trusts(
    mtls_front: HttpsFront, database: str
) -> None:
    files = mtls_front.files
    port = int(mtls_front.url.rsplit(":", 1)[1])
    common = {"host": "127.0.0.1", "port": port, "interface": "https", "database": database}
    common.update(clickhouse_connect_login())
    # tls_mode="proxy": the certificate at the TLS level, the user by user/password, as the writer does
    # (clickhouse-connect's default with a client_cert is ClickHouse's certificate authentication).
    mutual = {"client_cert": files.client_cert, "client_cert_key": files.client_key, "tls_mode": "proxy"}
    trusted = clickhouse_connect.get_client(ca_cert=files.ca, **mutual, **common)
    assert trusted.command("SELECT 7") == 7
    trusted.close()
    with pytest.raises(Exception, match="CERTIFICATE_VERIFY_FAILED"):
        clickhouse_connect.get_client(ca_cert=files.other_ca, **mutual, **common)


def test_the_driver_check_names_the_option_of_a_missing_or_broken_file(front: HttpsFront, tmp_path: Path) -> None:
    def check(**tls: object) -> str:
        with pytest.raises(ConfigurationError) as err:
            check_tls(Target(url=front.url, database="d", table="t", tls=TlsSettings(**tls), **target_fields()))  # type: ignore[arg-type]
        return str(err.value)

    assert "option ca_cert=" in check(ca_cert=str(tmp_path / "missing.pem")) and "no such file" in check(
        ca_cert=str(tmp_path / "missing.pem")
    )
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate")
    assert "option ca_cert=" in check(ca_cert=str(not_pem))
    assert "option client_cert=" in check(client_cert=str(not_pem))
    assert "option client_cert_key=" in check(client_cert=front.files.client_cert, client_cert_key=str(tmp_path / "x"))
    assert "only applies to an https:// url" in _http_check(front, ca_cert=front.files.ca)


def _http_check(front: HttpsFront, **tls: object) -> str:
    with pytest.raises(ConfigurationError) as err:
        check_tls(Target(url="http://127.0.0.1:1", database="d", table="t", tls=TlsSettings(**tls)))  # type: ignore[arg-type]
    return str(err.value)


def test_the_cli_takes_the_same_tls_flags_and_refuses_an_untrusted_server_naming_ca_cert(
    mtls_front: HttpsFront, database: str
) -> None:
    files = mtls_front.files
    client = ["--client-cert", files.client_cert, "--client-cert-key", files.client_key]
    where = ["--url", mtls_front.url, "--table", f"{database}.events"]

    status = run_cli("status", *where, "--ca-cert", files.ca, *client, "--json")
    assert status.returncode == 0, status.stderr
    assert json.loads(status.stdout)["in_doubt"] == []

    untrusted = run_cli("status", *where, "--ca-cert", files.other_ca, *client)
    assert untrusted.returncode == 2 and "option ca_cert" in untrusted.stderr

    tls = TlsSettings(ca_cert=files.ca, client_cert=files.client_cert, client_cert_key=files.client_key)
    with _client(mtls_front.url, database, tls) as admin:
        admin.command("CREATE TABLE events (partition Int32, offset Int64) ENGINE = MergeTree ORDER BY offset")
        admin.command("INSERT INTO events SELECT 0, number FROM numbers(100)")
    verified = run_cli("verify", *where, "--ca-cert", files.ca, *client, "--no-markers", "--topic-col", "")
    assert verified.returncode == 0, verified.stderr + verified.stdout
    without_cert = run_cli("verify", *where, "--ca-cert", files.ca, "--no-markers", "--topic-col", "")
    assert without_cert.returncode == 2 and "client_cert" in without_cert.stderr
