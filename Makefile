# chatstream: `make demo` runs the demo site, `make test` runs the whole suite.
# Both build their own virtualenvs, so a fresh clone needs nothing but Pythons: 3.12+ for the
# demo, and 3.11, 3.12 and 3.13 for the whole matrix (a missing one is skipped, saying so).

SHELL := /bin/bash
.DEFAULT_GOAL := help

HOST ?= 127.0.0.1
PORT ?= 8000
SIM_PORT ?= 8001
DJANGO ?= 6.1
VENV ?= .venv

# Find an interpreter that really runs: pythonX.Y on the PATH, else pyenv's own installs (pyenv
# shims fail unless their version is selected, so each is tried with --version). The demo's
# .venv takes PYTHON=..., else the newest of 3.13 and 3.12.
find_python = $(shell \
  for c in $(1); do \
    if [ -x "$$c" ] || command -v "$$c" >/dev/null 2>&1; then \
      if "$$c" --version >/dev/null 2>&1; then echo "$$c"; exit 0; fi; \
    fi; \
  done)
PYENV_ROOT ?= $(HOME)/.pyenv
# A working interpreter of Python $(1) (3.11, 3.12, ...), or nothing.
python_for = $(call find_python,python$(1) $(sort $(wildcard $(PYENV_ROOT)/versions/$(1).*/bin/python3)))
PYTHON ?= $(or $(call python_for,3.13),$(call python_for,3.12))

# The supported matrix (pyproject's classifiers): Django 5.2 on Python 3.11 to 3.13, Django 6.0
# and 6.1 on 3.12 and 3.13. Two corners run the whole suite: the newest (Python 3.13, Django 6.1,
# the newest releases, under uvloop) and the oldest (Python 3.11, Django 5.2 and every
# dependency at its floor, from .ci/constraints-lowest.txt, under asyncio's loop). Three more
# pairs run QUICK_TESTS, so that every Python and every Django version runs again beside
# another: 3.11 and 5.2 with the newest releases of the rest, 3.12 with 5.2 and with 6.0 (the
# one Django version no corner runs). The remaining pairs (3.13/5.2, 3.13/6.0, 3.12/6.1) add
# nothing a version-specific difference could hide in: `make test-quick QUICK_PAIRS="..."` runs
# them. A Python the machine lacks is skipped, saying so (in CI: an error).
QUICK_PAIRS ?= 3.11/5.2 3.12/5.2 3.12/6.0
QUICK_TESTS := tests/test_e2e.py tests/test_servers.py tests/test_serving.py \
  tests/test_access.py tests/test_checks.py tests/test_migrations.py tests/test_fast_streams.py \
  tests/test_lifecycle.py

.PHONY: help demo test test-corners test-newest test-oldest test-quick test-fast pair suite venv lint \
  bench clean browser gettext messages test-real-servers

help:
	@echo "make demo          set up and run the demo at http://$(HOST):$(PORT) (login demo / demo)"
	@echo "make test          set up and run the whole test suite: lint, then every Django/Python"
	@echo "                   pair pyproject supports (the whole suite on the newest and the oldest)"
	@echo "make test-fast     the suite on Django $(DJANGO) only, skipping the browser"
	@echo "make lint          ruff and mypy"
	@echo "make messages      update chatstream's catalogues ($(LANGS)) from the code, and compile them"
	@echo "make bench         run the benchmarks in bench/"
	@echo "make test-real-servers  the tool loop against llama.cpp's server (tests/real_servers)"

# $(VENV) holds the project with EXTRAS, Django $(DJANGO) and, if given, CONSTRAINTS.
EXTRAS ?= dev
CONSTRAINTS ?=
$(VENV)/.installed-$(DJANGO): pyproject.toml $(CONSTRAINTS)
	@test -n "$(PYTHON)" || { echo "No working Python 3.12+ found; set PYTHON=/path/to/python3.12" >&2; exit 1; }
	@echo "Using $(PYTHON) ($$($(PYTHON) --version)) for $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e ".[$(EXTRAS)]" "django==$(DJANGO).*" \
	  $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
	rm -f $(VENV)/.installed-*; touch $@

venv: $(VENV)/.installed-$(DJANGO)

browser:
	@bash scripts/install-chromium.sh

gettext:
	@bash scripts/install-gettext.sh

# chatstream's translations (docs/languages.md): the catalogues of the shipped languages made
# again from the code and templates (new strings come in empty, changed ones fuzzy: translate
# them in each .po), then compiled to the .mo files the wheel ships. Run in chatstream/, with
# no settings: makemessages configures its own. tests/test_translations.py fails until both
# are done.
LANGS ?= de fr es
messages: venv gettext
	cd chatstream && env -u DJANGO_SETTINGS_MODULE $(abspath $(VENV))/bin/python -m django makemessages \
	  $(addprefix -l ,$(LANGS)) --no-location --no-obsolete
	cd chatstream && env -u DJANGO_SETTINGS_MODULE $(abspath $(VENV))/bin/python -m django compilemessages

# The demo runs with DEBUG on: its static files are served, and its settings accept their
# public key (with DEBUG off they refuse it: a deployment sets DJANGO_SECRET_KEY).
demo: export DJANGO_DEBUG := 1
demo: venv
	$(VENV)/bin/python manage.py migrate --noinput
	$(VENV)/bin/python manage.py chatstream_demo_user
	@echo "Demo: http://$(HOST):$(PORT)/  (login demo / demo); simulated upstream on $(SIM_PORT). Ctrl-C stops both."
	@trap 'kill 0' EXIT INT TERM; \
	  $(VENV)/bin/python manage.py chatstream_simulator --host 127.0.0.1 --port $(SIM_PORT) & \
	  CHATSTREAM_SIMULATOR_URL=http://127.0.0.1:$(SIM_PORT)/v1 \
	  $(VENV)/bin/python -m uvicorn project.asgi:application --host $(HOST) --port $(PORT) --no-access-log

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

test: browser gettext lint test-corners test-quick test-real-servers

# The two corners side by side: much of each suite waits on servers and browsers, so on two
# cores both take ~19 minutes together instead of ~33 one after the other (and every test must
# hold on a busy machine anyway). Each writes its own log, printed whole once both have ended.
test-corners:
	@mkdir -p test-artifacts; \
	$(MAKE) test-newest > test-artifacts/newest.log 2>&1 & newest=$$!; \
	$(MAKE) test-oldest > test-artifacts/oldest.log 2>&1 & oldest=$$!; \
	wait $$newest; newest_rc=$$?; wait $$oldest; oldest_rc=$$?; \
	echo "*** The newest corner (exit $$newest_rc):"; cat test-artifacts/newest.log; \
	echo "*** The oldest corner (exit $$oldest_rc):"; cat test-artifacts/oldest.log; \
	[ $$newest_rc -eq 0 ] && [ $$oldest_rc -eq 0 ]

test-newest:
	$(MAKE) pair PY=3.13 DJANGO=6.1 PAIR_VENV=.venv LOOP=uvloop EXTRAS=dev COVERAGE=1

test-oldest:
	$(MAKE) pair PY=3.11 DJANGO=5.2 PAIR_VENV=.venv-lowest LOOP=asyncio EXTRAS=test \
	  CONSTRAINTS=.ci/constraints-lowest.txt

# The quick pairs QUICK_JOBS at a time (much of each is building its venv and waiting on
# servers), each into a log of its own, printed whole in order once all have ended.
QUICK_JOBS ?= 2
test-quick:
	@mkdir -p test-artifacts; rm -f test-artifacts/quick-*; \
	printf '%s\n' $(QUICK_PAIRS) | xargs -P $(QUICK_JOBS) -I PAIR sh -c ' \
	  log=test-artifacts/quick-$$(echo PAIR | tr / -); \
	  $(MAKE) pair PY=$${0%/*} DJANGO=$${0#*/} EXTRAS=test \
	    PYTEST_ARGS="$(QUICK_TESTS) $(PYTEST_ARGS)" > $$log.log 2>&1; echo $$? > $$log.rc' PAIR; \
	failed=0; for pair in $(QUICK_PAIRS); do \
	  log=test-artifacts/quick-$$(echo $$pair | tr / -); rc=$$(cat $$log.rc); \
	  echo "*** Quick pair $$pair (exit $$rc):"; cat $$log.log; [ "$$rc" = 0 ] || failed=1; \
	done; [ $$failed = 0 ]

# One pair of the matrix, in a venv of its own:
#   make pair PY=3.12 DJANGO=6.0 [LOOP=uvloop] [PYTEST_ARGS=...]
PAIR_VENV ?= .venv-py$(PY)-django$(DJANGO)
pair:
	@py="$(call python_for,$(PY))"; \
	if [ -z "$$py" ]; then \
	  if [ -n "$$CI" ]; then echo "CI: no working Python $(PY) for Django $(DJANGO)." >&2; exit 1; fi; \
	  echo "*** Skipping Django $(DJANGO) on Python $(PY): this machine has no working python$(PY)."; \
	  exit 0; \
	fi; \
	echo "*** Django $(DJANGO) on Python $(PY) ($(or $(LOOP),asyncio) loop)"; \
	$(MAKE) suite PYTHON="$$py" VENV=$(PAIR_VENV) DJANGO=$(DJANGO) LOOP=$(LOOP)

# PostgreSQL and Redis are used when they answer here (CI requires them: see .ci/run).
export CHATSTREAM_TEST_POSTGRES ?= postgres://postgres@127.0.0.1:5432/postgres
export CHATSTREAM_TEST_REDIS ?= redis://127.0.0.1:6379/0

# A suite takes ~5 minutes alone, and a corner (browsers, real servers, coverage) 20-30 beside
# the other on two cores; one that hangs anyway (a stuck thread at exit, say) is stopped
# (where coreutils' timeout is installed). Each test has its own limit too (pytest-timeout).
SUITE_TIMEOUT ?= 2700
WITH_TIMEOUT := $(shell command -v timeout >/dev/null 2>&1 && echo timeout -k 60 $(SUITE_TIMEOUT))

# COVERAGE=1 (the newest corner) measures line and branch coverage of chatstream, the servers
# and commands the tests start in subprocesses included, and ends with a report of the files
# not wholly covered, with their missing lines; the run fails when the total (lines and
# branches together) is below fail_under (95 %), all of it set in pyproject's [tool.coverage].
# The figure is that of a run with PostgreSQL and Redis present (as in CI): without them, the
# tests that need them are skipped and the total falls below the gate. Other runs skip it.
COVERAGE ?=
COVERAGE_ARGS := $(if $(COVERAGE),--cov --cov-report=term)

suite: venv
	CHATSTREAM_TEST_LOOP=$(or $(LOOP),asyncio) $(WITH_TIMEOUT) $(VENV)/bin/python -m pytest \
	  $(COVERAGE_ARGS) $(PYTEST_ARGS)

test-fast: venv
	$(VENV)/bin/python -m pytest -m "not browser" $(PYTEST_ARGS)

# The tool loop against a real OpenAI-compatible server: llama.cpp's (xllamacpp's prebuilt build)
# on loopback, serving a tiny scripted model that gguf writes (docs/tools.md, "Against a real
# server"). In a venv of its own; the whole suite skips these tests where the two are missing.
REAL_VENV ?= .venv-real
REAL_SERVER_PACKAGES := xllamacpp==2026.10.11549 gguf==0.19.0

test-real-servers:
	$(MAKE) venv VENV=$(REAL_VENV) EXTRAS=test
	$(REAL_VENV)/bin/python -m pip install -q $(REAL_SERVER_PACKAGES)
	$(REAL_VENV)/bin/python -m pytest tests/real_servers -v --durations=0 $(PYTEST_ARGS)

bench: venv
	$(VENV)/bin/python bench/bench_parser.py
	$(VENV)/bin/python bench/bench_proxy.py

clean:
	rm -rf .venv .venv-* db.sqlite3 test-artifacts .coverage .coverage.*
