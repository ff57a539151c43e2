# One-command setup: `make test` and `make demo` create .venv on a fresh machine.
#
# `pip install ai-dynamo==1.6.1` cannot resolve on machines without the vendor
# index that its optional perf-model dependency (aisimulate) comes from, so the
# wheel is installed without dependencies and the ones the frontend, mocker and
# router need are listed in pyproject.toml's `dynamo` extra.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test unit e2e lint demo clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-deps ai-dynamo==1.6.1
	$(PY) -m pip install --quiet -e '.[dynamo,dev]'
	touch $(STAMP)

lint: setup
	$(PY) -m ruff check dynamo_thunderagent tests
	$(PY) -m mypy

unit: setup
	$(PY) -m pytest -q -m "not e2e"

e2e: setup
	$(PY) -m pytest -q -m e2e

test: lint
	$(PY) -m pytest -q

demo: setup
	$(PY) -m dynamo_thunderagent demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
