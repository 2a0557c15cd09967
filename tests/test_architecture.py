"""docs/ARCHITECTURE.md holds: contract citations resolve, packages import as its layers allow, no cycles.

The code cites its contracts as "docs/ARCHITECTURE.md, contract N: title"; these tests fail when a
citation names a contract the page lacks (or under another title), when a contract's "Held by" file is
gone, when a package imports a layer above it, and when the top-level imports of the four packages form
a cycle (reported with its path). The import graph is read statically with ``ast``; one test then
imports every module for real. Runs in seconds (the real imports dominate, and are shared with the rest
of the suite).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"
PACKAGES = ("data", "rollouts", "rewards", "rl")
# What each package may import among the four (prefixes of module names), as the "Layers" table says.
ALLOWED = {
    "rollouts": ("rollouts",),
    "data": ("data", "rollouts.protocol"),
    "rewards": ("rewards", "rollouts.protocol", "rollouts.masks", "rollouts.trajectory"),
    "rl": ("rl", "rollouts", "rewards", "data"),
}
# ... and inside rollouts, the two lowest layers.
ALLOWED_INSIDE = {
    "rollouts.protocol": ("rollouts.protocol",),
    "rollouts.masks": ("rollouts.protocol", "rollouts.masks"),
}

HEADING = re.compile(r"^### Contract (\d+): (.+)$", re.MULTILINE)
# "contract 3", "contracts 3, 4 and 7", optionally followed by ": title"
CITATION = re.compile(
    r"\bcontracts?\s+(\d+(?:(?:\s*,\s*|\s+and\s+)\d+)*)(?::\s+([a-z][a-z\s]*[a-z]))?", re.IGNORECASE
)


def _words(text: str) -> str:
    return " ".join(text.lower().split())


def _contracts() -> dict[int, tuple[str, str]]:
    """Contract number -> (title, section text), from the page's headings."""
    text = DOC.read_text()
    found = list(HEADING.finditer(text))
    sections = {}
    for i, m in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(text)
        sections[int(m.group(1))] = (m.group(2).strip(), text[m.end() : end])
    return sections


def _cited_files() -> list[Path]:
    files = [f for pkg in PACKAGES for f in sorted((ROOT / pkg).rglob("*.py"))]
    files += [f for f in sorted((ROOT / "tests").rglob("*.py")) if f.resolve() != Path(__file__).resolve()]
    return files


def test_contracts_are_numbered_anchored_and_name_files_that_exist():
    contracts = _contracts()
    assert sorted(contracts) == list(range(1, len(contracts) + 1)) and len(contracts) >= 7, sorted(contracts)
    text = DOC.read_text()
    for number, (title, section) in contracts.items():
        assert f'<a id="contract-{number}"></a>\n### Contract {number}: {title}' in text, number
        held = re.search(r"^Held by: (.+?)(?:\n\n|\Z)", section, re.MULTILINE | re.DOTALL)
        assert held, f"contract {number} names no file (a 'Held by:' line)"
        paths = re.findall(r"`([\w/.]+\.py)`", held.group(1))
        assert paths, f"contract {number}: 'Held by:' names no .py file"
        missing = [p for p in paths if not (ROOT / p).is_file()]
        assert not missing, f"contract {number} is held by files that do not exist: {missing}"


def test_every_contract_citation_resolves_to_a_section():
    contracts = _contracts()
    problems = []
    for path in _cited_files():
        text = path.read_text()
        rel = path.relative_to(ROOT)
        if "DESIGN.md" in text:
            problems.append(
                f"{rel}: cites DESIGN.md, which is not in the repository (cite docs/ARCHITECTURE.md)"
            )
        cites = list(CITATION.finditer(text))
        if cites and "docs/ARCHITECTURE.md" not in text:
            problems.append(f"{rel}: cites a contract without naming docs/ARCHITECTURE.md")
        for m in cites:
            line = text.count("\n", 0, m.start()) + 1
            numbers = [int(n) for n in re.findall(r"\d+", m.group(1))]
            for n in numbers:
                if n not in contracts:
                    problems.append(f"{rel}:{line}: contract {n} is not a section of docs/ARCHITECTURE.md")
            if m.group(2) and len(numbers) == 1 and numbers[0] in contracts:
                title = _words(contracts[numbers[0]][0])
                if not _words(m.group(2)).startswith(title):
                    problems.append(
                        f"{rel}:{line}: contract {numbers[0]} is titled {title!r}, cited as {m.group(2)!r}"
                    )
    assert not problems, "\n".join(problems)


# -- the import graph ------------------------------------------------------------------------------------


def _modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package), for every module of the four packages."""
    modules = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            modules[".".join(parts[:-1] if is_package else parts)] = (path, is_package)
    return modules


def _import_nodes(tree: ast.Module, *, top_level: bool):
    """The module's import statements: those that run when it is imported (module body, including ``if``,
    ``try``, ``with`` and class bodies, but not ``if TYPE_CHECKING:``), or every one when not top_level."""
    if not top_level:
        yield from (n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom))
        return
    todo = list(tree.body)
    while todo:
        node = todo.pop(0)
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            test = node.test
            if getattr(test, "id", getattr(test, "attr", None)) != "TYPE_CHECKING":
                todo += node.body
            todo += node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
        elif isinstance(node, ast.With | ast.ClassDef):
            todo += node.body


def _import_graph(*, top_level: bool) -> dict[str, list[tuple[str, int]]]:
    """Module -> [(module of the four packages it imports, line)]; ``from pkg import name`` points at
    ``pkg.name`` when that is a module, else at ``pkg``."""
    modules = _modules()
    graph = {}
    for name, (path, is_package) in modules.items():
        package = name if is_package else name.rpartition(".")[0]
        edges = []
        for node in _import_nodes(ast.parse(path.read_text(), str(path)), top_level=top_level):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    edges.append((target, node.lineno))
        graph[name] = edges
    return graph


def _cycles(graph: dict[str, list[tuple[str, int]]]) -> list[list[str]]:
    """One cycle per back edge of a depth-first search, as the path of modules that closes it."""
    state, path, cycles = {}, [], []

    def visit(module: str) -> None:
        state[module] = "open"
        path.append(module)
        for target, _ in graph[module]:
            if state.get(target) == "open":
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module)
    return cycles


def test_top_level_imports_form_no_cycle():
    cycles = _cycles(_import_graph(top_level=True))
    assert not cycles, "import cycles among the packages' top-level imports:\n" + "\n".join(
        " -> ".join(c) for c in cycles
    )


def test_cycle_finder_reports_the_path():
    # Guards the check above: a cycle of three is found, with its path, and a diamond is not a cycle.
    cyclic = {"a": [("b", 1)], "b": [("c", 1)], "c": [("a", 1)], "d": [("a", 1)]}
    assert _cycles(cyclic) == [["a", "b", "c", "a"]]
    assert _cycles({"a": [("b", 1), ("c", 1)], "b": [("d", 1)], "c": [("d", 1)], "d": []}) == []


def test_packages_import_only_the_layers_below():
    problems = []
    modules = _modules()
    for name, edges in _import_graph(top_level=False).items():
        inside = next((k for k in ALLOWED_INSIDE if name == k or name.startswith(k + ".")), None)
        allowed = ALLOWED_INSIDE[inside] if inside else ALLOWED[name.split(".")[0]]
        for target, line in edges:
            if not any(target == a or target.startswith(a + ".") for a in allowed):
                rel = modules[name][0].relative_to(ROOT)
                problems.append(f"{rel}:{line}: {name} imports {target} (allowed: {', '.join(allowed)})")
    assert not problems, "imports against the layers of docs/ARCHITECTURE.md:\n" + "\n".join(problems)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_every_module_imports():
    failed = {}
    for name in _modules():
        try:
            importlib.import_module(name)
        except Exception as err:  # collect them all: one failure should not hide the next
            failed[name] = f"{type(err).__name__}: {err}"
    assert not failed, "\n".join(f"{k}: {v}" for k, v in failed.items())
