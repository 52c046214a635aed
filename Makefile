# The commands of the README:
#   make demo   runs the main job (a two-worker crawl) on embedded servers
#   make check  the developer's loop: ruff, mypy and the fast tier (the tests
#               that start no worker process, cluster or whole-system run)
#   make test   sets up and runs the whole test suite, with ruff and mypy (CI)
#   make docs   builds the documentation site (also part of make lint)
# Both create the virtualenv .venv and install what is missing, redis-server,
# faketime and valgrind included (from Debian's packages).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: demo check test lint docs redis-server faketime valgrind

$(VENV)/.runtime: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	touch $@

$(VENV)/.dev: requirements-dev.txt requirements-deploy.txt $(VENV)/.runtime
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

redis-server:
	@command -v redis-server >/dev/null || { \
	  $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q redis-server; }

# libfaketime, for the skewed-clock test (tests/test_clocks.py).
faketime:
	@command -v faketime >/dev/null || { \
	  $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q faketime; }

# valgrind, for figure i of bench.compare (callgrind counts Redis's
# instructions per call; tests/test_bench.py).
valgrind:
	@command -v valgrind >/dev/null || { \
	  $(SUDO) apt-get update -q && $(SUDO) apt-get install -y -q valgrind; }

demo: redis-server $(VENV)/.runtime
	$(PY) -m devtools.demo

lint: $(VENV)/.dev docs
	$(PY) -m ruff check crawler devtools bench tests
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

# The documentation site (mkdocs.yml) into site/; warnings are errors, and
# the reference pages are generated from the code (devtools/docs_hooks.py).
docs: $(VENV)/.dev
	$(VENV)/bin/mkdocs build --strict --quiet

# Two processes, each test file in one of them (its servers and keys stay its own).
# The tiers are pytest marks (tests/tiers.py); FAST selects the fast tier.
FAST := not workers and not cluster and not slow

check: redis-server faketime lint
	$(PY) -m pytest -n 2 --dist loadfile -m "$(FAST)"

test: redis-server faketime valgrind lint
	$(PY) -m pytest -n 2 --dist loadfile
