"""No import cycle in packrl: the import graph of every module, read with ``ast``; and no cycle
between its packages (the layers: ``packrl.emulation``, ``packrl.train``, and each top-level module
such as ``packrl.config`` as a unit of its own), so every import between packages points one way, down.

An edge A -> B is any import of B in A's source, at module level or inside a function (a lazy
import that closes a cycle is a cycle all the same), except inside ``if TYPE_CHECKING:``.
Importing ``a.b.c`` runs ``a/__init__`` and ``a/b/__init__`` first, so the edge also goes to
those packages, unless they are A's own packages (Python initialises those before A, and a
package's ``__init__`` importing its own submodules is how packages are built).
"""
from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import packrl

ROOT = Path(packrl.__file__).parent


def module_names(root: Path) -> dict[str, Path]:
    """Dotted name -> file, for every .py file of the package at ``root``."""
    names = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        names[".".join(parts)] = path
    return names


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def imported_names(tree: ast.AST, module: str, is_package: bool,
                   type_checking: bool = False) -> list[tuple[str, int]]:
    """(absolute dotted name, line) of every import in ``tree``, ``if TYPE_CHECKING:`` bodies left out
    (``type_checking=True``: only those bodies' imports). ``from X import y`` gives ``X.y`` (the caller keeps it
    if it is a module, else falls back to X)."""
    found: list[tuple[str, int]] = []
    package = module if is_package else module.rpartition(".")[0]

    def visit(node: ast.AST, inside: bool = False) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, True)
            for child in node.orelse:
                visit(child, inside)
            return
        if inside != type_checking:
            for child in ast.iter_child_nodes(node):
                visit(child, inside)
            return
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.append((base, node.lineno))
            found.extend((f"{base}.{alias.name}", node.lineno) for alias in node.names if alias.name != "*")
        for child in ast.iter_child_nodes(node):
            visit(child, inside)

    visit(tree)
    return found


def import_graph(root: Path, type_checking: bool = False) -> dict[str, dict[str, int]]:
    """module -> {imported module of the same package: line of the first such import} (``type_checking=True``:
    the imports under ``if TYPE_CHECKING:`` only)."""
    modules = module_names(root)
    graph: dict[str, dict[str, int]] = {}
    for name, path in modules.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
        is_package = path.name == "__init__.py"
        edges: dict[str, int] = {}
        tree = ast.parse(path.read_text(), str(path))
        for target, line in imported_names(tree, name, is_package, type_checking):
            if target not in modules:
                continue  # another library, or a name imported from a module (its module is listed too)
            parts = target.split(".")
            for i in range(1, len(parts) + 1):  # the target and the packages it runs first
                dep = ".".join(parts[:i])
                if dep in modules and dep not in own and dep != name:
                    edges.setdefault(dep, line)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, dict[str, int]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (iterative depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for start in sorted(graph):
        if state.get(start):
            continue
        path, stack = [start], [iter(sorted(graph[start]))]
        state[start] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph.get(nxt, {}))))
    return None


def describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in zip(cycle, cycle[1:])) + f" -> {cycle[-1]}"


def test_packrl_has_no_import_cycle():
    graph = import_graph(ROOT)
    assert len(graph) > 50 and "packrl.vector.base" in graph  # the walk found the package
    cycle = find_cycle(graph)
    assert cycle is None, f"import cycle in packrl: {describe(cycle, graph)}"


def reaches(graph: dict[str, dict[str, int]], start: str, goal: str) -> bool:
    """Whether ``goal`` is reachable from ``start`` along ``graph``'s edges."""
    seen, todo = {start}, [start]
    while todo:
        for nxt in graph.get(todo.pop(), {}):
            if nxt == goal:
                return True
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


def type_checking_cycles(root: Path) -> list[str]:
    """Every ``if TYPE_CHECKING:`` import A -> B that closes a cycle: B already reaches A by real imports (or by
    other TYPE_CHECKING imports: the typed graph is one graph), as 'A (line n) -> B'. Such an import hides a
    mutual dependency from the cycle test above, which leaves TYPE_CHECKING bodies out."""
    real, typed = import_graph(root), import_graph(root, type_checking=True)
    both = {m: {**real.get(m, {}), **typed.get(m, {})} for m in {*real, *typed}}
    return [f"{a} (line {line}) -> {b}" for a, edges in sorted(typed.items()) for b, line in sorted(edges.items())
            if reaches(both, b, a)]


def test_no_type_checking_import_closes_a_cycle():
    closing = type_checking_cycles(ROOT)
    assert len(import_graph(ROOT, type_checking=True)) > 50  # the walk read the modules
    assert closing == [], "a TYPE_CHECKING import closes an import cycle (" + str(len(closing)) + "): " + \
        "; ".join(closing)


def test_a_type_checking_import_that_closes_a_cycle_is_counted(tmp_path):
    # pkg.driver imports pkg.trainer only for its annotations, while pkg.trainer imports pkg.driver: a friend pair
    root = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/trainer.py": "from pkg.driver import Driver\n",
        "pkg/driver.py": ("from typing import TYPE_CHECKING\nimport typing\nif TYPE_CHECKING:\n    from pkg.trainer import T\n"
                          "if typing.TYPE_CHECKING:\n    from pkg import leaf\nelse:\n    import json\n"),
        "pkg/leaf.py": "if True:\n    from pkg import trainer\n",
    })
    assert find_cycle(import_graph(root)) is None  # the real imports alone: no cycle
    assert import_graph(root, type_checking=True)["pkg.driver"] == {"pkg.trainer": 4, "pkg.leaf": 6}
    # leaf -> trainer -> driver: both typed imports of driver close a cycle
    assert type_checking_cycles(root) == ["pkg.driver (line 6) -> pkg.leaf", "pkg.driver (line 4) -> pkg.trainer"]


def test_a_type_checking_import_down_the_layers_is_not_counted(tmp_path):
    root = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/trainer.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.driver import Driver\n",
        "pkg/driver.py": "x = 1\n",
    })
    assert import_graph(root, type_checking=True)["pkg.trainer"] == {"pkg.driver": 3}
    assert type_checking_cycles(root) == []


def unit_of(module: str) -> str:
    """The layer a module belongs to: its package under the root (``packrl.train.ppo`` -> ``packrl.train``),
    or the top-level module itself (``packrl.config``)."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, dict[str, int]]) -> dict[str, dict[str, tuple[str, int]]]:
    """unit -> {unit it imports: (the first module that does, its line)}. The root package is no unit:
    importing anything under it runs its ``__init__`` first."""
    out: dict[str, dict[str, tuple[str, int]]] = {}
    for module, edges in sorted(graph.items()):
        a = unit_of(module)
        if "." not in a:
            continue
        for target, line in sorted(edges.items()):
            b = unit_of(target)
            if "." in b and a != b:
                out.setdefault(a, {}).setdefault(b, (module, line))
    return out


def describe_units(cycle: list[str], units: dict[str, dict[str, tuple[str, int]]]) -> str:
    return " -> ".join(f"{a} ({units[a][b][0]} line {units[a][b][1]})" for a, b in zip(cycle, cycle[1:])) \
        + f" -> {cycle[-1]}"


def test_packrl_packages_import_one_way():
    units = package_graph(import_graph(ROOT))
    assert "packrl.emulation" in units and "packrl.train" in units  # the walk found the packages
    cycle = find_cycle({a: dict.fromkeys(edges, 0) for a, edges in units.items()})
    assert cycle is None, f"packages of packrl import each other: {describe_units(cycle, units)}"


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root / "pkg"


def test_a_function_level_cycle_through_a_package_init_is_found(tmp_path):
    # pkg.a.m imports pkg.b.n (whose package __init__ runs first); pkg.b's __init__ imports pkg.a lazily
    root = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a/__init__.py": "from pkg.a.m import thing\n",
        "pkg/a/m.py": "from pkg.b.n import other\nthing = 1\n",
        "pkg/b/__init__.py": "def make():\n    from pkg import a\n    return a\n",
        "pkg/b/n.py": "other = 2\n",
    })
    graph = import_graph(root)
    cycle = find_cycle(graph)
    assert cycle is not None and set(cycle) == {"pkg.a", "pkg.a.m", "pkg.b"}
    assert "pkg.b (line 2) -> pkg.a" in describe(cycle, graph)


def test_type_checking_imports_and_own_packages_are_not_edges(tmp_path):
    root = _write(tmp_path, {
        "pkg/__init__.py": "from pkg.a import m\n",
        "pkg/a/__init__.py": "from . import m\n",
        "pkg/a/m.py": ("from typing import TYPE_CHECKING\nfrom .. import b\nif TYPE_CHECKING:\n"
                       "    from pkg.c import x\nelse:\n    import json\n"),
        "pkg/b.py": "import os\n",
        "pkg/c.py": "from pkg.a.m import y\n",
    })
    graph = import_graph(root)
    assert graph["pkg.a.m"] == {"pkg.b": 2}
    assert graph["pkg.a"] == {"pkg.a.m": 1} and graph["pkg"] == {"pkg.a": 1, "pkg.a.m": 1}
    assert graph["pkg.c"] == {"pkg.a": 1, "pkg.a.m": 1}
    assert find_cycle(graph) is None


def test_a_cycle_between_packages_without_a_module_cycle_is_found(tmp_path):
    # pkg.a.x imports pkg.b.y; pkg.b.z imports pkg.a.w lazily: no module imports itself back, the packages do
    root = _write(tmp_path, {
        "pkg/__init__.py": "",
        "pkg/a/__init__.py": "",
        "pkg/a/x.py": "from pkg.b.y import thing\n",
        "pkg/a/w.py": "other = 1\n",
        "pkg/b/__init__.py": "",
        "pkg/b/y.py": "thing = 1\n",
        "pkg/b/z.py": "def f():\n    from pkg.a.w import other\n    return other\n",
        "pkg/top.py": "from pkg.a.x import thing\n",
    })
    graph = import_graph(root)
    assert find_cycle(graph) is None
    units = package_graph(graph)
    assert units["pkg.top"] == {"pkg.a": ("pkg.top", 1)}
    cycle = find_cycle({a: dict.fromkeys(edges, 0) for a, edges in units.items()})
    assert cycle is not None and set(cycle) == {"pkg.a", "pkg.b"}
    assert "pkg.b (pkg.b.z line 2) -> pkg.a" in describe_units(cycle, units)
