"""Issue 36's done-when: `trainlab lab --size tiny` on a CPU, then `trainlab report LAB -o OUT`, and no
sentence of the report states a dataset size, model shape, device or precision that differs from
what the run recorded. The walker reads every generated sentence that carries a number (outside the
raw-value blocks, which quote the files) — the sizes and shapes it states, and every device and precision
named — and checks each stated fact against the records' plans."""

from __future__ import annotations

import json
import re
from pathlib import Path

from trainlab.cli import main

ROOT = Path(__file__).resolve().parents[1]
NUM = r"(?<![\w.§–,-])(\d{1,3}(?:,\d{3})+|\d+)(?![\d])"  # a number of its own: not "GPT-2", "§4.1.4"


def recorded_facts(lab: Path) -> dict[str, set]:
    """Every fact the lab's result records hold: dataset sizes, model dimensions, devices, precisions."""
    facts: dict[str, set] = {k: set() for k in ("sizes", "dims", "devices", "precisions")}
    for f in (lab / "steps").rglob("*.json"):
        try:
            data = json.loads(f.read_text())
        except ValueError:
            continue
        plan = data.get("plan") if isinstance(data, dict) and "kind" in data else None
        if not isinstance(plan, dict):
            continue
        facts["devices"].add(plan.get("device"))
        facts["precisions"].add(plan.get("precision"))
        dataset, model = plan.get("dataset"), plan.get("model")
        for v in (dataset if isinstance(dataset, dict) else {}).values():
            if isinstance(v, int):
                facts["sizes"].add(v)
        for k, v in (model if isinstance(model, dict) else {}).items():
            if isinstance(v, int):
                facts["dims"].add((k, v))
    return facts


def sentences(md: str) -> list[str]:
    """The report's generated sentences: prose, notes and table cells, not fenced blocks (nvidia-smi,
    raw summary.json values: quotes of the files themselves)."""
    kept, fenced = [], False
    for line in md.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced and not line.startswith("<details><summary>raw values"):
            kept.append(line)
    text = "\n".join(kept)
    return [s.strip() for s in re.split(r"(?<=[.;:|])\s+|\n", text) if s.strip()]


def _n(text: str) -> int:
    return int(text.replace(",", ""))


def wrong_facts(md: str, facts: dict[str, set]) -> tuple[list[str], dict[str, int]]:
    """(sentences stating a fact no record holds, how many facts of each kind were checked)."""
    wrong, checked = [], {"sizes": 0, "dims": 0, "devices": 0, "precisions": 0}
    dims = {"hidden": "hidden", "heads": "heads", "layers": "layers", "sequence": "seq"}
    for s in sentences(md):
        for m in re.finditer(NUM + r" (?:MNIST )?(training|test)(?: images)?\b", s):
            checked["sizes"] += 1
            if _n(m.group(1)) not in facts["sizes"]:
                wrong.append(s)
        for word, key in dims.items():
            for m in re.finditer(rf"\b{word} {NUM}|{NUM} {word}\b", s):
                checked["dims"] += 1
                if (key, _n(m.group(1) or m.group(2))) not in facts["dims"]:
                    wrong.append(s)
        for m in re.finditer(r"\bdevice (cpu|cuda|mps|xpu)\b", s):
            checked["devices"] += 1
            if m.group(1) not in facts["devices"]:
                wrong.append(s)
        for m in re.finditer(r"\bprecision ([^;.,)]+)", s):
            checked["precisions"] += 1
            if m.group(1).strip() not in facts["precisions"]:
                wrong.append(s)
        if facts["devices"] <= {"cpu"} and re.search(r"trained on the GPU|on the GPU in|\bautocast\b", s):
            wrong.append(s)
    return wrong, checked


def test_the_walker_catches_the_sentences_the_issue_found():
    facts = {"sizes": {2048, 1024}, "dims": {("hidden", 64), ("heads", 4)}, "devices": {"cpu"}, "precisions": {"fp32"}}
    bad = (
        "trained on the 60,000 MNIST training images and tested on the 10,000 test images.\n"
        "GPT-2 (hidden 1600, 32 heads, 48 layers, sequence 1024) trained on random tokens.\n"
        "Ran with device cuda; precision bf16.\n"
        "on NVIDIA H100 in bfloat16 autocast on 5 epochs.\n"
    )
    wrong, _ = wrong_facts(bad, facts)
    assert len(set(wrong)) == 5, wrong  # each of the four lines; "device cuda; precision bf16" twice
    good = "trained on mnist, 2,048 training and 1,024 test images.\nRan with device cpu; precision fp32; hidden 64, 4 heads.\n"
    assert wrong_facts(good, facts) == ([], {"sizes": 2, "dims": 2, "devices": 1, "precisions": 1})


def check_lab_report_facts(lab: Path, out: Path) -> None:
    """Every fact the report of the lab folder `lab` states is one its records hold (tests/test_lab.py runs
    it on the tiny CPU lab it has just killed, resumed and finished: one lab run serves both checks)."""
    state = json.loads((lab / "results.json").read_text())
    ok = {n for n, rec in state["steps"].items() if rec.get("status") == "ok"}
    # a step may be skipped for budget on a loaded box (its limit is a budget, not a test): some must exist
    assert ok & {"lenet_train", "gpt_baseline", "gpt_best"}, state["steps"]
    assert main(["report", str(lab), "-o", str(out)]) == 0
    md = (out / "report.md").read_text()
    facts = recorded_facts(lab)
    if "lenet_train" in ok:
        assert {2048, 1024} <= facts["sizes"]  # the tiny lab's LeNet-5 record: its sizes, not MNIST's
    wrong, checked = wrong_facts(md, facts)
    assert wrong == [], wrong
    assert checked["devices"] >= 1 and checked["precisions"] >= 1, checked
    if "lenet_train" in ok:
        assert checked["sizes"] >= 2, checked
    if ok & {"gpt_best", "gpt_baseline"}:
        assert checked["dims"] >= 3, checked  # a GPT that ran: its shape is stated, from its record
    assert "60,000" not in md and "hidden 1600" not in md and str(lab) not in md
