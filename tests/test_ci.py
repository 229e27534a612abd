"""The suite's own machinery: `make test` runs it in parallel (pytest-xdist) and `.ci/run` runs `make test`;
each parallel worker draws its gloo ports from its own range."""

import re
import socket
from pathlib import Path

import pytest

from trainlab.distributed import spawn

ROOT = Path(__file__).resolve().parent.parent


def test_free_port_takes_the_next_free_port_of_its_range(monkeypatch):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        lo = probe.getsockname()[1]  # a port surely in use: the range's first is skipped
        monkeypatch.setenv(spawn.PORTS_ENV, f"{lo}-{lo + 3}")
        monkeypatch.setattr(spawn, "_next_port", 0)
        ports = [spawn.free_port() for _ in range(4)]
    assert ports[0] != lo and all(lo < p < lo + 3 for p in ports), ports
    assert ports[0] != ports[1] and ports[:2] == ports[2:]  # in turn, then round again
    monkeypatch.setenv(spawn.PORTS_ENV, f"{lo}-{lo + 1}")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", lo))
        with pytest.raises(OSError, match="no free port in the range"):
            spawn.free_port()


def test_the_workers_of_a_parallel_run_have_disjoint_port_ranges():
    import os

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        assert spawn.PORTS_ENV not in os.environ or os.environ[spawn.PORTS_ENV]
        return
    lo, hi = map(int, os.environ[spawn.PORTS_ENV].split("-"))
    assert (lo - 20000) // 500 == int(worker[2:]) % 24 and hi - lo == 500


def test_make_test_runs_the_suite_in_parallel_and_ci_runs_make_test():
    make = (ROOT / "Makefile").read_text()
    recipe = re.search(r"(?ms)^test: .*?(?=^\S)", make).group(0)
    # whole files per worker, in the suite's order (the files with slow cases first: tests/conftest.py)
    assert "-m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)" in recipe
    assert re.search(r"(?m)^TEST_WORKERS \?= \d+", make)
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert ci[-2:] == ["make test", ci[-1]] and ci[-1].startswith("wait")  # then the background apt-get job, if any
    assert "unset PYTHONDONTWRITEBYTECODE" in ci  # the ~300 processes the suite starts reuse compiled bytecode
    assert "make test" in (ROOT / "README.md").read_text()
    assert "pytest-xdist" in (ROOT / "pyproject.toml").read_text()
    assert re.search(r"(?m)^pytest-xdist==[\d.]+$", (ROOT / "requirements" / "constraints.txt").read_text())
