"""benchmarks/results/INDEX.md is current: every committed result is listed with what produced it and
where it is cited, and a result nothing cites says why it is kept (benchmarks/results_index.py)."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import results_index as INDEX  # a script, not a package


def test_the_index_is_current():
    assert INDEX.INDEX.read_text() == INDEX.render(), "run: python benchmarks/results_index.py"


def test_every_result_is_cited_or_says_why_it_is_kept():
    assert INDEX.problems() == []


def test_the_index_reads_producers_citations_and_notices_an_unexplained_result(tmp_path):
    results = tmp_path / "benchmarks" / "results"
    (results / "run_a").mkdir(parents=True)
    (results / "bench_x.md").write_text("Command: `python benchmarks/x.py --n 3`  \nMachine: cpu\n")
    (results / "bench_x.json").write_text(json.dumps({"command": "ignored: the .md comes first"}))
    (results / "bench_y.log").write_text("$ trainlab gpt plan --model tiny\nrows\n")
    (results / "run_a" / "README.md").write_text("# a run\n\n    python3 -m trainlab lab --out /tmp/lab\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "results.md").write_text("see `bench_x.md` and run_a/; bench_x.py is a script\n")
    entries = INDEX.entries(results)
    assert sorted(entries) == ["bench_x", "bench_y", "run_a"]
    assert INDEX.producer(entries["bench_x"]) == "python benchmarks/x.py --n 3"
    assert INDEX.producer(entries["bench_y"]) == "trainlab gpt plan --model tiny"
    assert INDEX.producer(entries["run_a"]) == "python3 -m trainlab lab --out /tmp/lab …"
    texts = INDEX.citers(tmp_path)
    assert INDEX.cited_in("bench_x", texts) == ["docs/results.md"] and INDEX.cited_in("run_a", texts) == [
        "docs/results.md"
    ]
    assert INDEX.cited_in("bench_y", texts) == []  # nothing cites it
    assert INDEX.problems(tmp_path) == ["bench_y"]  # and UNCITED gives no reason
    assert "| `bench_y` | .log | `trainlab gpt plan --model tiny` | — *kept:* **no reason given** |" in INDEX.render(
        tmp_path
    )
