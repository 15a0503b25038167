"""Creating ZooKeeper nodes over the client protocol, against the stack's real ZooKeeper."""

from __future__ import annotations

import subprocess
import uuid

import pytest

from server_patches import zk_client, zookeeper
from server_patches.stack_files import StackInfo


def _ls(address: str, path: str) -> str:
    argv = [
        zookeeper.find_java(),
        "-cp",
        zookeeper.classpath(),
        "org.apache.zookeeper.ZooKeeperMain",
        "-server",
        address,
    ]
    done = subprocess.run(argv, input=f"ls {path}\nquit\n", capture_output=True, text=True, timeout=60)
    return done.stdout


def test_a_path_and_its_ancestors_are_created_and_creating_them_again_changes_nothing(stack: StackInfo) -> None:
    top = f"/ctx_zk_client_{uuid.uuid4().hex[:8]}"
    zk_client.create_paths(stack.zookeeper, [f"{top}/a/b", f"{top}/c"])
    zk_client.create_paths(stack.zookeeper, [f"{top}/a/b"])

    assert "[a, c]" in _ls(stack.zookeeper, top)
    assert "[b]" in _ls(stack.zookeeper, f"{top}/a")


def test_a_path_zookeeper_refuses_is_named_with_its_error_code(stack: StackInfo) -> None:
    top = f"/ctx_zk_client_{uuid.uuid4().hex[:8]}"
    # a "." component is not a valid ZooKeeper path: BadArguments (-8)
    with pytest.raises(zk_client.ZooKeeperRequestError, match=rf"refused to create {top}/\.: error -8"):
        zk_client.create_paths(stack.zookeeper, [f"{top}/./x"])


def test_the_ancestors_of_a_path_come_before_it() -> None:
    assert zk_client.ancestors_and_self("/a/b/c") == ["/a", "/a/b", "/a/b/c"]
