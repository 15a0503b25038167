"""Render the one config file the embedded ClickHouse (chdb) starts with.

A real server reads ``config.xml`` plus every file in ``config.d/``; chdb takes a
single ``config-file``. This module starts from ``server_defaults.xml`` (the system
logs a server's own ``config.xml`` has), merges the patches in
``server_patches/config.d`` (the same files users copy to
``/etc/clickhouse-server/config.d/``) over it the way ClickHouse merges config
files, adds a ``<zookeeper>`` section for the stack's own ZooKeeper, and moves
a ZooKeeper root (chroot) ``/clickhouse_tx_stack/<stack name>`` so two stacks
sharing one ZooKeeper never see each other's transaction log, KeeperMap tables or
Keeper session nodes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import uuid
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Iterable, Sequence

CONFIG_D = Path(__file__).resolve().parent / "config.d"
SERVER_DEFAULTS = Path(__file__).resolve().parent / "server_defaults.xml"
USERS_XML = Path(__file__).resolve().parent / "users.xml"
STACK_ZK_ROOT = "/clickhouse_tx_stack"


class ConfigPatchError(ValueError):
    """A config.d file is not a ``<clickhouse>`` XML document."""


def patch_files(config_d: Path = CONFIG_D) -> list[Path]:
    """The ``*.xml`` patches in ``config_d``, in the order ClickHouse applies them (by name)."""
    return sorted(p for p in Path(config_d).glob("*.xml") if p.is_file())


def _merge(into: ET.Element, patch: ET.Element) -> None:
    """Merge ``patch``'s children into ``into`` like ClickHouse merges config files.

    An element whose tag is unique on both sides is merged recursively when both have
    children and replaced otherwise; ``replace="1"``/``"replace"`` on the patch side
    replaces the whole element; repeated tags (e.g. several ``<node>``) are appended.
    """
    for child in patch:
        if not isinstance(child.tag, str):  # comments
            continue
        same = into.findall(child.tag)
        replace = child.attrib.get("replace") in ("1", "true", "replace")
        if len(same) == 1 and len(patch.findall(child.tag)) == 1:
            target = same[0]
            if replace or len(child) == 0 or len(target) == 0:
                into.remove(target)
                into.append(_copy(child))
            else:
                target.text = child.text if (child.text or "").strip() else target.text
                _merge(target, child)
        else:
            into.append(_copy(child))


def _copy(e: ET.Element) -> ET.Element:
    c = ET.fromstring(ET.tostring(e))
    c.attrib.pop("replace", None)
    return c


def load_patches(files: Iterable[Path]) -> ET.Element:
    """Merge the given patch files into one ``<clickhouse>`` element."""
    root = ET.Element("clickhouse")
    for f in files:
        try:
            doc = ET.parse(f).getroot()
        except ET.ParseError as e:
            raise ConfigPatchError(f"config patch {f} is not valid XML: {e}") from e
        if doc.tag not in ("clickhouse", "yandex"):
            raise ConfigPatchError(f"config patch {f} must have <clickhouse> as its root element, not <{doc.tag}>")
        _merge(root, doc)
    return root


def stack_name(stack_dir: Path) -> str:
    """A Keeper-path-safe name unique to ``stack_dir``: its base name + a path hash."""
    p = Path(stack_dir).resolve()
    base = re.sub(r"[^A-Za-z0-9_.-]+", "_", p.name)[:40] or "stack"
    digest = hashlib.sha256(str(p).encode()).hexdigest()[:10]
    return f"{base}-{digest}"


def _set(root: ET.Element, path: str, value: str) -> None:
    node = root
    for tag in path.split("/"):
        nxt = node.find(tag)
        if nxt is None:
            nxt = ET.SubElement(node, tag)
        node = nxt
    node.text = value


def render(
    *,
    zookeeper: Sequence[tuple[str, int]],
    name: str,
    config_d: Path = CONFIG_D,
    session_timeout_s: int | None = None,
    transactions: bool = True,
    member: "ClusterMember | None" = None,
    server_uuid: str | None = None,
    users_file: Path | None = None,
) -> str:
    """The full config text for one embedded stack (or one server of a cluster stack).

    Parameters
    ----------
    zookeeper
        ``(host, port)`` of each ZooKeeper node.
    name
        The stack's name (see :func:`stack_name`); its ZooKeeper root is
        ``/clickhouse_tx_stack/<name>`` (:func:`zookeeper_root`).
    session_timeout_s
        Overrides ``max_session_timeout`` from ``sessions.xml`` when given.
    transactions
        False leaves out ``transactions.xml``'s settings: a server as users run it
        without experimental transactions (modes ``staging``, ``dedup``, ``none``).
    member
        This server's place in a cluster stack (:class:`ClusterMember`): adds its
        ``macros``, the ``remote_servers`` cluster, and gives each shard its own
        KeeperMap prefix and each server its own transaction log. None: one server.
    server_uuid
        This server's identity (:func:`server_uuid`): its Keeper session node is
        registered under it. None: under ClickHouse's default path.
    users_file
        The users file the engine loads (:func:`render_users`); None: the stock
        ``server_patches/users.xml``.
    """
    if not zookeeper:
        raise ValueError("at least one ZooKeeper node is needed")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"stack name {name!r} may only hold letters, digits, '_', '.', '-'")
    root = load_patches([SERVER_DEFAULTS, *patch_files(config_d)])
    sessions = None if server_uuid is None else f"/sessions/{server_uuid}"
    _add_zookeeper(root, zookeeper, sessions)
    # Every stack, and every shard of a cluster stack, under its own ZooKeeper root
    # (chroot). Replicas of a shard share its root (and so its KeeperMap tables: the
    # registry), each with its own transaction log and Keeper session node.
    _set(root, "zookeeper/root", zookeeper_root(name, None if member is None else member.shard))
    map_prefix, txn_prefix = "", ""
    _add_macros(root, member or ClusterMember(shard=0, replica=0, servers=()))
    if member is not None:
        txn_prefix = f"/r{member.replica}"
        _add_cluster(root, member)
    if transactions:
        # ClickHouse creates missing ancestors of both paths itself (checked on 26.9).
        _set(root, "transaction_log/zookeeper_path", f"{txn_prefix}/txn")
    else:
        for tag in ("allow_experimental_transactions", "transaction_log", "transactions_info_log"):
            for old in root.findall(tag):
                root.remove(old)
    _set(root, "keeper_map_path_prefix", f"{map_prefix}/keeper_map")
    if root.find("user_directories/users_xml/path") is None:
        # chdb resolves a relative path against the rendered config's directory.
        _set(root, "user_directories/users_xml/path", str(users_file or USERS_XML))
    if session_timeout_s is not None:
        _set(root, "max_session_timeout", str(int(session_timeout_s)))
    ET.indent(root)
    header = (
        "<!-- Generated by server_patches.chdb_config from server_patches/config.d "
        "for one embedded stack; edit config.d, not this file. -->\n"
    )
    return header + ET.tostring(root, encoding="unicode") + "\n"


def _add_zookeeper(root: ET.Element, nodes: Sequence[tuple[str, int]], sessions_path: str | None) -> None:
    """The ``<zookeeper>`` section: the nodes, and where this server registers its session."""
    for old in root.findall("zookeeper"):
        root.remove(old)
    zk = ET.SubElement(root, "zookeeper")
    for host, port in nodes:
        node = ET.SubElement(zk, "node")
        ET.SubElement(node, "host").text = host
        ET.SubElement(node, "port").text = str(int(port))
    ET.SubElement(zk, "session_timeout_ms").text = "30000"
    if sessions_path is not None:
        # ClickHouse registers each Keeper session on <sessions_path>/zookeeper/<server
        # UUID> and checks that node's version in every multi-request, so a server
        # that registers on the node of another invalidates the other's session: its
        # next COMMIT is rolled back. chdb cannot load a server UUID (serverUUID() is
        # always zero), so each server gets a node path of its own instead.
        ET.SubElement(zk, "sessions_path").text = sessions_path


@dataclasses.dataclass(frozen=True)
class ClusterMember:
    """One server of a cluster stack: its shard and replica index and every server's
    ``(host, port)``, shards then replicas (the ``remote_servers`` cluster)."""

    shard: int
    replica: int
    servers: tuple[tuple[tuple[str, int], ...], ...]


def zookeeper_root(name: str, shard: int | None) -> str:
    """The ZooKeeper root (chroot) of the one-server stack ``name`` (``shard`` None), or of
    one shard of the cluster stack ``name``; it must exist before the servers under it
    start (the stack creates it)."""
    return f"{STACK_ZK_ROOT}/{name}" if shard is None else f"{STACK_ZK_ROOT}/{name}-s{shard}"


#: The cluster name the embedded stack's ``remote_servers`` section defines.
CLUSTER_NAME = "clickhouse_tx"


def _add_macros(root: ET.Element, member: ClusterMember) -> None:
    """``<macros>``: the server's shard and replica, as every node of a cluster has them,
    so ``Replicated*MergeTree`` paths with ``{shard}``/``{replica}`` (and the default
    replica path of an engine without arguments) resolve; a one-server stack is shard 0,
    replica r0."""
    for old in root.findall("macros"):
        root.remove(old)
    macros = ET.SubElement(root, "macros")
    ET.SubElement(macros, "shard").text = str(member.shard)
    ET.SubElement(macros, "replica").text = f"r{member.replica}"


def _add_cluster(root: ET.Element, member: ClusterMember) -> None:
    """The ``remote_servers`` cluster :data:`CLUSTER_NAME` listing every shard's replicas.

    The ports listed are the servers' HTTP ports: the embedded server speaks HTTP
    only, so ``Distributed`` tables and ``cluster()`` do not work on it (docs/deployment.md).
    """
    for old in root.findall("remote_servers"):
        root.remove(old)
    cluster = ET.SubElement(ET.SubElement(root, "remote_servers"), CLUSTER_NAME)
    for replicas in member.servers:
        shard = ET.SubElement(cluster, "shard")
        ET.SubElement(shard, "internal_replication").text = "true"
        for host, port in replicas:
            r = ET.SubElement(shard, "replica")
            ET.SubElement(r, "host").text = host
            ET.SubElement(r, "port").text = str(int(port))


def server_uuid(data_dir: Path) -> str:
    """The server's identity, kept in ``<data_dir>/uuid`` as ClickHouse keeps it in ``<path>/uuid``.

    Created (a random UUID) on the first start, the same on every later start of the
    server on that data, different for every other data directory.
    """
    f = Path(data_dir) / "uuid"
    try:
        return str(uuid.UUID(f.read_text().strip()))
    except (FileNotFoundError, ValueError):
        f.parent.mkdir(parents=True, exist_ok=True)
        value = str(uuid.uuid4())
        tmp = f.with_name("uuid.tmp")
        tmp.write_text(value)
        tmp.replace(f)
        return value


#: Settings newer than some ``compatibility`` versions whose "previous value" under that
#: setting is no behaviour a server of the version had: ``max_parts_to_move`` (24.10) is 0
#: there, which the engine reads as "move no part" (``TOO_MANY_PARTS`` on every MOVE
#: PARTITION), where a 24.8 server had no such limit. Under a compatibility older than the
#: first version, the profile gives the engine's own default instead: (first version, name, value).
NOT_IN_OLDER_VERSIONS = (("24.10", "max_parts_to_move", "1000"),)


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def render_users(compatibility: str | None) -> str:
    """The stock ``users.xml`` with ``<compatibility>`` in its ``default`` profile.

    ClickHouse's own ``compatibility`` setting: the engine (26.9) takes the defaults of
    the settings that changed since that version as they were then, e.g. ``async_insert``
    0 and ``deduplicate_insert`` ``backward_compatible_choice`` under 25.8. chdb applies
    the users file's default profile to every connection (checked on chdb 4.4).
    None: the stock file unchanged.
    """
    text = USERS_XML.read_text()
    if compatibility is None:
        return text
    root = ET.fromstring(text)
    _set(root, "profiles/default/compatibility", compatibility)
    for first, name, value in NOT_IN_OLDER_VERSIONS:
        if _version(compatibility) < _version(first):
            _set(root, f"profiles/default/{name}", value)
    ET.indent(root)
    header = "<!-- Generated by server_patches.chdb_config: server_patches/users.xml with a compatibility. -->\n"
    return header + ET.tostring(root, encoding="unicode") + "\n"


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def write(path: Path, *, data_dir: Path | None = None, compatibility: str | None = None, **kwargs: Any) -> Path:
    """Render (see :func:`render`) and write atomically to ``path``.

    ``data_dir`` is the server's data directory (default: ``data`` next to ``path``,
    the stack's layout); its :func:`server_uuid` is rendered unless ``server_uuid``
    is given. ``compatibility`` (``"25.8"``) writes ``users.xml`` next to ``path`` with
    it in the default profile (:func:`render_users`) and points the config at it.
    Runs in the launcher's process, each time a server starts.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if "server_uuid" not in kwargs:
        kwargs["server_uuid"] = server_uuid(data_dir if data_dir is not None else path.parent / "data")
    if compatibility is not None:
        users = path.parent / "users.xml"
        _write_atomically(users, render_users(compatibility))
        kwargs["users_file"] = users
    _write_atomically(path, render(**kwargs))
    return path


def server_setting(config_file: Path, tag: str) -> str | None:
    """A top-level setting's text from a rendered config (e.g. ``max_session_timeout``)."""
    e = ET.parse(config_file).getroot().find(tag)
    return None if e is None or e.text is None else e.text.strip()
