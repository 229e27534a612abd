"""Everything that reaches the report's HTML is escaped, whatever field it arrives in (issue 20, class 2).

Every input kind the report reads — a training run (summary, config keys and values, env, metrics),
every result JSON kind, and the lab's results.json and step outputs — is filled with hostile strings
in every field that may hold text; the page must show them as text (escaped) and never as markup."""

from __future__ import annotations

import json
import shutil
from html.parser import HTMLParser
from pathlib import Path

import pytest

from trainlab.cli import main
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.loop import train
from trainlab.results.kinds import plan_record, stamp

HOSTILE = "<script>alert(1)</script>\"'><img src=x onerror=alert(2)>&amp;"
# a directory name cannot hold "/": the same attack without it
HOSTILE_NAME = "<b onmouseover=alert(3)>\"q'&amp;"


class _Tags(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags, self.text = [], []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


def assert_escaped(page: str, expect_visible: int = 1) -> None:
    """No hostile string became markup (a tag, an event attribute), and each one is there as text."""
    p = _Tags()
    p.feed(page)
    p.close()
    assert not [t for t, _ in p.tags if t == "script"], "a <script> element reached the page"
    assert not [(t, a) for t, a in p.tags if any(k.startswith("on") for k in a)], "an event attribute reached the page"
    assert not [(t, a) for t, a in p.tags if t == "img" and a.get("src") == "x"], "an injected <img> reached the page"
    assert not [t for t, _ in p.tags if t == "b"], "an injected <b> reached the page"
    text = "".join(p.text)
    shown = text.count(HOSTILE) + text.count(HOSTILE_NAME)
    assert shown >= expect_visible, f"the hostile text reached the page {shown} times: the test proves nothing"


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    run = root / HOSTILE_NAME
    train(
        TrainConfig(
            epochs=1,
            train_subset=256,
            test_subset=100,
            batch_size=64,
            device="cpu",
            progress=False,
            tensorboard=False,
            gpu_telemetry=False,
            out=str(run),
        ),
        log=lambda *_: None,
    )
    s = json.loads((run / "summary.json").read_text())
    s.update(device=HOSTILE, device_name=HOSTILE, act=HOSTILE, parallel=HOSTILE, world_size=2, **{HOSTILE: HOSTILE})
    (run / "summary.json").write_text(json.dumps(s))
    c = json.loads((run / "config.json").read_text())
    c.update(act=HOSTILE, optimizer=HOSTILE, **{HOSTILE: HOSTILE})
    (run / "config.json").write_text(json.dumps(c))
    e = json.loads((run / "env.json").read_text())
    e.update(python=HOSTILE, torch=HOSTILE, cpu=HOSTILE, gpus=[HOSTILE], nvidia_smi=HOSTILE, time_utc=HOSTILE)
    (run / "env.json").write_text(json.dumps(e))
    return run


def _result_files(folder: Path) -> dict[str, Path]:
    """One file of every result kind the report renders, every text field hostile."""
    h = HOSTILE
    kinds = {
        "gelu_check": {
            "rows": [
                {
                    "impl": h,
                    "approximate": h,
                    "dtype": h,
                    "fwd_max_abs_err": h,
                    "grad_max_abs_err": h,
                    "recipe_loss_diff": h,
                    "recipe_grad_mse": h,
                    "gradcheck": h,
                    "gradgradcheck": h,
                    "status": h,
                    "reason": h,
                    "skipped": True,
                }
            ]
        },
        "gelu_bench": {
            "rows": [{"impl": h, "size": h, "median_s": h, "pass": h, "dtype": h, "approximate": h, "gbps": h}]
        },
        "dp_compare": [
            {
                "mode": h,
                "world_size": h,
                "epoch_seconds": h,
                "loader": h,
                "workers": h,
                "images_per_s": 5.0,
                "busbw_gbps": h,
                "grad_bytes": h,
                "bytes_sent_per_step": h,
            }
        ],
        "gpt_bench": {
            "strategy": h,
            "tokens_per_s": h,
            "world_size": h,
            "params": h,
            "mfu": h,
            "losses": [h, h],
            "tflops_per_device": h,
        },
        "gpt_plan": {"params": h, "strategies": [{"strategy": h, "total_bytes": h, "fits": h}]},
        "gpt_compare": {
            "rows": [{"strategy": h, "status": h, "tokens_per_s": 10.0, "peak_memory_bytes": 5.0, "mfu": h}]
        },
        "lenet_profile": {
            "rows": [{"variant": h, "layer": h, "fwd_ms_median": h}],
            "steps": h,
            "batch_size": h,
            "device": h,
            "trace": h,
        },
        "ops_check": {"rows": [{"op": h, "case": h, "impl": h, "worst_ratio_to_tol": h, "ok": h, "dtype": h}]},
        "ops_bench": {"rows": [{"layer": h, "impl": h, "fwd_median_s": h, "batch": h}]},
    }
    out = {}
    for kind, data in kinds.items():
        p = folder / f"{kind}.json"
        p.write_text(json.dumps(stamp(kind, data, plan_record(h, device_name=h, precision=h, model={"name": h}))))
        out[kind] = p
    return out


def test_every_field_of_every_input_kind_is_escaped(hostile_run, tmp_path):
    from trainlab.report.inputs import identify

    files = _result_files(tmp_path)
    for kind, p in files.items():
        assert identify(p, json.loads(p.read_text())).kind == kind, kind  # each file is read as the kind it stands for
    out = tmp_path / "report"
    assert main(["report", str(hostile_run), *map(str, files.values()), "-o", str(out), "--title", HOSTILE]) == 0
    page = (out / "index.html").read_text()
    assert_escaped(page, expect_visible=30)
    # each kind's hostile text arrived (escaped) in its section: nothing was dropped to pass the test
    for kind in files:
        assert f"{kind}.json" in page


def test_the_lab_report_escapes_its_state_and_step_outputs(tmp_path):
    from trainlab.hardware import Machine
    from trainlab.lab.run import write_outputs

    root = tmp_path / "lab"
    (root / "steps" / "dp_compile").mkdir(parents=True)
    (root / "steps" / "dp_compile" / "dp_compile.json").write_text(
        json.dumps(stamp("dp_compile", {"rows": [{"variant": HOSTILE, HOSTILE: 1.0}]}, plan_record(HOSTILE)))
    )
    (root / "steps" / "gelu_check").mkdir(parents=True)
    (root / "steps" / "gelu_check" / "log.txt").write_text(HOSTILE)
    state = {
        "version": 1,
        "size": "tiny",
        "hardware": Machine(name=HOSTILE).to_dict(),
        "calls": [{"command": HOSTILE, "started_utc": HOSTILE, "budget_s": 60, "used_s": 1}],
        "steps": {
            "dp_compile": {"status": "ok", "title": HOSTILE, "command": HOSTILE, "seconds": 1.0, "estimate_s": 1.0},
            "gelu_check": {"status": "failed", "rc": 1, "log": HOSTILE, "title": HOSTILE},
            "lenet_train": {"status": "not run", "reason": HOSTILE},
        },
    }
    write_outputs(root, state)
    page = (root / "report" / "index.html").read_text()
    assert_escaped(page, expect_visible=5)


def test_hostile_names_survive_markdown_and_the_archive(hostile_run, tmp_path):
    """The Markdown rendering shows the text as it was, escaped for Markdown (`report.markdown`): a
    viewer renders raw HTML in Markdown, so `<script>` must arrive as `\\<script\\>`, never as a tag."""
    import re

    from trainlab.report import markdown

    run = tmp_path / "copy"
    shutil.copytree(hostile_run, run)
    out = tmp_path / "r"
    assert main(["report", str(run), "-o", str(out)]) == 0
    md = (out / "report.md").read_text()
    assert markdown.text(HOSTILE) in md  # shown, as text
    outside_code = re.sub(r"^(`{3,})$.*?^\1$", "", md, flags=re.S | re.M)  # a code block shows its text as is
    assert not re.search(r"(?<!\\)<(script|img)", outside_code), outside_code[:3000]


def test_the_text_gate_guards_markdown_and_figure_titles():
    """A folder name holding a terminal escape, a bell and a lone surrogate (a Latin-1 byte read back
    through surrogateescape) reaches report.md and a figure's title as visible escapes, never raw."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from trainlab.report.markdown import code, text
    from trainlab.report.plots import _title

    hostile = "run\x1b]0;pwned\x07\x1b[2J-\udce9"
    for rendered in (text(hostile), code(hostile)):
        assert "\x1b" not in rendered and "\x07" not in rendered and "\udce9" not in rendered
        assert "\\x1b" in rendered and "\\udce9" in rendered
        rendered.encode("utf-8")  # writable: no lone surrogate left
    fig, ax = plt.subplots()
    _title(ax, hostile)
    title = ax.get_title()
    plt.close(fig)
    assert "\x1b" not in title and "\\udce9" in title
