"""The one compiled extension: packrl.emulation._fastpack (everything else is in pyproject.toml).

It is optional: without a C compiler packrl installs and packs through Numba and Python instead
(tests/test_fastpack.py fails then, so CI notices)."""
import sys

import numpy
from setuptools import Extension, setup

setup(ext_modules=[Extension(
    "packrl.emulation._fastpack",
    ["packrl/emulation/_fastpack.c"],
    include_dirs=[numpy.get_include()],
    extra_compile_args=[] if sys.platform == "win32" else ["-O3", "-std=gnu11"],
    optional=True,
)])
