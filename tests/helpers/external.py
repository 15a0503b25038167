"""The suite against servers the user runs (``make test-external``, docs/deployment.md).

The addresses come from the environment; the password is read from it when a request
is made and is kept out of every repr, test id and log line. Which tests are left out,
and why, is decided here from what a test uses; what the server lacks is probed once
per run, before any test runs.
"""

from __future__ import annotations

import os
import types
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import requests

from server_patches.stack_files import StackInfo
from spark_datasource.testing import credentials

ENV_URL = "CLICKHOUSE_TX_EXTERNAL_URL"
# The user and password, shared with every client the tests build (spark_datasource/testing/credentials.py).
ENV_USER, ENV_PASSWORD = credentials.ENV_USER, credentials.ENV_PASSWORD
ENV_KEEPER = "CLICKHOUSE_TX_EXTERNAL_KEEPER"
ENV_KAFKA = "CLICKHOUSE_TX_EXTERNAL_KAFKA"
#: Only for the project's dev broker, whose mock cannot create topics over the Kafka protocol.
ENV_KAFKA_CONTROL = "CLICKHOUSE_TX_EXTERNAL_KAFKA_CONTROL"
ENV_CA_CERT = "CLICKHOUSE_TX_EXTERNAL_CA_CERT"
ENV_VERIFY = "CLICKHOUSE_TX_EXTERNAL_VERIFY"
ENV_CLIENT_CERT = "CLICKHOUSE_TX_EXTERNAL_CLIENT_CERT"
ENV_CLIENT_CERT_KEY = "CLICKHOUSE_TX_EXTERNAL_CLIENT_CERT_KEY"
#: The cluster of the user's ``remote_servers`` the Replicated profile creates its targets on
#: (``tests/helpers/replicated.py``); without it those tests are skipped.
ENV_CLUSTER = "CLICKHOUSE_TX_EXTERNAL_CLUSTER"

#: Fixtures that start private servers to kill, restart or reconfigure them.
EMBEDDED_FIXTURES = frozenset({"stack_factory", "sharded_stack", "broker", "brokers", "standalone_cluster"})
#: Modules whose use means a test drives the embedded servers' processes or files, and why.
EMBEDDED_MODULES = {
    "server_patches.crashes": "kills or restarts servers",
    "server_patches.stack": "starts or stops a stack",
    "server_patches.stack_clickhouse": "reads the embedded server's files",
    "server_patches.chdb_config": "reads the embedded server's configuration",
    "server_patches.zookeeper": "drives the embedded ZooKeeper",
    "server_patches.tls_front": "runs the project's TLS front",
    "server_patches.kafka_front": "runs the project's Kafka front before a broker of its own",
    "chdb": "runs the chdb engine in process, not the server",
}


@dataclass(frozen=True)
class External:
    """The servers under test, from the environment (the password is not held here)."""

    url: str
    keeper: str | None
    kafka: str | None
    kafka_control: str | None
    user: str | None
    tls: dict[str, str] = field(default_factory=dict)
    #: The cluster name of ``ON CLUSTER`` for Replicated targets, or None (no Replicated profile).
    cluster: str | None = None
    #: Prefix of every database and topic the run creates, so that leftovers are recognisable.
    prefix: str = field(default_factory=lambda: f"ctx_ext_{uuid.uuid4().hex[:6]}_")

    @classmethod
    def from_env(cls) -> "External | None":
        url = os.environ.get(ENV_URL)
        if not url:
            return None
        tls = {
            k: os.environ[e]
            for k, e in (
                ("verify", ENV_VERIFY),
                ("ca_cert", ENV_CA_CERT),
                ("client_cert", ENV_CLIENT_CERT),
                ("client_cert_key", ENV_CLIENT_CERT_KEY),
            )
            if os.environ.get(e)
        }
        return cls(
            url=url.rstrip("/"),
            keeper=os.environ.get(ENV_KEEPER) or None,
            kafka=os.environ.get(ENV_KAFKA) or None,
            kafka_control=os.environ.get(ENV_KAFKA_CONTROL) or None,
            user=(credentials.http_auth() or (None, ""))[0],
            tls=tls,
            cluster=os.environ.get(ENV_CLUSTER) or None,
        )

    def stack_info(self) -> StackInfo:
        """A ``StackInfo`` of addresses only: no processes, directories or files of ours."""
        parts = urlsplit(self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return StackInfo(
            dir=Path("/nonexistent-external-stack"),
            clickhouse_url=self.url,
            zookeeper=self.keeper or "",
            kafka_bootstrap=self.kafka,
            processes={},
            ports={"clickhouse": port},
            data_dirs={},
            logs={},
            config_file="",
            user=self.user,
            password_env=ENV_PASSWORD if os.environ.get(ENV_PASSWORD) else None,
            kafka_control=self.kafka_control,
        )

    def request_kwargs(self) -> dict[str, object]:
        """``requests`` arguments: credentials in headers (read now, never stored), TLS files."""
        login = credentials.http_auth()  # who every client of the run logs in as
        headers = {} if login is None else {"X-ClickHouse-User": login[0], "X-ClickHouse-Key": login[1]}
        verify: bool | str = self.tls.get("verify", "true").lower() not in ("false", "0", "no")
        if verify and "ca_cert" in self.tls:
            verify = self.tls["ca_cert"]
        kw: dict[str, object] = {"headers": headers, "verify": verify, "timeout": 60}
        if "client_cert" in self.tls:
            kw["cert"] = (self.tls["client_cert"], self.tls.get("client_cert_key", self.tls["client_cert"]))
        return kw

    def run(self, sql: str, session: str | None = None) -> str:
        """Run ``sql``; the error names the statement, never the credentials."""
        params = {"session_id": session} if session else {}
        r = requests.post(self.url, data=sql.encode(), params=params, **self.request_kwargs())  # type: ignore[arg-type]
        if r.status_code != 200:
            raise RuntimeError(f"{sql!r} failed with HTTP {r.status_code}: {r.text.strip()[:300]}")
        return r.text


def embedded_only_reason(item: object, https_url: bool) -> str | None:
    """Why a test cannot run against external servers, or None.

    A test is left out when it asks for a fixture that starts private servers, when its
    module uses the modules that kill, restart or read the embedded servers, or when it
    is marked ``embedded_only``.
    """
    marker = item.get_closest_marker("embedded_only")  # type: ignore[attr-defined]
    if marker is not None:
        return str(marker.args[0]) if marker.args else "marked embedded_only"
    used = EMBEDDED_FIXTURES & set(getattr(item, "fixturenames", ()))
    if used:
        return f"starts servers of its own ({', '.join(sorted(used))})"
    used_modules = _modules_used_by(item)
    for name in sorted(EMBEDDED_MODULES.keys() & used_modules):
        return f"{EMBEDDED_MODULES[name]} ({name})"
    if https_url and "tests.helpers.https" in used_modules:
        return "puts the project's own TLS front (plain HTTP behind it) before the server, which is HTTPS"
    return None


def _modules_used_by(item: object) -> set[str]:
    """The modules a test's module imported or took names from."""
    module = getattr(item, "module", None)
    names = set()
    for value in vars(module).values() if module is not None else ():
        name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
        if isinstance(name, str):
            names.add(name)
    return names


def probe_server(ext: External) -> dict[str, str]:
    """What the server lacks for the modes: requirement -> the server's answer (empty if all there)."""
    lacks: dict[str, str] = {}
    db = f"{ext.prefix}probe"
    ext.run(f"CREATE DATABASE IF NOT EXISTS `{db}`")
    try:
        session = uuid.uuid4().hex
        try:
            ext.run("BEGIN TRANSACTION", session)
            ext.run("ROLLBACK", session)
        except RuntimeError as e:
            lacks["transactions"] = str(e)
        try:
            ext.run(f"CREATE TABLE `{db}`.km (k String, v UInt8) ENGINE = KeeperMap('/{db}_km') PRIMARY KEY k")
        except RuntimeError as e:
            lacks["keepermap"] = str(e)
        try:
            ext.run(
                f"CREATE TABLE `{db}`.w (x UInt8) ENGINE = MergeTree ORDER BY x "
                "SETTINGS non_replicated_deduplication_window = 10"
            )
            for _ in range(2):
                ext.run(f"INSERT INTO `{db}`.w SETTINGS insert_deduplicate = 1 VALUES (1)")
            if ext.run(f"SELECT count() FROM `{db}`.w").strip() != "1":
                lacks["dedup_window"] = "a block inserted twice was kept twice"
        except RuntimeError as e:
            lacks["dedup_window"] = str(e)
    finally:
        ext.run(f"DROP DATABASE IF EXISTS `{db}` SYNC")
    return lacks


#: What each commit mode needs of the server (docs/modes.md); every mode keeps its registry in KeeperMap.
MODE_NEEDS = {
    "transaction": ("transactions", "keepermap"),
    "staging": ("transactions", "keepermap"),
    "dedup": ("dedup_window", "keepermap"),
    "plain": ("keepermap",),
}


#: What each mode needs of the server when a test writes into Replicated targets (its module
#: uses :data:`REPLICATED_HELPERS`). No ClickHouse transaction can hold a Replicated table, so
#: such a test reads without ``implicit_transaction`` (staging publishes by plain MOVE PARTITION)
#: and its table carries ``replicated_deduplication_window``: only the registry's KeeperMap is probed.
REPLICATED_MODE_NEEDS = {"staging": ("keepermap",), "dedup": ("keepermap",), "plain": ("keepermap",)}
REPLICATED_HELPERS = "tests.helpers.replicated"


def lacking_for(item: object, lacks: dict[str, str]) -> str | None:
    """The first requirement of a test's mode parameter the server lacks, or None.

    The needs are :data:`REPLICATED_MODE_NEEDS` for a test whose module uses
    :data:`REPLICATED_HELPERS`, else :data:`MODE_NEEDS`.
    """
    callspec = getattr(item, "callspec", None)
    if callspec is None or not lacks:
        return None
    needs = REPLICATED_MODE_NEEDS if REPLICATED_HELPERS in _modules_used_by(item) else MODE_NEEDS
    for value in callspec.params.values():
        for mode in value if isinstance(value, tuple) else (value,):
            for need in needs.get(mode, ()) if isinstance(mode, str) else ():
                if need in lacks:
                    return f"mode {mode} needs {need}"
    return None


def create_topic(stack: StackInfo, name: str, partitions: int) -> None:
    """Create a topic: through the dev broker's control address, else the Kafka admin API."""
    if stack.kafka_control:
        from server_patches.kafka_broker import create_topic as create_on_dev_broker

        create_on_dev_broker(stack.kafka_control, name, partitions)
        return
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=stack.kafka_bootstrap)
    try:
        admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        admin.close()


def delete_topics(bootstrap: str, prefix: str) -> list[str]:
    """Delete the topics named ``prefix...`` (the run's own); the names deleted.

    Called once, when the run ends; a failure fails the run's last test, as a leftover should.
    """
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        ours = [t for t in admin.list_topics() if t.startswith(prefix)]
        if ours:
            admin.delete_topics(ours)
        return ours
    finally:
        admin.close()
