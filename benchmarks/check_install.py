"""Does the pinned install resolve everywhere? pip's own resolver in --dry-run, once per install path.

  local        this machine's pip configuration (on the dev box: a local CPU wheel of torch 2.13.0
               through find-links), `-c requirements/constraints.txt -e '.[dev,nvcc]'`
  pypi         PyPI alone (PIP_CONFIG_FILE=/dev/null, PIP_FIND_LINKS unset), same command: what a
               GPU machine gets — torch 2.13.0 is then the CUDA 13 build, which pins triton==3.7.1
  pypi-cp310,  the same from PyPI with a Python 3.10 / 3.12 interpreter when one is found (PATH,
  pypi-cp312   ~/.pyenv/versions); otherwise the project's requirements (pyproject: dependencies +
               dev + nvcc) resolved for that version's wheels (--python-version, binary only)

Writes OUT/<path>.log (pip's output headed by the command) and OUT/install_check.{json,md,log} (the
versions each path resolved to). Exit 1 if any path fails to resolve. `make check-install` runs it;
the committed logs are in benchmarks/results/install/ (refresh: `make check-install
INSTALL_OUT=benchmarks/results/install FORCE=1`).

    python benchmarks/check_install.py --out build/check-install
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import tomllib
except ImportError:  # Python 3.10
    from pip._vendor import tomli as tomllib

from _common import command_line

from trainlab.results.kinds import plan_record
from trainlab.telemetry.results import write_results

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "requirements" / "constraints.txt"
KEY_PACKAGES = ("torch", "triton", "cuda-toolkit", "nvidia-cuda-nvcc", "numpy", "transformers", "tensorboard")
# pip matches manylinux tags exactly: list every glibc a wheel may name
PLATFORMS = tuple(f"manylinux_2_{n}_x86_64" for n in range(17, 40)) + ("manylinux2014_x86_64", "manylinux1_x86_64")


def project_requirements() -> list[str]:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = meta["optional-dependencies"]
    return [*meta["dependencies"], *extras["dev"], *extras["nvcc"]]


def pypi_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # no global find-links / extra index / constraint file
    return env


def find_python(version: str) -> str | None:
    """An interpreter of `version` with pip: python3.X on PATH, or one installed by pyenv."""
    candidates = [shutil.which(f"python{version}")] + sorted(
        glob.glob(os.path.expanduser(f"~/.pyenv/versions/{version}.*/bin/python{version}")), reverse=True
    )
    for cand in filter(None, candidates):
        try:
            proc = subprocess.run(
                [cand, "-c", "import sys, pip; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=60,
            )
        except (OSError, subprocess.SubprocessError):
            continue
        if proc.returncode == 0 and proc.stdout.strip() == version:
            return cand
    return None


def resolve(name: str, args: list[str], env: dict, out: Path, python: str = sys.executable) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        cmd = [
            python,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--ignore-installed",
            "--report",
            str(report),
            "-c",
            str(CONSTRAINTS),
            *args,
        ]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
        seconds = time.perf_counter() - t0
        pinned = {}
        if proc.returncode == 0 and report.is_file():
            pinned = {
                i["metadata"]["name"].lower(): i["metadata"]["version"]
                for i in json.loads(report.read_text())["install"]
            }
    shown = " ".join(cmd).replace(str(ROOT) + "/", "")
    config = (
        "PIP_CONFIG_FILE=/dev/null (PyPI only)"
        if env.get("PIP_CONFIG_FILE") == os.devnull
        else "this machine's pip config"
    )
    (out / f"{name}.log").write_text(f"$ {shown}\n# {config}\n{proc.stdout}{proc.stderr}")
    return {
        "path": name,
        "ok": proc.returncode == 0,
        "returncode": proc.returncode,
        "seconds": round(seconds, 1),
        "pip_config": config,
        "command": shown,
        "key_versions": {k: pinned.get(k) for k in KEY_PACKAGES},
        "resolved": pinned,
        "error": None if proc.returncode == 0 else (proc.stderr.strip().splitlines() or ["?"])[-1],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="build/check-install", help="directory for the logs")
    ap.add_argument("--force", action="store_true", help="overwrite results already in --out")
    ap.add_argument("--pythons", default="3.10,3.12", help="extra Python versions to resolve wheels for (PyPI)")
    args = ap.parse_args()
    out = Path(args.out)
    if (out / "install_check.json").exists() and not args.force:
        print(f"check_install: {out} already holds results; pass --force (make: FORCE=1) to overwrite", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    project = ["-e", ".[dev,nvcc]"]
    runs = [resolve("local", project, dict(os.environ), out), resolve("pypi", project, pypi_env(), out)]
    for version in [v for v in args.pythons.split(",") if v]:
        tag = version.replace(".", "")
        python = find_python(version)
        if python:
            runs.append(resolve(f"pypi-cp{tag}", project, pypi_env(), out, python=python))
            continue
        wheels = [
            "--only-binary=:all:",
            "--python-version",
            version,
            "--implementation",
            "cp",
            *(f"--platform={p}" for p in PLATFORMS),
        ]
        runs.append(resolve(f"pypi-cp{tag}", [*wheels, *project_requirements()], pypi_env(), out))
    lines = [
        "| install path | resolves | " + " | ".join(KEY_PACKAGES) + " |",
        "| --- | --- | " + " | ".join("---" for _ in KEY_PACKAGES) + " |",
    ]
    for r in runs:
        lines.append(
            f"| {r['path']} ({r['pip_config']}) | {'yes' if r['ok'] else 'NO: ' + str(r['error'])} | "
            + " | ".join(r["key_versions"][k] or "-" for k in KEY_PACKAGES)
            + " |"
        )
    table = "\n".join(lines)
    print(table)
    write_results(
        out,
        "install_check",
        {"runs": runs, "ok": all(r["ok"] for r in runs)},
        "# Install resolution (pip --dry-run)\n\n" + table + "\n\nRaw pip output: `<path>.log` beside this file.\n",
        [table],
        command_line(),
        kind="benchmark",
        plan=plan_record("cpu"),
    )
    print(f"wrote {out}/install_check.{{json,md,log}} and one pip log per path")
    return 0 if all(r["ok"] for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
