"""The headline figures the README and docs/results.md quote are the ones the committed benchmark
results hold: rerunning a benchmark with --force and forgetting the docs fails here."""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README, RESULTS_DOC = (ROOT / "README.md").read_text(), (ROOT / "docs" / "results.md").read_text()


def _time_to_99(stem: str) -> dict:
    return json.loads((RESULTS / f"{stem}.json").read_text())["summary"]["fast"]


def _flat(text: str) -> str:
    return " ".join(text.split())   # quotes may wrap across lines


@pytest.mark.parametrize("stem,label", [("lenet_time_to_99_cpu", ""), ("lenet_time_to_99_cpu_rerun", "a second run: ")])
def test_readme_quotes_the_time_to_99_results(stem, label):
    fast = _time_to_99(stem)
    median_s, ratio, worst = fast["median_s"], fast["speedup_vs_seed_style"]["median"], fast["speedup_vs_seed_style"]["min"]
    assert fast["reached"] == fast["of"] == 5
    readme = _flat(README)
    if label:
        assert f"{label}{median_s:.1f} s, {ratio:.1f}×, worst {worst:.1f}×" in readme
    else:
        assert f"**{median_s:.1f} s** median to 99 %, **{ratio:.1f}×**" in readme and f"worst seed {worst:.1f}×" in readme
    assert f"{ratio:.1f}×" in RESULTS_DOC and f"{worst:.1f}×" in RESULTS_DOC


def test_readme_and_results_quote_the_step_benchmark():
    rows = {r["variant"]: r for r in json.loads((RESULTS / "lenet_cpu_step_nchw2.json").read_text())["steps"]}
    base, fast = rows["bn234+bf16+cl@1"]["median_ms"], rows["bn234+bf16+cl+fused1+fused@1"]["median_ms"]
    assert f"**{fast:.1f} ms** per batch of 256" in _flat(README) and f"{base / fast:.2f}×" in README
    assert f"**{fast:.2f} ms**" in RESULTS_DOC and f"{base:.2f}" in RESULTS_DOC


def test_results_quote_the_conv2_layout_benchmark():
    rows = {r["what"]: r["median_ms"] for r in json.loads((RESULTS / "lenet_conv2_layout.json").read_text())["rows"]}
    nchw, cl = rows["bfloat16 NCHW input gradient"], rows["bfloat16 channels-last input gradient"]
    assert f"input gradient **{nchw:.2f} vs {cl:.2f}**" in RESULTS_DOC
    assert cl / nchw > 1.5   # the reason NCHWConv2d exists
