# Two commands set everything up on a fresh machine:
#   make demo   - create .venv, install leasekeeper, run the demo on the in-memory queue
#   make test   - create .venv, install everything the tests need (moto, Azurite via npm
#                 into ./node_modules, PySpark), then ruff, mypy --strict and the whole suite
# Both are idempotent and quiet once set up.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
AZURITE := node_modules/.bin/azurite-queue
PYTEST_ARGS ?=

.PHONY: demo test lint typecheck unit bench bench-quick soak clean java-check

$(PY):
	@$(PYTHON) -m venv $(VENV)

# Reinstall only when the dependency list changes.
$(VENV)/.demo-deps: pyproject.toml | $(PY)
	@$(PIP) install -e . > $(VENV)/install-demo.log 2>&1 || { cat $(VENV)/install-demo.log; exit 1; }
	@touch $@

$(VENV)/.test-deps: pyproject.toml | $(PY)
	@echo "installing test dependencies into $(VENV) (once)..."
	@$(PIP) install -e '.[all,dev]' > $(VENV)/install-test.log 2>&1 || { cat $(VENV)/install-test.log; exit 1; }
	@touch $@ $(VENV)/.demo-deps

$(AZURITE): package.json
	@command -v npm > /dev/null || { echo "make test: Node.js and npm are needed to install Azurite (the Azure Storage emulator the Azure tests run against): apt-get install nodejs npm" >&2; exit 1; }
	@echo "installing Azurite into ./node_modules (once)..."
	@npm install --no-audit --no-fund --no-package-lock --loglevel=error > /dev/null
	@touch $@

java-check:
	@command -v java > /dev/null || { echo "make test: Java 17+ is needed for the PySpark tests: apt-get install openjdk-17-jre-headless" >&2; exit 1; }

demo: $(VENV)/.demo-deps
	@$(PY) -m leasekeeper demo

CODE := $(wildcard src tests examples benchmarks)

lint: $(VENV)/.test-deps
	@$(VENV)/bin/ruff check --quiet $(CODE)
	@$(VENV)/bin/ruff format --check --quiet $(CODE) || { echo "ruff format: run '$(VENV)/bin/ruff format $(CODE)'"; exit 1; }

typecheck: $(VENV)/.test-deps
	@$(VENV)/bin/mypy --strict --no-error-summary src/leasekeeper

test: $(VENV)/.test-deps $(AZURITE) java-check lint typecheck
	@$(VENV)/bin/pytest -q -p no:cacheprovider $(PYTEST_ARGS)

unit: $(VENV)/.test-deps
	@$(VENV)/bin/pytest -q -p no:cacheprovider tests/core $(PYTEST_ARGS)

bench: $(VENV)/.test-deps $(AZURITE)
	@$(PY) -m benchmarks.run

bench-quick: $(VENV)/.test-deps $(AZURITE)
	@$(PY) -m benchmarks.run --quick

soak: $(VENV)/.test-deps $(AZURITE)
	@LEASEKEEPER_SOAK=1 $(VENV)/bin/pytest -q -p no:cacheprovider -m soak tests

clean:
	rm -rf $(VENV) node_modules .mypy_cache .ruff_cache .pytest_cache
