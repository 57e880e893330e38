"""What a user who installs packrl expects: an MIT LICENSE and an SPDX license string, py.typed shipped,
classifiers, the command's version equal to the package's, READMEs whose links and repository paths
resolve inside the repository, and wheels (``make wheel``: manylinux with the C extensions, pure Python
without) that install offline into a fresh venv and pack."""
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

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


# ---------------------------------------------------------------- the wheels (make wheel)

sys.path.insert(0, str(ROOT / "scripts"))
import build_wheels  # noqa: E402 - the project's own wheel command, scripts/build_wheels.py

# Run inside the fresh venv: packrl must come from the installed wheel, pack and unpack a nested space exactly,
# step an emulated gymnasium env through the compiled pack and decode its actions, and say which extensions it has.
INSIDE = r"""
import json, sys
import gymnasium as gym
import numpy as np
from gymnasium import spaces
import packrl
from packrl.emulation import Layout, emulate
from packrl.emulation import actions, compiled

space = spaces.Dict({"pos": spaces.Box(-1.0, 1.0, (3,), np.float64), "n": spaces.Discrete(5, start=-2),
                     "bits": spaces.MultiBinary(4), "t": spaces.Tuple((spaces.Box(0, 2**63 - 1, (), np.int64),
                                                                       spaces.Box(0, 1, (2,), np.bool_)))})
space.seed(3)
layout = Layout.from_space(space)
rng = np.random.default_rng(3)
for i in range(20):
    # gymnasium cannot sample the full int64 range: that leaf comes from numpy, its extremes first
    big = np.int64([2**63 - 1, 0][i] if i < 2 else rng.integers(0, 2**63 - 1))
    x = {k: space[k].sample() for k in ("pos", "n", "bits")} | {"t": (big, space["t"][1].sample())}
    assert space.contains(x)
    back = layout.unpack(layout.pack(x))
    assert back["pos"].tobytes() == x["pos"].tobytes() and back["pos"].dtype == np.float64
    assert int(back["n"]) == x["n"] and np.array_equal(back["bits"], x["bits"])
    assert back["t"][0] == x["t"][0] and np.array_equal(back["t"][1], x["t"][1])
env = emulate(gym.make("CartPole-v1"))
obs, _ = env.reset(seed=0)
for _ in range(5):
    obs, *_ = env.step(np.array([1]))
print(json.dumps({"file": packrl.__file__, "version": packrl.__version__, "fast_pack": compiled._fastpack is not None,
                  "fast_action": actions._fastaction is not None, "obs": obs.tolist()}))
"""


def fresh_venv(folder: Path) -> Path:
    """A new venv without pip whose site-packages also sees the project venv's (a .pth line, read after its own
    site-packages): the dependencies are there, packrl is not (the project venv's editable finder is a .pth
    hook that a plain path line does not run)."""
    # quiet: this file's tests take at most 3 s
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = folder / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    deps = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (Path(site) / "project_dependencies.pth").write_text("\n".join(deps) + "\n")
    return python


def install_and_run(wheel: Path, folder: Path) -> dict:
    python = fresh_venv(folder)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                    # quiet: this file's tests take at most 3 s
                    "--no-cache-dir", "-q", str(wheel)], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # quiet: this file's tests take at most 3 s
    done = subprocess.run([str(python), "-c", INSIDE], capture_output=True, text=True, timeout=600, cwd=folder, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(result["file"]).resolve().is_relative_to(folder.resolve()), result["file"]  # the wheel, not the tree
    assert result["version"] == packrl.__version__
    command = subprocess.run([str(folder / "bin" / "packrl"), "--version"], capture_output=True, text=True, env=env,
                             # quiet: this file's tests take at most 3 s
                             cwd=folder, timeout=120)
    assert command.stdout.strip() == f"packrl {packrl.__version__}", command.stderr[-2000:]  # the console script
    return result


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    return build_wheels.build(tmp_path_factory.mktemp("wheels"))


def test_the_wheel_command_builds_a_manylinux_wheel_with_the_extensions_and_a_pure_one_without(wheels):
    manylinux, pure = wheels["manylinux"], wheels["pure"]
    assert re.fullmatch(r"packrl-[\d.]+-cp\d+-cp\d+-(manylinux\w*\.)*manylinux_2_\d+_\w+\.whl", manylinux.name), manylinux
    assert [Path(n).stem.split(".")[0] for n in build_wheels.extensions_in(manylinux)] == ["_fastaction", "_fastpack"]
    assert pure.name == f"packrl-{packrl.__version__}-py3-none-any.whl" and build_wheels.extensions_in(pure) == []
    with zipfile.ZipFile(manylinux) as z:
        names = z.namelist()
    assert "packrl/py.typed" in names and "packrl/cli.py" in names
    assert not any(n.startswith(("tests/", "benchmarks/", "examples/", "scripts/")) for n in names)


@pytest.mark.parametrize("kind", ["manylinux", "pure"])
def test_a_wheel_installs_offline_into_a_fresh_venv_and_packs(wheels, kind, tmp_path):
    result = install_and_run(wheels[kind], tmp_path / "venv")
    assert result["fast_pack"] is result["fast_action"] is (kind == "manylinux")
    reference = emulate_cartpole_here()
    assert result["obs"] == reference  # the same rows with and without the C extension


def test_without_a_c_compiler_the_wheel_still_builds_and_works(tmp_path):
    """setup.py marks the extensions optional: a compiler that fails leaves them out, and packrl still packs."""
    (wheel,) = build_wheels.build(tmp_path / "wheels", ("plain",), env={"CC": "false"}).values()
    assert build_wheels.extensions_in(wheel) == []
    result = install_and_run(wheel, tmp_path / "venv")
    assert result["fast_pack"] is result["fast_action"] is False


def emulate_cartpole_here():
    import gymnasium as gym
    import numpy as np

    from packrl.emulation import emulate

    env = emulate(gym.make("CartPole-v1"))
    obs, _ = env.reset(seed=0)
    for _ in range(5):
        obs, *_ = env.step(np.array([1]))
    return obs.tolist()
