"""The extras in pyproject.toml: user-facing ones (``pip install 'packrl[ray]'``, ``[sb3]``, ``[mujoco]``,
``[minigrid]``, ``[wandb]``, ``[plot]``, ``[pettingzoo]``, and ``[all]`` for every one of them), and the project's own
``.[dev,bench]`` that ``make install`` uses: every third-party module the tests, examples and benchmarks
import must come from it, directly or through what it requires (so a fresh machine's ``make install`` runs
them all)."""
import ast
import importlib.metadata
import re
import sys
from pathlib import Path

from packaging.requirements import Requirement

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
EXTRAS = PYPROJECT["project"]["optional-dependencies"]
USER_FACING = {"ray": "ray", "sb3": "stable-baselines3", "mujoco": "mujoco", "minigrid": "minigrid", "wandb": "wandb",
               "plot": "matplotlib", "pettingzoo": "pettingzoo", "sweep": "optuna"}
SOURCES = ("tests", "examples", "benchmarks")
FROM_SHARED_TOOLS = {"machine_line"}  # benchmarks/common.py imports it from ../shared/tools when that exists
SCRIPTS = {p.stem for p in (ROOT / "scripts").glob("*.py")}  # tests/test_packaging.py imports scripts/build_wheels.py


def normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(requirements, extras=EXTRAS):
    """Normalized names of every distribution ``requirements`` install, transitively: packrl's own extras are
    read from ``extras``, every other distribution's requirements from its installed metadata."""
    seen, todo = set(), [(Requirement(r), "") for r in requirements]
    while todo:
        req, extra = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = normalize(req.name)
        if name == "packrl":
            todo += [(Requirement(r), "") for e in sorted(req.extras) for r in extras[e]]
            continue
        key = (name, tuple(sorted(req.extras)))
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue  # not installed here: its own requirements are unknown, its name still counts
        for text in requires:
            sub = Requirement(text)
            todo += [(sub, e) for e in ("", *sorted(req.extras))]
    return {name for name, _ in seen}


def optional(node, parents):
    """Whether an import sits in a ``try`` that handles ImportError (an optional dependency)."""
    for parent in parents:
        if isinstance(parent, ast.Try) and any(
                h.type is None or any(isinstance(n, ast.Name) and n.id in ("ImportError", "ModuleNotFoundError")
                                      for n in ast.walk(h.type)) for h in parent.handlers):
            return True
    return False


def imported_modules():
    """Top-level names of the third-party modules the tests, examples and benchmarks import unconditionally,
    each with one file that imports it."""
    found = {}
    for folder in SOURCES:
        # a script imports its siblings by their bare names (benchmarks/ray.py is a sibling, not Ray)
        local = {"packrl", *SOURCES, *FROM_SHARED_TOOLS, *SCRIPTS} | {p.stem for p in (ROOT / folder).glob("*.py")}
        for path in sorted((ROOT / folder).glob("*.py")):
            tree = ast.parse(path.read_text())
            stack = [(tree, [])]
            while stack:
                node, parents = stack.pop()
                names = []
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module]
                for name in names:
                    top = name.split(".")[0]
                    if top not in local and top not in sys.stdlib_module_names and not optional(node, parents):
                        found.setdefault(top, path.relative_to(ROOT))
                stack += [(child, [*parents, node]) for child in ast.iter_child_nodes(node)]
    return found


def missing_from(requirements, extras=EXTRAS):
    """Modules imported by the tests, examples or benchmarks whose distribution ``requirements`` do not
    install: {module: (file, distributions)}."""
    installed = closure(requirements, extras)
    providers = importlib.metadata.packages_distributions()
    missing = {}
    for module, where in imported_modules().items():
        dists = {normalize(d) for d in providers.get(module, [])}
        if not dists & installed:
            missing[module] = (str(where), sorted(dists))
    return missing


def test_user_facing_extras_name_their_package_and_all_holds_every_one():
    for extra, package in USER_FACING.items():
        assert package in closure([f"packrl[{extra}]"]), extra
    assert closure(["packrl[all]"]) >= closure([f"packrl[{e}]" for e in USER_FACING])
    (only,) = EXTRAS["all"]
    assert Requirement(only).extras == set(USER_FACING), "[all] is exactly the user-facing extras"


def test_mujoco_extra_is_gymnasiums_own():
    (req,) = map(Requirement, EXTRAS["mujoco"])
    assert normalize(req.name) == "gymnasium" and req.extras == {"mujoco"}


def test_matplotlib_and_pettingzoo_are_extras_not_dependencies():
    """A plain install has neither (tests/test_optional_imports.py runs packrl without them); [all] and the
    project's dev extra have both, so make install keeps them."""
    base = {normalize(Requirement(r).name) for r in PYPROJECT["project"]["dependencies"]}
    for package in ("matplotlib", "pettingzoo"):
        assert package not in closure(PYPROJECT["project"]["dependencies"]), package
        assert package not in base and package in closure(["packrl[all]"]) and package in closure(["packrl[dev]"])


def test_make_install_installs_everything_the_tests_examples_and_benchmarks_import():
    makefile = (ROOT / "Makefile").read_text()
    assert "-e '.[dev,bench]'" in makefile
    requirements = PYPROJECT["project"]["dependencies"] + ["packrl[dev,bench]"]
    assert missing_from(requirements) == {}
    for package in ("ray", "stable-baselines3", "supersuit", "hypothesis", "wandb", "minigrid", "tensorboard"):
        assert package in closure(requirements), package


def test_the_check_above_can_fail():
    """Take Ray out of dev and SB3 out of bench: the check names the modules they provided."""
    trimmed = {**EXTRAS, "dev": [r for r in EXTRAS["dev"] if not r.startswith("packrl[")] + ["packrl[envs,wandb]"],
               "bench": [r for r in EXTRAS["bench"] if not r.startswith("packrl[")] + ["packrl[envs]"]}
    missing = missing_from(PYPROJECT["project"]["dependencies"] + ["packrl[dev,bench]"], trimmed)
    assert {"ray", "stable_baselines3"} <= set(missing), missing
