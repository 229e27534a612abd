"""benchmarks/lenet_time_to_99.py's tables (issue 29, goal 1): the GPU run reports each loop's median,
min and max, the step (batch, steps, ms per step) and the time kept apart from the timed training, and
the ratio to the seed-style loop when that loop ran on fewer seeds. Built from rows, no training."""

import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from lenet_time_to_99 import tables  # noqa: E402


def _fast(seed, t):
    return {
        "loop": "fast",
        "seed": seed,
        "threads": 16,
        "time_to_99_s": t,
        "epochs_to_99": 1,
        "images_per_s": 6e5,
        "warmup_s": 0.4,
        "data_s": 0.8,
        "eval_s": 0.05,
        "batch_size": 96,
        "steps": 625,
        "ms_per_step": t / 625 * 1e3,
        "step_mode": "cudagraph",
    }


def _seed_style(seed, t):
    return {
        "loop": "seed-style",
        "seed": seed,
        "threads": 16,
        "time_to_99_s": t,
        "epochs_to_99": 5,
        "images_per_s": 14e3,
        "warmup_s": 0.0,
    }


def test_gpu_summary_with_the_baseline_on_fewer_seeds():
    fast_times = [0.20 + 0.01 * s for s in range(10)]
    rows = [_fast(s, t) for s, t in enumerate(fast_times)]
    rows.insert(1, _seed_style(0, 20.0))
    rows.insert(3, _seed_style(1, None))  # did not reach 99 % within --max-epochs
    rows.insert(5, _seed_style(2, 30.0))
    text, summary = tables(rows, ["fast", "seed-style"], list(range(10)))
    fast = summary["fast"]
    assert (fast["reached"], fast["of"]) == (10, 10)
    assert fast["median_s"] == pytest.approx(statistics.median(fast_times))
    assert (fast["min_s"], fast["max_s"]) == (pytest.approx(0.20), pytest.approx(0.29))
    assert (fast["batch_size_median"], fast["steps_median"], fast["step_mode"]) == (96, 625, ["cudagraph"])
    assert (fast["data_s_median"], fast["warmup_s_median"], fast["eval_s_median"]) == (0.8, 0.4, 0.05)
    ratio = fast["speedup_vs_seed_style"]
    assert ratio["per_seed"] == [pytest.approx(20.0 / 0.20), pytest.approx(30.0 / 0.22)]  # seeds 0 and 2 only
    assert ratio["ratio_of_medians"] == pytest.approx(25.0 / statistics.median(fast_times))
    assert summary["seed-style"]["reached"] == 2 and summary["seed-style"]["of"] == 3
    assert "| fast | cudagraph | 96 | 625 |" in text and "Ratio of the medians" in text


def test_fast_candidates_run_as_loops_beside_the_preset():
    """`fast=VARIANT` times a candidate of lenet_accuracy.py's VARIANTS in the same run as the preset;
    its row is labelled with the spec and its ratio to the seed-style loop is its own."""
    from lenet_accuracy import VARIANTS
    from lenet_time_to_99 import loop_variant, parse_loop

    assert parse_loop("fast=fast-b384@1") == ("fast", 1)
    assert loop_variant("fast=fast-b384@1") == VARIANTS["fast-b384"][1] and loop_variant("fast") is None
    for bad in ("default=fast-b384", "fast=nope", "fastest"):
        with pytest.raises(SystemExit):
            parse_loop(bad)
    rows = [_fast(0, 0.25), {**_fast(0, 0.10), "loop": "fast=fast-b384", "batch_size": 384}, _seed_style(0, 20.0)]
    text, summary = tables(rows, ["fast", "fast=fast-b384", "seed-style"], [0])
    assert "[fast=fast-b384]" in text
    assert summary["fast=fast-b384"]["speedup_vs_seed_style"]["median"] == pytest.approx(200.0)
    assert summary["fast=fast-b384"]["batch_size_median"] == 384
