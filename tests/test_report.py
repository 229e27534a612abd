"""`trainlab report` from small real runs made here: HTML parses, images exist and are PNGs, numbers match."""

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

from trainlab.cli import main
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.loop import train
from trainlab.results.kinds import plan_record, stamp

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


class _Collector(HTMLParser):
    def __init__(self):
        super().__init__()
        self.images, self.text, self.headings, self._tag = [], [], [], None

    def handle_starttag(self, tag, attrs):
        self._tag = tag
        if tag == "img":
            self.images.append(dict(attrs)["src"])

    def handle_data(self, data):
        self.text.append(data)
        if self._tag == "h2":
            self.headings.append(data)

    def handle_endtag(self, tag):
        self._tag = None


def parse(path: Path) -> _Collector:
    c = _Collector()
    c.feed(path.read_text())
    c.close()
    return c


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    out = []
    for seed in (0, 1):
        cfg = TrainConfig(
            epochs=1,
            train_subset=512,
            test_subset=300,
            device="cpu",
            progress=False,
            seed=seed,
            out=str(root / f"relu-s{seed}"),
        )
        train(cfg, log=lambda *_: None)
        out.append(root / f"relu-s{seed}")
    return out


def check_page(out: Path) -> _Collector:
    page = parse(out / "index.html")
    assert page.images, "no figures"
    for src in page.images:
        img = out / src
        assert img.exists(), src
        assert img.read_bytes()[:8] == PNG_MAGIC, src
        from PIL import Image

        with Image.open(img) as im:
            im.verify()
    return page


def test_report_from_training_runs(runs, tmp_path, capsys):
    from trainlab.report import format as fmt

    out = tmp_path / "report"
    assert main(["report", *map(str, runs), "-o", str(out)]) == 0
    page = check_page(out)
    text = " ".join(page.text)
    assert page.headings[0] == "Summary"  # the one-screen summary comes first
    summary_text = (out / "report.md").read_text().split("## Comparison")[0]
    for run in runs:
        summary = json.loads((run / "summary.json").read_text())
        # formatted for people in the summary: "98.67 %", "3.21 s" — never 98.66666666666667
        assert f"{summary['test_accuracy']:.2f} %" in summary_text
        assert f"{summary['train_accuracy']:.2f} %" in summary_text
        assert fmt.seconds(summary["train_seconds"]) in summary_text
        assert fmt.rate(summary["images_per_s_median"]) in summary_text
        assert json.dumps(summary["test_accuracy"]) in text  # the raw value is kept, in the run's raw-values block
    assert not re.search(r"\d\.\d{5,}", summary_text), "a raw float in the summary"
    assert "Comparison" in page.headings and "tensorboard --logdir" in text
    assert "compare_seed.png" not in page.images  # the seed is what statistics run over, not a swept flag
    md = (out / "report.md").read_text()
    assert md.count("## Training run:") == 2
    assert {"run0_misclassified.png", "run1_misclassified.png", "run0_accuracy_curve.png"} <= set(page.images)
    # a CPU run has no GPU record: said in one line, not a crash
    assert "No GPU record" in text


def test_numbers_are_formatted_for_people():
    from trainlab.report import format as fmt

    assert fmt.pct(99.33000183105469) == "99.33 %"
    assert fmt.seconds(25.4999) == "25.5 s" and fmt.seconds(0.0123) == "12.3 ms" and fmt.seconds(3725) == "1 h 02 min"
    assert fmt.rate(12822.4) == "12,822 img/s"
    assert fmt.number(0.020912) == "0.0209" and fmt.number(61706) == "61,706" and fmt.number(1.234e-7) == "1.23e-07"
    assert fmt.pct_sd(99.1866, 0.1234) == "99.19 ± 0.12 %"
    assert fmt.value("images_per_s_median", 12822.3) == "12,822 img/s"  # not a duration, though it ends in _s
    assert fmt.value("peak_memory_bytes", 3 * 2**30) == "3 GiB" and fmt.value("median_s", 1.5e-4) == "0.15 ms"
    assert fmt.value("test_accuracy", None) == "–"


def test_gpu_record_is_plotted(runs, tmp_path):
    """A run with gpu.csv (the NVML sampler's format) gets the utilization/memory figure."""
    import csv
    import shutil

    from trainlab.telemetry.gpu import FIELDS

    run = tmp_path / "gpu-run"
    shutil.copytree(runs[0], run)
    with (run / "gpu.csv").open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=FIELDS)
        w.writeheader()
        w.writerows(
            {
                "time_s": i / 10,
                "gpu": 0,
                "utilization_pct": 90 + i % 5,
                "memory_used_mib": 1500 + i,
                "memory_total_mib": 81559,
                "power_w": 300.0,
                "temperature_c": 55,
            }
            for i in range(50)
        )
    out = tmp_path / "report"
    assert main(["report", str(run), "-o", str(out)]) == 0
    page = check_page(out)
    assert "run0_gpu_timeline.png" in page.images
    assert "No GPU record" not in " ".join(page.text)
    # the summary (first screen) carries the utilization figure and its mean/max (90..94 %, mean 92 %)
    assert page.images[0] == "summary_gpu_timeline.png"
    summary = (out / "report.md").read_text().split("## Training run")[0]
    assert "92 % mean, 94 % max" in summary


def test_report_with_gelu_check_and_gpt_bench_json(runs, tmp_path, capsys):
    """The operator and strategy tables come from real `gelu check` / `gpt bench` outputs made here."""
    from trainlab.report import format as fmt

    assert main(["gelu", "check", "--json", "--impl", "python", "--dtype", "float64"]) == 0
    check = json.loads(capsys.readouterr().out)
    (tmp_path / "gelu_check.json").write_text(json.dumps(check))
    bench_json = tmp_path / "gpt_bench.json"
    assert (
        main(
            [
                "gpt",
                "bench",
                "--model",
                "tiny",
                "--device",
                "cpu",
                "--steps",
                "2",
                "--warmup",
                "1",
                "--global-batch",
                "2",
                "--micro-batch",
                "2",
                "--seq",
                "16",
                "--json",
                str(bench_json),
            ]
        )
        == 0
    )
    bench = json.loads(bench_json.read_text())
    out = tmp_path / "report"
    assert main(["report", str(runs[0]), str(tmp_path / "gelu_check.json"), str(bench_json), "-o", str(out)]) == 0
    page = check_page(out)
    text = " ".join(page.text)
    assert "GELU correctness" in text and "GPT benchmark" in text
    for row in check["rows"]:
        assert fmt.number(row["fwd_max_abs_err"]) in text and fmt.number(row["grad_max_abs_err"]) in text
    assert (
        f"{bench['params']:,}" in text
        and fmt.rate(bench["tokens_per_s"], "tokens/s") in text
        and fmt.value("mfu", bench["mfu"]) in text
        and "%" in fmt.value("mfu", bench["mfu"])
    )
    assert ", ".join(fmt.number(x) for x in bench["losses"]) in text


def test_report_shows_gelu_rows_that_could_not_run_as_skipped(runs, tmp_path):
    from trainlab.ops import check

    ran = check.check_row(check.CASES["gelu"][0], "python", torch.float64, n=64)
    # a cuda row from a machine without a GPU, in today's form and in the older form (ok: true)
    skipped = {
        **ran,
        "impl": "cuda",
        "skipped": True,
        "ok": None,
        "status": "skipped",
        "reason": "no CUDA GPU on this machine",
    }
    older = {k: v for k, v in {**skipped, "impl": "cuda-old", "ok": True}.items() if k != "status"}
    path = tmp_path / "gelu_check.json"
    data = {"rows": [ran, skipped, older], "tolerances": {}, "reference": "float64"}
    path.write_text(json.dumps(stamp("gelu_check", data, plan_record("cpu"))))
    out = tmp_path / "report"
    assert main(["report", str(runs[0]), str(path), "-o", str(out)]) == 0
    text = " ".join(check_page(out).text)
    assert "1 ok, 0 failing, 2 skipped" in text
    assert text.count("skipped: no CUDA GPU on this machine") == 2


def test_missing_pieces_are_noted_and_corrupt_input_is_named(runs, tmp_path, capsys):
    (runs[0] / "metrics.jsonl").rename(runs[0] / "metrics.jsonl.bak")
    try:
        empty = tmp_path / "empty-run"
        empty.mkdir()
        out = tmp_path / "r"
        assert main(["report", str(runs[0]), str(empty), "-o", str(out)]) == 0
        text = " ".join(check_page(out).text)
        assert "no summary.json" in text and "curve omitted" in text
    finally:
        (runs[0] / "metrics.jsonl.bak").rename(runs[0] / "metrics.jsonl")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    capsys.readouterr()
    assert main(["report", str(bad), "-o", str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err.strip()
    assert str(bad) in err and "not valid JSON" in err and len(err.splitlines()) == 1
