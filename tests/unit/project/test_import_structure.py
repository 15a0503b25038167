"""The project's structure: no module reaches into another's privates, no import cycle,
no module over :data:`MAX_MODULE_LINES`, no ``getattr`` probe of a contract method.

Walks the source of every module of ``clickhouse_tx``, ``spark_datasource``,
``server_patches`` and ``benchmarks`` with :mod:`ast` (nothing is imported), every
import counted wherever it sits: at the top, inside a function, or under
``TYPE_CHECKING``. Tests are left out: they may test private helpers directly.

The privacy rule: a name starting with ``_`` (not a dunder) is private to what holds
it. A private attribute of a module (``decision_log._filesystem``) may not be imported
or reached (``module._name``) by any other module; a private submodule or subpackage
(``clickhouse_tx.client._transport``) may be used by the modules of the package holding it
(``clickhouse_tx.*``) and by its own modules, nobody else.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").is_file())
PACKAGES = ("clickhouse_tx", "spark_datasource", "server_patches", "benchmarks")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    """Dotted name -> source file of every module of the project's packages."""
    out: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[_module_name(path)] = path
    return out


MODULES = project_modules()


def _is_package(name: str) -> bool:
    return MODULES.get(name, Path()).name == "__init__.py"


def _resolve(importer: str, module: str | None, level: int) -> str:
    """The absolute module a ``from`` import names (relative imports resolved)."""
    if level == 0:
        return module or ""
    base = importer.split(".") if _is_package(importer) else importer.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _in_project(name: str) -> bool:
    return name.split(".")[0] in PACKAGES


def imports_of(importer: str, tree: ast.AST) -> list[tuple[str, int]]:
    """Every project name ``importer`` uses through an import, as a full dotted path.

    ``from a.b import c`` gives ``a.b.c``; ``import a.b as m`` then ``m._x`` gives
    ``a.b._x`` too, so reaching into a module by attribute is caught like an import.
    """
    found: list[tuple[str, int]] = []
    aliases: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _in_project(a.name):
                    found.append((a.name, node.lineno))
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(importer, node.module, node.level)
            if not _in_project(base):
                continue
            for a in node.names:
                full = f"{base}.{a.name}"
                found.append((full, node.lineno))
                if full in MODULES:
                    aliases[a.asname or a.name] = full
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases:
            found.append((f"{aliases[node.value.id]}.{node.attr}", node.lineno))
    return found


def _private(segment: str) -> bool:
    return segment.startswith("_") and not (segment.startswith("__") and segment.endswith("__"))


def _private_package(name: str) -> str | None:
    """The innermost private package or module ``name`` lies in (``a._t.x`` -> ``a._t``)."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        if _private(parts[i - 1]):
            return ".".join(parts[:i])
    return None


def privacy_violation(importer: str, target: str) -> str | None:
    """Why ``importer`` may not use ``target`` (a dotted project name), or None."""
    parts = target.split(".")
    for i, seg in enumerate(parts):
        if not _private(seg):
            continue
        owner = ".".join(parts[:i])
        if importer.startswith(owner + ".") and _is_package(owner):
            continue  # a module of the package holding the private submodule
        shared = _private_package(owner)
        if shared is not None and (importer == shared or importer.startswith(shared + ".")):
            continue  # inside the same private package
        if importer == owner:
            continue
        return f"{importer} uses {target}: {seg} is private to {owner}"
    return None


def type_checking_lines(tree: ast.AST) -> set[int]:
    """Lines inside ``if TYPE_CHECKING:`` blocks: imports there never run, so they make no cycle."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for child in node.body:
                lines.update(range(child.lineno, (child.end_lineno or child.lineno) + 1))
    return lines


def import_graph() -> dict[str, set[str]]:
    """Module -> project modules it imports at run time (any import statement outside
    ``if TYPE_CHECKING:``)."""
    graph: dict[str, set[str]] = {}
    for name, path in MODULES.items():
        deps: set[str] = set()
        tree = ast.parse(path.read_text(), str(path))
        typing_only = type_checking_lines(tree)
        for target, lineno in imports_of(name, tree):
            if lineno in typing_only:
                continue
            parts = target.split(".")
            # the longest prefix that is a module: a.b.c where c is a class -> a.b
            for i in range(len(parts), 0, -1):
                mod = ".".join(parts[:i])
                if mod in MODULES:
                    if mod != name:
                        deps.add(mod)
                    break
        graph[name] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a closed path of modules, or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep) :] + [dep]
            if dep not in state and (cycle := visit(dep)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


MAX_FUNCTION_LINES = 80


def function_lengths() -> dict[tuple[str, str], int]:
    """(module, Class.function) -> lines from ``def`` to its last line, for every function."""
    out: dict[tuple[str, str], int] = {}
    for name, path in MODULES.items():

        def walk(node: ast.AST, prefix: str, name: str = name) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[(name, prefix + child.name)] = (child.end_lineno or child.lineno) - child.lineno + 1
                    walk(child, f"{prefix}{child.name}.", name)
                elif isinstance(child, ast.ClassDef):
                    walk(child, f"{prefix}{child.name}.")

        walk(ast.parse(path.read_text(), str(path)), "")
    return out


def test_no_function_of_the_project_is_over_80_lines() -> None:
    lengths = function_lengths()
    long = {k: n for k, n in lengths.items() if n > MAX_FUNCTION_LINES}
    assert long == {}


def test_the_walk_sees_every_package_of_the_project() -> None:
    assert {
        "clickhouse_tx.protocol.coordinator",
        "spark_datasource.sink.writer",
        "server_patches.stack",
        "benchmarks.pipeline",
    } <= set(MODULES)


def test_no_module_of_the_project_imports_a_private_name_of_another_module() -> None:
    violations = []
    for name, path in MODULES.items():
        for target, line in imports_of(name, ast.parse(path.read_text(), str(path))):
            why = privacy_violation(name, target)
            if why:
                violations.append(f"{path.relative_to(ROOT)}:{line}: {why}")
    assert violations == []


def test_no_import_cycle_exists_between_the_modules_of_the_project() -> None:
    assert find_cycle(import_graph()) is None


def imported_test_modules(path: Path) -> list[str]:
    """The ``test_*`` modules a file under ``tests/`` imports (``tests.x.test_y`` or ``.test_y``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        found += [n for n in names if n.split(".")[-1].startswith("test_")]
    return found


#: What each package may import, within its top-level package ("" is the top-level
#: ``__init__``; a package may always import itself). The tree of docs/design.md §6:
#: ``client`` imports only the foundation; the protocol never imports ``modes``,
#: ``store``, ``sharding``, ``verify`` or ``admin`` (it reaches them through the contracts
#: of ``interfaces``); the Kafka source never imports the sink.
_BASE = ("errors", "retry", "interfaces", "ids")
_BELOW_MODES = (*_BASE, "client", "conversion", "store", "protocol")
MAY_IMPORT: dict[str, dict[tuple[str, ...], tuple[str, ...]]] = {
    "clickhouse_tx": {
        _BASE: _BASE,
        ("client",): _BASE,
        ("conversion",): (*_BASE, "client"),
        ("store",): (*_BASE, "client"),
        ("protocol",): (*_BASE, "client", "conversion"),
        ("modes",): _BELOW_MODES,
        ("sharding",): _BELOW_MODES,
        ("jobs",): (*_BELOW_MODES, "modes"),
        ("foreach",): (*_BELOW_MODES, "modes"),
        ("verify",): (*_BELOW_MODES, "modes", "sharding", "jobs"),
        ("testing",): (*_BELOW_MODES, "modes", "sharding", "jobs"),
        ("admin",): (*_BELOW_MODES, "modes", "sharding", "verify", "jobs", "foreach"),
        ("factory", "__main__", ""): (
            *_BELOW_MODES,
            *("modes", "sharding", "jobs", "foreach", "verify", "testing", "admin", "factory", ""),
        ),
    },
    "spark_datasource": {
        ("worker_gc",): (),
        ("options",): (),
        ("kafka",): ("worker_gc", "options"),
        ("sink",): ("worker_gc", "options"),
        ("datasource",): ("worker_gc", "options", "sink"),
        ("foreach",): ("worker_gc", "options", "sink", "datasource"),
        ("option_docs", "testing", ""): (
            "worker_gc",
            "options",
            "kafka",
            "sink",
            "datasource",
            "foreach",
            "",
        ),
    },
}


def _unit(module: str) -> tuple[str, str]:
    top, _, rest = module.partition(".")
    return top, rest.split(".")[0]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Every import of ``graph`` (module -> modules it imports) that :data:`MAY_IMPORT` does
    not allow, or that comes from a module no package of it holds."""
    found = []
    for importer, targets in sorted(graph.items()):
        top, mine = _unit(importer)
        if top not in MAY_IMPORT:
            continue
        allowed = next((ok for units, ok in MAY_IMPORT[top].items() if mine in units), None)
        for target in sorted(t for t in targets if t.split(".")[0] == top):
            theirs = _unit(target)[1]
            if allowed is None or (theirs != mine and theirs not in allowed):
                found.append(f"{importer} imports {target}")
    return found


def test_no_module_imports_a_package_its_package_may_not_import() -> None:
    graph = {m: set() for m in MODULES}
    for name, path in MODULES.items():
        for target, _ in imports_of(name, ast.parse(path.read_text(), str(path))):
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target:
                graph[name].add(target)
    assert upward_imports(graph) == []


def test_the_layer_check_finds_the_protocol_importing_the_store_and_an_unranked_package() -> None:
    graph = {
        "clickhouse_tx.protocol.coordinator": {"clickhouse_tx.store.registry", "clickhouse_tx.client.http"},
        "clickhouse_tx.newpkg.x": {"clickhouse_tx.errors"},
        "spark_datasource.kafka.reader": {"spark_datasource.sink.writer", "clickhouse_tx.modes"},
    }
    assert upward_imports(graph) == [
        "clickhouse_tx.newpkg.x imports clickhouse_tx.errors",
        "clickhouse_tx.protocol.coordinator imports clickhouse_tx.store.registry",
        "spark_datasource.kafka.reader imports spark_datasource.sink.writer",
    ]


def test_no_test_module_imports_from_another_test_module() -> None:
    # Shared test code lives in tests/helpers (or a conftest fixture): a test module
    # imported by another runs its module-level code twice and ties their edits together.
    imports = {
        str(path.relative_to(ROOT)): imported_test_modules(path)
        for path in sorted((ROOT / "tests").rglob("*.py"))
        if imported_test_modules(path)
    }
    assert imports == {}


def test_the_test_import_check_sees_absolute_and_relative_imports_of_test_modules(tmp_path: Path) -> None:
    src = tmp_path / "m.py"
    src.write_text(
        "from tests.torture.test_driver_kill import run\n"
        "from .test_cli import _cli\n"
        "import tests.spark.test_kafka_reader as r\n"
        "from tests.helpers.torture import run_child\n"
        "from tests.unit import fakes\n"
    )
    assert imported_test_modules(src) == ["tests.torture.test_driver_kill", "test_cli", "tests.spark.test_kafka_reader"]


@pytest.mark.parametrize(
    "importer, target, allowed",
    [
        ("spark_datasource.sink.overwrite", "spark_datasource.sink.writer._coordinator", False),
        ("clickhouse_tx.verify.verifier", "clickhouse_tx.store.decision_log._filesystem", False),
        ("clickhouse_tx.verify.verifier", "clickhouse_tx.store.decision_log.FileDecisionLog", True),
        ("clickhouse_tx.client.http", "clickhouse_tx.client._transport.pool.SessionPool", True),
        ("clickhouse_tx.client._transport.pool", "clickhouse_tx.client._transport.errors._map", True),
        ("spark_datasource.sink.writer", "clickhouse_tx.client._transport.pool.SessionPool", False),
        ("clickhouse_tx.verify.verifier", "clickhouse_tx.client._transport.pool._helper", False),
        ("clickhouse_tx.store.decision_log", "clickhouse_tx.store.decision_log._VERSION", True),
    ],
)
def test_the_privacy_rule_forbids_reaching_into_modules_and_allows_a_package_its_private_package(
    importer: str, target: str, allowed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(MODULES, "clickhouse_tx", ROOT / "clickhouse_tx" / "__init__.py")
    assert (privacy_violation(importer, target) is None) is allowed


def test_the_cycle_finder_reports_a_cycle_through_a_function_level_import() -> None:
    tree = ast.parse("def f():\n    from .writer import ClickHouseTxBatchWriter\n")
    assert ("spark_datasource.sink.writer.ClickHouseTxBatchWriter", 2) in imports_of(
        "spark_datasource.sink.overwrite", tree
    )
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_cycle_check_walks_server_patches_as_well() -> None:
    graph = import_graph()
    assert {"server_patches.engine", "server_patches.sessions"} <= graph["server_patches.http_server"]
    assert "server_patches.sessions" in graph["server_patches.engine"]


#: Cycles made only of imports under ``TYPE_CHECKING`` that are not broken yet: the
#: modules still know each other's types. Remove an entry when its cycle is gone.
TYPING_CYCLES_NOT_YET_BROKEN: set[frozenset[str]] = set()


def test_no_import_cycle_exists_even_through_imports_for_type_checking_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "type_checking_lines", lambda tree: set())
    graph = import_graph()
    cycles = []
    while (cycle := find_cycle(graph)) is not None:
        cycles.append(frozenset(cycle))
        graph[cycle[0]].discard(cycle[1])
    assert set(cycles) == TYPING_CYCLES_NOT_YET_BROKEN


MAX_MODULE_LINES = 400

#: Modules over the cap until they are split, with their lines when they were listed.
#: The test fails when one grows, shrinks under the cap (drop it from here) or is gone.
MODULE_LINES_NOT_YET_SPLIT = {
    "clickhouse_tx.store.registry": 481,
    "server_patches.http_handler": 432,
    "server_patches.kafka_broker": 565,
    "server_patches.kafka_front": 503,
}


def module_lines() -> dict[str, int]:
    """Dotted name -> lines of its source, for every module of the project's packages."""
    return {name: len(path.read_text().splitlines()) for name, path in MODULES.items()}


def test_no_module_of_the_project_is_over_the_cap_except_those_listed_until_they_are_split() -> None:
    lines = module_lines()
    over = {name: n for name, n in lines.items() if n > MAX_MODULE_LINES}
    # Compared whole, so the failure shows the dict to paste after a split or a merge.
    assert over == MODULE_LINES_NOT_YET_SPLIT


def test_every_module_listed_as_not_yet_split_is_still_over_the_cap() -> None:
    lines = module_lines()
    stale = {name: lines.get(name) for name in MODULE_LINES_NOT_YET_SPLIT if lines.get(name, 0) <= MAX_MODULE_LINES}
    assert stale == {}


def contract_members(path: Path = ROOT / "clickhouse_tx" / "interfaces.py") -> set[str]:
    """The methods and attributes the ``Protocol`` classes of ``interfaces.py`` declare."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id == "Protocol" for b in node.bases):
            for item in node.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
    return {n for n in names if not n.startswith("__")}


def contract_probes(tree: ast.AST, members: set[str]) -> list[tuple[int, str]]:
    """(line, name) of every ``getattr``/``hasattr`` whose second argument is a string
    literal naming a contract member: a capability asked for instead of declared."""
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in members
        ):
            found.append((node.lineno, str(node.args[1].value)))
    return found


def test_no_module_of_clickhouse_tx_probes_for_a_method_of_the_contracts() -> None:
    members = contract_members()
    assert {"renew", "transition_many", "forget", "list_txn", "root_uri", "list_open_all_modes"} <= members
    probes = [
        f"{path.relative_to(ROOT)}:{line}: getattr probe of {name!r}"
        for mod, path in MODULES.items()
        if mod.split(".")[0] == "clickhouse_tx"
        for line, name in contract_probes(ast.parse(path.read_text(), str(path)), members)
    ]
    assert probes == []


def test_the_probe_check_finds_getattr_and_hasattr_of_a_contract_member_only() -> None:
    tree = ast.parse(
        "renew = getattr(mode_io, 'renew', None)\n"
        "ok = hasattr(registry, 'forget')\n"
        "code = getattr(exc, 'code', None)\n"
        "other = getattr(x, name)\n"
    )
    assert contract_probes(tree, {"renew", "forget"}) == [(1, "renew"), (2, "forget")]


def _imported_modules(name: str) -> set[str]:
    """The project modules ``name`` imports anywhere (top level, in a function, for typing)."""
    tree = ast.parse(MODULES[name].read_text(), str(MODULES[name]))
    out: set[str] = set()
    for target, _ in imports_of(name, tree):
        parts = target.split(".")
        out |= {".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in MODULES}
    return out


def test_no_runtime_module_of_spark_datasource_imports_its_testing_harness() -> None:
    runtime = [n for n in MODULES if n.startswith("spark_datasource.") and not n.startswith("spark_datasource.testing")]
    offenders = {
        n: sorted(m for m in _imported_modules(n) if m.startswith("spark_datasource.testing")) for n in runtime
    }
    assert {n: ms for n, ms in offenders.items() if ms} == {}
    assert "spark_datasource.sink.writer" in runtime and "spark_datasource.testing.pipeline" in MODULES


def test_only_the_testing_harness_of_spark_datasource_imports_server_patches() -> None:
    importers = {
        n
        for n in MODULES
        if n.split(".")[0] in ("clickhouse_tx", "spark_datasource")
        and any(m.startswith("server_patches") for m in _imported_modules(n))
    }
    assert importers and all(n.startswith("spark_datasource.testing.") for n in importers)


def test_no_module_of_server_patches_imports_one_that_imports_it_even_for_typing() -> None:
    names = [n for n in MODULES if n.startswith("server_patches.")]
    graph = {n: {m for m in _imported_modules(n) if m.startswith("server_patches.") and m != n} for n in names}
    assert find_cycle(graph) is None
