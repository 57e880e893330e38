"""What a user who installs packrl expects: an MIT LICENSE and an SPDX license string, py.typed shipped,
classifiers, the command's version equal to the package's, and READMEs whose links and repository paths
resolve inside the repository."""
import re
import subprocess
import sys
from pathlib import Path

import packrl

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
READMES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_PATH = re.compile(r"`(\.{0,2}/?[\w.\-]+/[\w.\-/]*)`")
TOP_LEVEL = {"packrl", "tests", "benchmarks", "examples", ".ci"}  # the folders a path in a README can start with


def inside_repository(path: Path) -> bool:
    return path.exists() and path.resolve().is_relative_to(ROOT)


def test_license_is_mit_with_an_spdx_string():
    assert PYPROJECT["project"]["license"] == "MIT"  # a string, not the table that warns on every install
    assert (ROOT / "LICENSE").read_text().startswith("MIT License")
    requires = PYPROJECT["build-system"]["requires"]
    setuptools = next(r for r in requires if r.startswith("setuptools"))
    assert int(re.search(r">=(\d+)", setuptools).group(1)) >= 77  # the first setuptools that reads SPDX strings


def test_py_typed_ships_and_classifiers_say_so():
    assert (ROOT / "packrl" / "py.typed").exists()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["packrl"]
    classifiers = PYPROJECT["project"]["classifiers"]
    assert "Typing :: Typed" in classifiers and any(c.startswith("Programming Language :: Python :: 3.") for c in classifiers)
    minimum = PYPROJECT["project"]["requires-python"].removeprefix(">=")
    assert f"Programming Language :: Python :: {minimum}" in classifiers


def test_version_is_the_package_version():
    assert packrl.__version__ == PYPROJECT["project"]["version"]
    proc = subprocess.run([sys.executable, "-m", "packrl", "--version"], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == f"packrl {packrl.__version__}"


def test_readme_links_resolve_inside_the_repository():
    checked = 0
    for readme in READMES:
        text = readme.read_text()
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = readme.parent / target.split("#")[0]
            assert inside_repository(path), f"{readme.name}: link {target!r} does not resolve inside the repository"
            checked += 1
        for target in CODE_PATH.findall(text):  # paths named in code spans, read from the repository root
            if target.startswith(".") or target.split("/")[0] in TOP_LEVEL:
                assert inside_repository(ROOT / target), f"{readme.name}: `{target}` is not a path in the repository"
                checked += 1
    assert checked >= 10  # the READMEs do point at files: a pattern that matched nothing would prove nothing
