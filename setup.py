"""The compiled extensions: packrl.emulation._fastpack (the pack) and _fastaction (the action
decode); everything else is in pyproject.toml.

They are optional: without a C compiler packrl installs and packs and decodes through Numba and
Python instead (tests/test_fastpack.py and test_action_decode.py fail then, so CI notices)."""
import sys

import numpy
from setuptools import Extension, setup

setup(ext_modules=[Extension(
    f"packrl.emulation.{name}",
    [f"packrl/emulation/{name}.c"],
    include_dirs=[numpy.get_include()],
    extra_compile_args=[] if sys.platform == "win32" else ["-O3", "-std=gnu11"],
    optional=True,
) for name in ("_fastpack", "_fastaction")])
