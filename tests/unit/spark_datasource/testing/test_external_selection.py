"""Which tests ``make test-external`` leaves out or skips, and how its credentials reach the clients (pure logic)."""

from __future__ import annotations

import types

import pytest

from spark_datasource.testing import credentials
from tests.helpers import external


class _Item:
    """The parts of a pytest item the selection reads."""

    def __init__(self, fixtures: tuple[str, ...] = (), module: object = None, params: dict | None = None) -> None:
        self.fixturenames = fixtures
        self.module = module
        if params is not None:
            self.callspec = types.SimpleNamespace(params=params)

    def get_closest_marker(self, name: str) -> None:
        return None


def test_a_test_that_starts_its_own_servers_is_left_out_naming_the_fixture() -> None:
    reason = external.embedded_only_reason(_Item(("stack_factory", "database")), https_url=False)
    assert reason is not None and "stack_factory" in reason


def test_a_test_whose_module_kills_servers_is_left_out_naming_the_module() -> None:
    from server_patches import crashes

    module = types.SimpleNamespace(crashes=crashes)
    reason = external.embedded_only_reason(_Item(("database",), module), https_url=False)
    assert reason is not None and "server_patches.crashes" in reason


def test_a_test_of_the_shared_servers_only_is_kept() -> None:
    module = types.SimpleNamespace(pytest=pytest)
    assert external.embedded_only_reason(_Item(("database", "kafka_bootstrap"), module), https_url=False) is None


def test_a_mode_is_skipped_only_for_what_the_server_lacks() -> None:
    lacks = {"transactions": "UNSUPPORTED"}
    assert external.lacking_for(_Item(params={"mode": "transaction"}), lacks) == "mode transaction needs transactions"
    assert (
        external.lacking_for(_Item(params={"mode": ("staging", "batch")}), lacks) == "mode staging needs transactions"
    )
    assert external.lacking_for(_Item(params={"mode": "dedup"}), lacks) is None
    assert external.lacking_for(_Item(params={"mode": "transaction"}), {}) is None


def test_the_password_is_in_no_repr_and_only_in_the_request_header(monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "s3cret-Pa55"
    monkeypatch.setenv(external.ENV_URL, "https://ch.example:8443/")
    monkeypatch.setenv(external.ENV_USER, "certify")
    monkeypatch.setenv(external.ENV_PASSWORD, secret)
    ext = external.External.from_env()
    assert ext is not None and ext.url == "https://ch.example:8443"
    info = ext.stack_info()
    assert secret not in repr(ext) and secret not in repr(info) and secret not in info.clickhouse_url
    assert info.password_env == external.ENV_PASSWORD and info.clickhouse_port == 8443
    assert ext.request_kwargs()["headers"] == {"X-ClickHouse-User": "certify", "X-ClickHouse-Key": secret}


def test_without_the_url_variable_the_suite_runs_on_the_embedded_stack(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(external.ENV_URL, raising=False)
    assert external.External.from_env() is None


def test_without_credentials_in_the_environment_no_client_is_given_any(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(credentials.ENV_USER, raising=False)
    monkeypatch.delenv(credentials.ENV_PASSWORD, raising=False)
    assert credentials.writer_options() == {} and credentials.target_fields() == {}
    assert credentials.cli_args() == [] and credentials.http_auth() is None


def test_each_client_gets_the_user_and_password_its_own_way_and_argv_only_names_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    secret = "s3cret-Pa55"
    monkeypatch.setenv(credentials.ENV_USER, "certify")
    monkeypatch.setenv(credentials.ENV_PASSWORD, secret)
    assert credentials.writer_options() == {"user": "certify", "password": secret}
    assert credentials.target_fields() == {"user": "certify", "password": secret}
    assert credentials.http_auth() == ("certify", secret)
    assert credentials.cli_args() == ["--user", "certify", "--password-env", credentials.ENV_PASSWORD]
    assert external.ENV_PASSWORD == credentials.ENV_PASSWORD  # one variable for the suite and the clients


def test_a_password_without_a_user_is_the_default_users(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(credentials.ENV_USER, raising=False)
    monkeypatch.setenv(credentials.ENV_PASSWORD, "pw")
    assert credentials.http_auth() == ("default", "pw")
    assert credentials.cli_args() == ["--user", "default", "--password-env", credentials.ENV_PASSWORD]
