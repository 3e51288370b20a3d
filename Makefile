# chatstream: `make demo` runs the demo site, `make test` runs the whole suite.
# Both build their own virtualenvs, so a fresh clone needs nothing but a Python 3.11+.

SHELL := /bin/bash
.DEFAULT_GOAL := help

HOST ?= 127.0.0.1
PORT ?= 8000
SIM_PORT ?= 8001
DJANGO ?= 6.1
VENV ?= .venv

# Find an interpreter that really runs: honour PYTHON=..., else the newest of
# python3.13 / python3.12 (pyenv shims fail unless their version is selected, so
# check with --version), else pyenv's own installs, else python3.
find_python = $(shell \
  for c in $(1); do \
    if [ -x "$$c" ] || command -v "$$c" >/dev/null 2>&1; then \
      if "$$c" --version >/dev/null 2>&1; then echo "$$c"; exit 0; fi; \
    fi; \
  done)
PYENV_ROOT ?= $(HOME)/.pyenv
PY_CANDIDATES := python3.13 python3.12 \
  $(sort $(wildcard $(PYENV_ROOT)/versions/3.13*/bin/python3)) \
  $(sort $(wildcard $(PYENV_ROOT)/versions/3.12*/bin/python3))
PYTHON ?= $(call find_python,$(PY_CANDIDATES))
PY311 ?= $(call find_python,python3.11 $(sort $(wildcard $(PYENV_ROOT)/versions/3.11*/bin/python3)) python3)

.PHONY: help demo test test-django52 test-fast venv lint bench clean services browser

help:
	@echo "make demo          set up and run the demo at http://$(HOST):$(PORT) (login demo / demo)"
	@echo "make test          set up and run the whole test suite (Django $(DJANGO) and Django 5.2 LTS)"
	@echo "make test-fast     the suite on Django $(DJANGO) only, skipping the browser"
	@echo "make bench         run the benchmarks in bench/"

$(VENV)/.installed-$(DJANGO): pyproject.toml
	@test -n "$(PYTHON)" || { echo "No working Python 3.12+ found; set PYTHON=/path/to/python3.12" >&2; exit 1; }
	@echo "Using $(PYTHON) ($$($(PYTHON) --version)) for $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install -q --upgrade pip
	$(VENV)/bin/python -m pip install -q -e ".[test,bench]" "django==$(DJANGO).*"
	rm -f $(VENV)/.installed-*; touch $@

venv: $(VENV)/.installed-$(DJANGO)

browser:
	@bash scripts/install-chromium.sh

demo: venv
	$(VENV)/bin/python manage.py migrate --noinput
	$(VENV)/bin/python manage.py chatstream_demo_user
	@echo "Demo: http://$(HOST):$(PORT)/  (login demo / demo); simulated upstream on $(SIM_PORT). Ctrl-C stops both."
	@trap 'kill 0' EXIT INT TERM; \
	  $(VENV)/bin/python manage.py chatstream_simulator --host 127.0.0.1 --port $(SIM_PORT) & \
	  CHATSTREAM_SIMULATOR_URL=http://127.0.0.1:$(SIM_PORT)/v1 \
	  $(VENV)/bin/python -m uvicorn project.asgi:application --host $(HOST) --port $(PORT) --no-access-log

test: browser
	$(MAKE) test-env VENV=.venv DJANGO=$(DJANGO) PYTHON="$(PYTHON)"
	$(MAKE) test-env VENV=.venv-django52 DJANGO=5.2 PYTHON="$(PY311)"

test-django52: browser
	$(MAKE) test-env VENV=.venv-django52 DJANGO=5.2 PYTHON="$(PY311)"

# PostgreSQL and Redis are used when they answer here (CI requires them: see .ci/run).
export CHATSTREAM_TEST_POSTGRES ?= postgres://postgres@127.0.0.1:5432/postgres
export CHATSTREAM_TEST_REDIS ?= redis://127.0.0.1:6379/0

# A suite takes ~5 minutes; one that hangs anyway (a stuck thread at exit, say) is stopped
# (where coreutils' timeout is installed).
SUITE_TIMEOUT ?= 1800
WITH_TIMEOUT := $(shell command -v timeout >/dev/null 2>&1 && echo timeout -k 60 $(SUITE_TIMEOUT))

test-env: venv
	$(WITH_TIMEOUT) $(VENV)/bin/python -m pytest $(PYTEST_ARGS)

test-fast: venv
	$(VENV)/bin/python -m pytest -m "not browser" $(PYTEST_ARGS)

bench: venv
	$(VENV)/bin/python bench/bench_parser.py
	$(VENV)/bin/python bench/bench_proxy.py

clean:
	rm -rf .venv .venv-django52 db.sqlite3 test-artifacts
