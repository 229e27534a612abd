"""Supported versions, stated and kept: Python 3.10-3.12, torch 2.11-2.13, and an install that resolves.

GPU machines often come with their own torch (the lent ones: torch 2.11 + CUDA 13, triton 3.6,
Python 3.12, no network), so trainlab must not need anything newer. What is checked here, on any
machine:
  * the declared ranges (pyproject) and the pins (constraints) agree;
  * every torch/triton name the code uses exists in torch 2.11 / triton 3.6, according to the
    verdict benchmarks/api_compat.py wrote under those versions (committed); a newly used name fails
    this test until it is checked there or put behind a fallback and listed in GUARDED;
  * every source file parses as Python 3.10 and uses no standard-library name added after 3.10;
  * the committed pip --dry-run logs show the pinned install resolving for this machine's CPU wheel
    and for PyPI's CUDA wheel (rerun: `make check-install`).
"""

import ast
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "install"
sys.path.insert(0, str(ROOT / "benchmarks"))
from api_compat import SCANNED, collect  # noqa: E402

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

# Names used only behind a version check or try/except, with the fallback taken on older torch
# ({name: why it is safe}); empty today.
GUARDED: dict[str, str] = {
    # the independent FLOP count in tests/test_lenet_models.py; that test skips where the module is absent
    "torch.utils.flop_counter.FlopCounterMode": "tests/test_lenet_models.py: pytest.importorskip",
}

# Standard-library names added after Python 3.10 (3.11: tomllib, typing.Self, ...; 3.12: itertools.batched, ...)
NEWER_STDLIB = {
    "tomllib",
    "wsgiref.types",
    "datetime.UTC",
    "enum.StrEnum",
    "enum.verify",
    "typing.Self",
    "typing.LiteralString",
    "typing.Never",
    "typing.assert_never",
    "typing.reveal_type",
    "typing.Required",
    "typing.NotRequired",
    "typing.TypeVarTuple",
    "typing.Unpack",
    "typing.dataclass_transform",
    "typing.override",
    "itertools.batched",
    "asyncio.TaskGroup",
    "asyncio.timeout",
    "contextlib.chdir",
    "hashlib.file_digest",
    "operator.call",
    "math.cbrt",
    "math.exp2",
    "ExceptionGroup",
    "BaseExceptionGroup",
}


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins() -> dict[str, list[str]]:
    pins: dict[str, list[str]] = {}
    for line in (ROOT / "requirements" / "constraints.txt").read_text().splitlines():
        m = re.match(r"([A-Za-z0-9_.-]+)==([^;\s]+)", line.split("#")[0].strip())
        if m:
            pins.setdefault(m.group(1).lower(), []).append(m.group(2))
    return pins


def test_declared_ranges_and_pins_agree():
    project = _pyproject()
    assert project["requires-python"] == ">=3.10"
    assert {c.rsplit(" ", 1)[-1] for c in project["classifiers"] if "Python :: 3." in c} == {"3.10", "3.11", "3.12"}
    torch_req = next(d for d in project["dependencies"] if d.startswith("torch"))
    assert torch_req.replace(" ", "") == "torch>=2.11,<2.14"
    pins = _pins()
    assert pins["torch"] == ["2.13.0"]  # inside the range
    assert pins["triton"] == ["3.7.1"]  # what PyPI's torch 2.13.0 CUDA wheel pins
    assert "triton" not in str(project["dependencies"])  # never pinned against the installed torch
    assert any(d.startswith("cuda-toolkit[nvcc") for d in project["optional-dependencies"]["nvcc"])


def test_no_torch_or_triton_api_newer_than_the_oldest_supported():
    verdicts = sorted(RESULTS.glob("api_compat_torch2.11*_triton3.6*.json"))
    assert verdicts, (
        "run `python benchmarks/api_compat.py --out benchmarks/results/install` under torch 2.11 / triton 3.6"
    )
    # Every verdict taken under torch 2.11 / triton 3.6 counts (the GPU image's, Python 3.12, and the PyPI
    # wheels' on the CPU box, Python 3.11): a name is checked if one of them saw it, absent if one lacked it.
    verdict = {"present": {}}
    for path in verdicts:
        one = json.loads(path.read_text())
        assert one["versions"]["torch"].startswith("2.11") and one["versions"]["triton"].startswith("3.6"), path
        for name, ok in one["present"].items():
            verdict["present"][name] = verdict["present"].get(name, True) and ok
    used = collect(ROOT)
    unchecked = sorted(set(used) - set(verdict["present"]) - set(GUARDED))
    assert not unchecked, (
        "used but never checked against torch 2.11 / triton 3.6 (rerun benchmarks/api_compat.py "
        f"there, or add a fallback and list it in GUARDED): {unchecked}"
    )
    missing = sorted(n for n in used if verdict["present"].get(n) is False and n not in GUARDED)
    assert not missing, f"used but absent in torch 2.11 / triton 3.6: { {n: used[n] for n in missing} }"


def _python_files():
    for top in SCANNED:
        yield from sorted((ROOT / top).rglob("*.py"))


def test_sources_parse_as_python_3_10():
    for path in _python_files():
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 10))


def test_no_standard_library_name_newer_than_3_10():
    offenders = []
    for path in _python_files():
        tree = ast.parse(path.read_text())
        guarded = {
            id(n)
            for t in ast.walk(tree)
            if isinstance(t, ast.Try)
            and any(isinstance(h.type, ast.Name) and h.type.id == "ImportError" for h in t.handlers)
            for n in ast.walk(t)
        }
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Name) and node.id in ("ExceptionGroup", "BaseExceptionGroup"):
                names = [node.id]  # builtins: a use is the dependency (imports are checked above)
            hits = [n for n in names if n in NEWER_STDLIB]
            if hits and id(node) not in guarded:
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {hits}")
    assert not offenders, offenders


def test_committed_install_logs_resolve_for_cpu_and_cuda_wheels():
    path = RESULTS / "install_check.json"
    if not path.exists():
        pytest.fail(
            "benchmarks/results/install/install_check.json missing: run `make check-install "
            "INSTALL_OUT=benchmarks/results/install FORCE=1`"
        )
    runs = {r["path"]: r for r in json.loads(path.read_text())["runs"]}
    assert runs["local"]["ok"] and runs["local"]["key_versions"]["torch"].startswith("2.13.0")
    assert runs["pypi"]["ok"] and runs["pypi"]["key_versions"]["torch"] == "2.13.0"  # the CUDA build
    assert runs["pypi"]["resolved"].get("nvidia-cudnn-cu13")  # … with its CUDA libraries
    for run in runs.values():
        assert run["ok"], (run["path"], run["error"])
        assert run["key_versions"]["triton"] == _pins()["triton"][0]
        assert (RESULTS / f"{run['path']}.log").exists()
    assert {"pypi-cp310", "pypi-cp312"} <= set(runs)
