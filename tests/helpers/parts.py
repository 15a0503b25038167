"""``--part I/N``: one of N parts of the selected tests (``make test-slow PART=I``).

A pytest plugin of the suite (``pytest_plugins`` in ``tests/conftest.py``). It runs after
``-m`` has selected (``trylast``), so the parts share out what the run would have run.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--part",
        default=None,
        metavar="I/N",
        help="run the I-th of N parts of the selected tests (make test-slow PART=I): whole modules, "
        "dealt to the parts by their count of tests so the parts take about as long",
    )


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the tests of part I of N (``--part I/N``), after ``-m`` has selected: modules
    dealt out, largest first, to the part with the fewest tests so far, so every part
    starts a module's fixtures once."""
    spec = config.getoption("--part")
    if not spec:
        return
    index, _, count = str(spec).partition("/")
    i, n = int(index), int(count)
    if not 1 <= i <= n:
        raise pytest.UsageError(f"--part {spec}: want I/N with 1 <= I <= N")
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    load = [0] * n
    part_of: dict[str, int] = {}
    for name in sorted(modules, key=lambda m: (-len(modules[m]), m)):
        k = load.index(min(load))
        part_of[name] = k + 1
        load[k] += len(modules[name])
    keep = [it for it in items if part_of[it.nodeid.split("::")[0]] == i]
    config.hook.pytest_deselected(items=[it for it in items if part_of[it.nodeid.split("::")[0]] != i])
    items[:] = keep
