"""The compiled extensions: packrl.emulation._fastpack (the pack) and _fastaction (the action
decode); everything else is in pyproject.toml.

They are optional: without a C compiler packrl installs and packs and decodes on its checked
Python paths instead (tests/test_fastpack.py and test_action_decode.py fail then, so CI notices).
PACKRL_NO_EXT=1 leaves them out on purpose: a pure-Python wheel (py3-none-any) that installs anywhere.
``make wheel`` builds both kinds (tests/test_packaging.py installs each into a fresh venv)."""
import os
import sys

import numpy
from setuptools import Extension, setup

WITHOUT_EXTENSIONS = os.environ.get("PACKRL_NO_EXT", "") not in ("", "0")

setup(ext_modules=[] if WITHOUT_EXTENSIONS else [Extension(
    f"packrl.emulation.{name}",
    [f"packrl/emulation/{name}.c"],
    depends=["packrl/emulation/_tree.h"],
    include_dirs=[numpy.get_include()],
    extra_compile_args=[] if sys.platform == "win32" else ["-O3", "-std=gnu11"],
    optional=True,
) for name in ("_fastpack", "_fastaction")])
