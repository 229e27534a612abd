"""The step benchmark's conv2-layout setting and the conv2 layout benchmark (benchmarks/): they compare
like with like — the same weights, the same function — and write their tables where --out says."""

import json
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from lenet_conv2_layout import convolutions  # noqa: E402
from lenet_cpu_step import build_model, parse_variant  # noqa: E402

from trainlab.lenet.model import NCHWConv2d  # noqa: E402


def test_cl2_puts_back_a_plain_conv2_with_the_same_weights():
    new, old = (build_model(parse_variant(spec, 8)) for spec in ("bn234+cl+fused1@1", "bn234+cl+fused1+cl2@1"))
    assert isinstance(new.features[4], NCHWConv2d) and type(old.features[4]) is torch.nn.Conv2d
    assert all(torch.equal(a, b) for a, b in zip(new.state_dict().values(), old.state_dict().values()))
    assert list(new.state_dict()) == list(old.state_dict())


def test_the_layout_benchmark_times_the_same_convolutions_in_both_layouts():
    torch.manual_seed(0)
    nchw = {k: f() for k, f in convolutions(4, torch.float32, channels_last=False).items()}
    torch.manual_seed(0)
    cl = {k: f() for k, f in convolutions(4, torch.float32, channels_last=True).items()}
    assert cl["forward"].is_contiguous(memory_format=torch.channels_last) and nchw["forward"].is_contiguous()
    torch.testing.assert_close(cl["forward"], nchw["forward"], rtol=1e-4, atol=1e-4)
    assert cl["input gradient"].shape == (4, 6, 14, 14) and cl["weight gradient"].shape == (16, 6, 5, 5)
    torch.testing.assert_close(cl["input gradient"], nchw["input gradient"], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cl["weight gradient"], nchw["weight gradient"], rtol=1e-4, atol=1e-3)


def test_the_layout_benchmark_writes_where_out_says_and_refuses_bad_counts(tmp_path):
    def run(*a):
        return subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / "lenet_conv2_layout.py"), *a],
            capture_output=True,
            text=True,
            cwd=tmp_path,
        )

    ok = run("--batch-size", "4", "--rounds", "2", "--out", str(tmp_path))
    assert ok.returncode == 0, ok.stderr
    rows = json.loads((tmp_path / "lenet_conv2_layout.json").read_text())["rows"]
    assert len(rows) == 14 and all(r["median_ms"] > 0 for r in rows)
    assert "| bfloat16 | input gradient |" in (tmp_path / "lenet_conv2_layout.md").read_text()
    again = run("--batch-size", "4", "--rounds", "2", "--out", str(tmp_path))
    assert again.returncode != 0 and "--force" in again.stderr + again.stdout
    bad = run("--rounds", "0", "--out", str(tmp_path / "x"))
    assert bad.returncode == 2 and "--rounds must be" in bad.stderr and "Traceback" not in bad.stderr
