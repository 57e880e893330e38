"""Imports sit at the top of their module. A function-level import stays only where it keeps a path fast and
torch-free (the ``packrl`` command's fronts, checkpoint metadata, config and env ids), imports an optional extra
(matplotlib, wandb, tensorboard, optuna, pettingzoo, ray, triton) or a Numba env on first use; issue 38 bounds
them at 60, and each such import must name something heavy or optional, never a plain stdlib module."""
import ast
import sys
from pathlib import Path

PACKRL = Path(__file__).resolve().parent.parent / "packrl"
LIMIT = 60
LIGHT_STDLIB = set(sys.stdlib_module_names) - {"tomllib", "ctypes"}  # what a function never needs to defer


def function_imports() -> list[tuple[str, int, str]]:
    """(file, line, imported module) for every import inside a function body."""
    found = []
    for path in sorted(PACKRL.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))

        def walk(node: ast.AST, inside: bool) -> None:
            for child in ast.iter_child_nodes(node):
                if inside and isinstance(child, ast.Import):
                    found.extend((str(path.relative_to(PACKRL.parent)), child.lineno, a.name) for a in child.names)
                elif inside and isinstance(child, ast.ImportFrom):
                    found.append((str(path.relative_to(PACKRL.parent)), child.lineno,
                                  "." * child.level + (child.module or "")))
                walk(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

        walk(tree, False)
    return found


def test_function_level_imports_stay_few():
    statements = {(f, line) for f, line, _ in function_imports()}
    assert len(statements) <= LIMIT, f"{len(statements)} function-level imports in packrl (at most {LIMIT}): " \
        + ", ".join(f"{f}:{line}" for f, line in sorted(statements))


def test_no_function_defers_a_light_stdlib_module():
    deferred = [f"{f}:{line} {name}" for f, line, name in function_imports() if name.split(".")[0] in LIGHT_STDLIB]
    assert not deferred, f"import these at the top of their module: {deferred}"
