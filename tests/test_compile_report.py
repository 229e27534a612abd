"""trainlab.lenet.compile_report (issue 29, goal 4): graph breaks and recompiles counted by TorchDynamo,
for toys broken on purpose and for LeNet-5's step, on the CPU (the counts do not depend on the device)."""

import pytest

from trainlab.lenet.compile_report import markdown, report


@pytest.fixture(scope="module")
def rows():
    return {r["case"]: r for r in report(batch=8)}


def test_the_toys_break_where_they_should(rows):
    clean, item, branch = rows["toy: no break (control)"], rows["toy: .item()"], rows["toy: if on a tensor's value"]
    assert (clean["graphs"], clean["graph_breaks"], clean["fallbacks"]) == (1, 0, 0)
    assert (item["graphs"], item["graph_breaks"]) == (2, 1) and "item()" in item["first_break"]
    assert (branch["graphs"], branch["graph_breaks"]) == (2, 1) and "jump" in branch["first_break"]


def test_lenet_forward_is_one_graph_and_its_step_breaks_at_backward(rows):
    forward = rows["LeNet-5 forward"]
    assert (forward["graphs"], forward["graph_breaks"]) == (1, 0) and forward[
        "ops"
    ] >= 10  # conv, relu, pool ×2, 3 linear …
    step = rows["LeNet-5 step: forward + loss + backward (lenet.step)"]
    assert (step["graphs"], step["graph_breaks"]) == (2, 1) and "backward" in step["first_break"]
    seed_style = rows["LeNet-5 seed-style step: loss.item(), then backward"]
    assert seed_style["fallbacks"] >= 1 and "item()" in seed_style["first_break"]


def test_a_new_shape_recompiles(rows):
    static = {c: r for c, r in rows.items() if r["kind"] == "recompiles" and "dynamic=False" in c}
    auto = {c: r for c, r in rows.items() if r["kind"] == "recompiles" and "automatic dynamic" in c}
    assert [(r["shapes"], r["compiles"]) for r in static.values()] == [(4, 4), (3, 3)]  # one graph per shape
    assert [r["compiles"] for r in auto.values()] == [2, 2]  # the second shape makes the batch dimension symbolic
    assert "| toy, 4 input sizes, dynamic=False | 4 | 4 | 3 |" in markdown(list(rows.values()))
