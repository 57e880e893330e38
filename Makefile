# Everything a fresh machine needs: `make demo` (the main job) and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# CPU build (a local file on the project's machines); any torch >= 2.4 works: make TORCH_SPEC='torch>=2.4'
TORCH_SPEC ?= torch==2.13.0

.PHONY: install demo test bench wheel clean system-deps

install: $(VENV)/.installed $(VENV)/.fastpack

$(VENV)/.installed: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q '$(TORCH_SPEC)'
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $@

# the C extension (packrl/emulation/_fastpack.c) is built by the editable install: rebuilt when it changes
$(VENV)/.fastpack: packrl/emulation/_fastpack.c $(VENV)/.installed
	$(PY) -m pip install -q --no-deps -e .
	touch $@

# Debian's packages the sweep tests use (tests/test_sweep_postgres.py starts its own PostgreSQL server with initdb
# in a temporary folder; the dashboard check uses headless Chromium): installed when missing, as root with apt-get
system-deps:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  if ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || ! command -v chromium >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql chromium chromium-driver; \
	  fi; \
	fi

demo: install
	$(PY) examples/train_demo.py

test: system-deps install
	$(PY) -m ruff check .
	$(PY) -m pytest -q -n 2 --dist loadfile tests

bench: install
	for f in benchmarks/*.py; do $(PY) $$f || exit 1; done

# dist/: a manylinux wheel with the C extensions (python -m build, then auditwheel repair) and a pure-Python
# one without them (PACKRL_NO_EXT=1); scripts/build_wheels.py says how
wheel: install
	$(PY) scripts/build_wheels.py --out dist

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
