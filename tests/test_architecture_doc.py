"""The contributor's pages stay true to the tree: every path docs/architecture.md names exists, and
docs/development.md's repository map names every module under packrl/ (issue 38's docs items)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "architecture.md"
DEVELOPMENT = ROOT / "docs" / "development.md"
TOP = ("packrl", "tests", "docs", "benchmarks", "examples", "scripts")
PATH = re.compile(r"`((?:%s)/[\w./-]*)`" % "|".join(TOP))  # `packrl/train/storage.py`, `tests/test_x.py`, `packrl/vector/`
DOTTED = re.compile(r"`(packrl(?:\.\w+)+)`")  # `packrl.train.storage`, `packrl.envs.register`


def _named_paths(text: str) -> list[str]:
    return sorted(set(PATH.findall(text)))


def _module_exists(dotted: str) -> bool:
    """A dotted name is a module or package of packrl, or an attribute named after one (its longest module prefix
    exists and at most one name follows it)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:n])
        if base.with_suffix(".py").is_file() or (base / "__init__.py").is_file():
            return len(parts) - n <= 1
    return False


def test_architecture_doc_exists_and_names_paths():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    assert len(_named_paths(text)) >= 30, "docs/architecture.md should name the modules and tests it describes"


def test_every_path_architecture_names_exists():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    missing = [p for p in _named_paths(text) if not (ROOT / p).exists()]
    assert not missing, f"docs/architecture.md names paths that do not exist: {missing}"
    missing = [d for d in sorted(set(DOTTED.findall(text))) if not _module_exists(d)]
    assert not missing, f"docs/architecture.md names modules that do not exist: {missing}"


def _map_rows() -> list[tuple[str, str]]:
    """The repository map's rows of docs/development.md as (path cell, holds cell)."""
    text = DEVELOPMENT.read_text(encoding="utf-8")
    section = text.split("## Layout of the repository", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and not set(cells[0]) <= set("-: "):
            rows.append((cells[0], "|".join(cells[1:])))
    return rows


def _in_map(module: Path, rows: list[tuple[str, str]]) -> bool:
    rel = module.relative_to(ROOT).as_posix()
    folder, stem = rel.rsplit("/", 1)[0] + "/", module.stem
    named = re.compile(r"`%s(?:`|[ (.,:])" % re.escape(stem))  # `storage` or `storage (...)` in the holds cell
    for path_cell, holds in rows:
        if f"`{rel}`" in path_cell:
            return True
        if f"`{folder}`" in path_cell and named.search(holds):
            return True
    return False


def test_development_map_names_every_module():
    rows = _map_rows()
    assert rows, "docs/development.md has no repository map"
    modules = [p for p in sorted((ROOT / "packrl").rglob("*.py"))
               if not p.name.startswith("__") and "__pycache__" not in p.parts]
    missing = [p.relative_to(ROOT).as_posix() for p in modules if not _in_map(p, rows)]
    assert not missing, f"docs/development.md's repository map leaves out: {missing}"


def test_the_map_check_finds_a_missing_module():
    rows = [("`packrl/train/`", "`ppo`, `storage` (the rollout's buffers)"), ("`packrl/history.py`", "history")]
    assert _in_map(ROOT / "packrl/train/storage.py", rows)
    assert _in_map(ROOT / "packrl/history.py", rows)
    assert not _in_map(ROOT / "packrl/train/rollout.py", rows)
    assert not _in_map(ROOT / "packrl/printing.py", rows)


BENCHMARK_HELPERS = {"common.py", "targets.py", "train_continuous.py"}  # imported by the scripts, no claim of their own


def test_benchmarks_readme_has_one_section_per_script():
    text = (ROOT / "benchmarks" / "README.md").read_text()
    sections = re.findall(r"^## (\S+\.py)$", text, re.M)
    scripts = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if p.name not in BENCHMARK_HELPERS)
    assert sorted(sections) == scripts, (sorted(set(scripts) - set(sections)), sorted(set(sections) - set(scripts)))
    for helper in BENCHMARK_HELPERS:
        assert f"`{helper}`" in text, f"benchmarks/README.md does not say what {helper} is"
