"""The report page in a real browser (headless Chromium): no table or figure runs off the page.

Wide tables (data parallel, GPT strategies) sit in a horizontal scroll wrapper, figures scale to the
page, long paths wrap; at a laptop's width and at a phone's the page itself never scrolls sideways.
The checker is shown to fail on a page that does overflow, so a pass means something."""

from __future__ import annotations

import json

import pytest
from browser import overflow

from trainlab.cli import main
from trainlab.results.kinds import plan_record, stamp

LONG = "/very/long/path/" + "x" * 150 + "/result.json"


def _wide_inputs(folder):
    dp = [
        {
            "mode": m,
            "world_size": 2,
            "loader": "dataloader",
            "workers": w,
            "epoch_seconds": 12.3,
            "images_per_s": 4321.0,
            "data_ms": 1.2,
            "compute_ms": 20.5,
            "comm_ms": 3.4,
            "comm_overlapped": True,
            "test_accuracy": 97.1,
            "grad_bytes": 246824,
            "bytes_sent_per_step": 246824,
            "allreduce_ms": 1.5,
            "bound_comm_ms": 0.9,
            "algbw_gbps": 1.23,
            "busbw_gbps": 1.23,
            "link_gbps": 2.5,
            "busbw_pct_of_link": 49.0,
        }
        for m in ("none", "ddp", "allreduce", "ring")
        for w in (0, 2, 4)
    ]
    gpt = {
        "rows": [
            {
                "strategy": s,
                "nproc": 2,
                "status": "ok",
                "step_ms_median": 123.4,
                "tokens_per_s": 5466.0,
                "tflops_per_device": 0.009,
                "mfu": 0.19,
                "peak_tensor_bytes": 437 * 2**20,
                "predicted_bytes": 440 * 2**20,
                "first_loss_diff_vs_none": 1e-7,
            }
            for s in ("none", "ddp", "zero1", "zero2", "zero3", "zero3+amp+ckpt+offload", "tp+pp", "pp+amp")
        ]
    }
    (folder / "dp_compare.json").write_text(json.dumps(stamp("dp_compare", dp, plan_record("cpu"))))
    (folder / "gpt_compare.json").write_text(json.dumps(stamp("gpt_compare", gpt, plan_record("cpu"))))
    return [folder / "dp_compare.json", folder / "gpt_compare.json"]


@pytest.mark.parametrize("width", [1000, 480])
def test_no_table_or_figure_overflows_the_page(tmp_path, width):
    out = tmp_path / "report"
    assert main(["report", *map(str, _wide_inputs(tmp_path)), "-o", str(out), "--title", LONG]) == 0
    result = overflow(out / "index.html", width=width)
    assert result["width"] <= max(width, 500) and not result["bad"], (
        result
    )  # headless Chromium's narrowest window: 500 px


def test_the_checker_catches_a_page_that_overflows(tmp_path):
    page = tmp_path / "index.html"
    cells = "".join(f"<td>column {i} with a long value</td>" for i in range(40))
    page.write_text(f"<!doctype html><html><body><table><tr>{cells}</tr></table></body></html>")
    result = overflow(page, width=800)
    assert any("TABLE ends at" in b for b in result["bad"]) and any("scrolls sideways" in b for b in result["bad"])


SCREEN = (1200, 800)  # a laptop's browser window: the lab report must fit in 8 such screens, details folded


def test_the_lab_report_fits_eight_screens_and_prints_to_pdf(tmp_path):
    from browser import chromium_or_skip
    from test_report_lab import make_lab

    from trainlab.lenet.config import TrainConfig
    from trainlab.lenet.loop import train

    chromium_or_skip()  # the PDF needs it as much as the measurement
    run = tmp_path / "run"
    train(
        TrainConfig(epochs=1, train_subset=256, test_subset=200, device="cpu", progress=False, seed=0, out=str(run)),
        log=lambda *_: None,
    )
    lab = make_lab(tmp_path / "lab", run)
    out = tmp_path / "report"
    assert main(["report", str(lab), "-o", str(out), "--pdf"]) == 0
    pdf = out / "report.pdf"
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 10_000
    result = overflow(out / "index.html", width=SCREEN[0], height=SCREEN[1])
    assert result["width"] == SCREEN[0] and not result["bad"], result
    assert result["height"] <= 8 * SCREEN[1], result
