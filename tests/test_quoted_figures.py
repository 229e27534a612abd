"""The headline figures the README, docs/results.md and the walkthrough quote are generated from the
committed results (docs/excerpts.py FIGURES, `<!-- fig: NAME -->value<!-- /fig -->`): rerunning a
benchmark with --force and forgetting `python docs/excerpts.py` fails here, and so does a headline
number typed into those pages by hand."""

import re
from pathlib import Path

import pytest
from test_walkthrough import EXCERPTS  # docs/excerpts.py, loaded once

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "docs" / "results.md", ROOT / "docs" / "lab-walkthrough.md"]
# a measured figure as the pages write it: a number with a unit of time, speed-up, share or memory
MEASURED = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?\s?(?:%|×|s\b|ms\b|min\b|GiB\b|TFLOPS\b)")


def _headline(text: str, heading: str) -> str:
    """The section under `heading` (up to the next heading of the same level)."""
    level = heading.split(" ")[0]
    start = text.index(heading)
    end = re.search(rf"(?m)^{level} ", text[start + len(heading) :])
    return text[start : start + len(heading) + end.start()] if end else text[start:]


def _by_hand(section: str) -> list[str]:
    """Measured figures in a section that no `fig:` marker or quoted output produced."""
    section = re.sub(r"<!-- fig: [\w.]+ -->.*?<!-- /fig -->", "", section, flags=re.DOTALL)
    section = re.sub(r"```.*?```", "", section, flags=re.DOTALL)  # quoted output, checked on its own
    section = re.sub(r"[≥≤<>]\s?\d[\d.]*\s?(?:%|×|s|ms|min)", "", section)  # targets, not measurements
    section = re.sub(r"(?<![\d.])9[89] ?%", "", section)  # the lab's accuracy targets ("time to 99 %")
    return MEASURED.findall(section)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_generated_figure_is_what_the_committed_results_give(page):
    assert EXCERPTS.figure_problems(page) == []


@pytest.mark.parametrize(
    "page,heading",
    [
        (PAGES[0], "# trainlab"),  # the first screen, up to Quick start
        (PAGES[0], "## Headline figures"),
        (PAGES[1], "## On one H200"),
        (PAGES[1], "## On one H100"),
        (PAGES[1], "## Headline figures (CPU)"),
    ],
)
def test_no_headline_number_is_written_by_hand(page, heading):
    text = page.read_text()
    section = _headline(text, heading) if heading != "# trainlab" else text[: text.index("## Quick start")]
    assert len(EXCERPTS.figures(section)) >= 5, f"{page.name} {heading}: its figures are not generated"
    assert _by_hand(section) == [], f"{page.name} {heading}: figures typed by hand"


def test_the_h200_run_is_the_headline_and_its_peer_and_seed_count_stand_beside_its_figures():
    """The newest GPU run leads (the README's first screen quotes it before the older H100 lab), and the
    figures that overclaim alone never appear alone: MFU beside the peer ratio, time to 99 % beside the
    count of seeds that reached it."""
    first_screen = PAGES[0].read_text()[: PAGES[0].read_text().index("## Quick start")]
    names = [name for name, _, _ in EXCERPTS.figures(first_screen)]
    assert names.index("h200.t99_s") < names.index("h100.steps_ok")
    for page in PAGES:
        names = {name for name, _, _ in EXCERPTS.figures(page.read_text())}
        assert {"h200.t99_s", "h200.t99_seeds", "h200.gpt_mfu", "h200.gpt_vs_peer", "h200.gelu_cuda_copy"} <= names, (
            page.name
        )
        if "h100.gpt_vs_baseline" in names:
            assert "h200.gpt_vs_peer" in names, page.name


def test_the_walkthrough_quotes_one_time_to_99_the_readme_quotes():
    readme, walk = ({n: v for n, v, _ in EXCERPTS.figures(p.read_text())} for p in (PAGES[0], PAGES[2]))
    assert walk.get("cpu.t99_s") == readme["cpu.t99_s"] and walk.get("cpu.t99_ratio") == readme["cpu.t99_ratio"]


def test_the_checker_fails_on_a_drifted_or_hand_written_figure(tmp_path):
    doc = tmp_path / "doc.md"
    good = EXCERPTS.FIGURES["h100.t99_s"]()
    doc.write_text(
        f"x <!-- fig: h100.t99_s -->{good}<!-- /fig --> y <!-- fig: cpu.t99_ratio -->13.8×<!-- /fig -->"
        " <!-- fig: no.such -->1<!-- /fig -->\n"
    )
    problems = EXCERPTS.figure_problems(doc)
    assert len(problems) == 2 and "cpu.t99_ratio says '13.8×'" in problems[0] and "no.such" in problems[1]
    EXCERPTS.regenerate(doc)
    assert "13.8×" not in doc.read_text() and len(EXCERPTS.figure_problems(doc)) == 1  # the unknown name stays
    assert _by_hand("## H\nmedian **3.1 s**, 13.8× the loop, ≥ 99 % target <!-- fig: a -->2 s<!-- /fig -->") == [
        "3.1 s",
        "13.8×",
    ]
