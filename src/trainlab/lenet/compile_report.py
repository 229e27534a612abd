"""What breaks under `torch.compile`: graph breaks and recompiles, counted by TorchDynamo itself.

`torch.compile` turns Python into graphs with TorchDynamo. Where it meets something it cannot put in a
graph it *breaks*: it ends the graph, runs that piece in Python, and starts a new graph after it. Each
break costs a host round trip (and, on a GPU, a sync where a value comes back to Python) and splits the
fusion the compiler could have done. A graph is also compiled for the shapes it saw: a new input shape
*recompiles* it (by default the second shape recompiles once with the batch dimension made symbolic;
with `dynamic=False` every new shape compiles again). This module counts both, with
`torch._dynamo.explain` (graphs, breaks and their reasons) and a counting backend (compiles), for:

- toy functions that break on purpose: `.item()` (a tensor's value read into Python) and an `if` on a
  tensor's value (data-dependent control flow), beside one that does not break (the control);
- LeNet-5: the model's forward, the training step's forward + backward (`lenet.step`; `.backward()`
  itself is not traced by Dynamo: AOTAutograd compiles the backward of the forward graph instead), and
  the seed-style step that reads `loss.item()` every step;
- recompiles: a toy and LeNet-5 fed new batch sizes (a short last batch is one), static and dynamic.

It runs on any device (the counts do not depend on one): `benchmarks/compile_breaks.py` writes the
table, and the lab runs that script as its `compile_breaks` step.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch
import torch.nn.functional as F

# ---------------------------------------------------------------------------- the toys


def toy_clean(x):
    """No break: elementwise ops and a reduction, all traceable (the control)."""
    y = torch.sin(x) * 2
    return y - y.mean()


def toy_item(x):
    """Breaks on `.item()`: the value leaves the graph for Python (a host sync on a GPU)."""
    y = x * 2
    scale = y.abs().max().item()
    return y / scale


def toy_branch(x):
    """Breaks on data-dependent control flow: which branch runs depends on a tensor's value."""
    y = torch.sin(x)
    if y.sum() > 0:
        return y * 2
    return y - 1


TOYS = {"toy: no break (control)": toy_clean, "toy: .item()": toy_item, "toy: if on a tensor's value": toy_branch}


# ---------------------------------------------------------------------------- counting


@contextmanager
def _quiet():
    """Dynamo logs every break as a warning with a stack; the counts are the result here."""
    torch._dynamo.reset()
    previous = logging.getLogger("torch._dynamo").level
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    try:
        yield
    finally:
        logging.getLogger("torch._dynamo").setLevel(previous)
        torch._dynamo.reset()


def explain(fn, *args) -> dict:
    """Graphs, graph breaks, traced ops and each break's reason (first line) for `fn(*args)`."""
    with _quiet():
        e = torch._dynamo.explain(fn)(*args)
    return {
        "graphs": e.graph_count,
        "graph_breaks": e.graph_break_count,
        "ops": e.op_count,
        "break_reasons": [str(b.reason).strip().splitlines()[0] for b in e.break_reasons],
    }


def count_compiles(fn, shapes: list[tuple], dynamic: bool | None, make=torch.randn) -> int:
    """How many times `torch.compile(fn, dynamic=…)` compiles a graph when called on inputs of `shapes`, in order."""
    compiles = 0

    def counting_backend(gm, example_inputs):
        nonlocal compiles
        compiles += 1
        return gm.forward  # run the captured graph as is: the count is the result, not the speed

    with _quiet():
        compiled = torch.compile(fn, backend=counting_backend, dynamic=dynamic)
        for shape in shapes:
            compiled(make(*shape))
    return compiles


# ---------------------------------------------------------------------------- LeNet-5


def lenet_step(batch: int = 16):
    """The default recipe's LeNet-5 step (eager, fp32, PyTorch's layers) on the CPU and a random batch."""
    from trainlab.lenet.config import TrainConfig
    from trainlab.lenet.plan import resolve
    from trainlab.lenet.setup import build_model, build_optimizer
    from trainlab.lenet.step import make_step

    plan = resolve(TrainConfig(device="cpu", amp="off", channels_last="off", ops="aten"), torch.device("cpu"))
    model = build_model(plan)
    step = make_step(plan, model, build_optimizer(plan, model))
    g = torch.Generator().manual_seed(0)
    return step, torch.randn(batch, 1, 28, 28, generator=g), torch.randint(0, 10, (batch,), generator=g)


def report(batch: int = 16) -> list[dict]:
    """Every row of the table: breaks (explain) and recompiles (compile counts)."""
    rows = []
    for case, fn in TOYS.items():
        rows.append({"case": case, "kind": "breaks", **explain(fn, torch.randn(64))})
    step, x, y = lenet_step(batch)
    model = step.model

    def seed_style_step(x, y):
        loss = F.cross_entropy(model(x), y)
        logged = loss.item()  # the handout's per-step `running_loss += loss.item()`
        loss.backward()
        return logged

    rows.append({"case": "LeNet-5 forward", "kind": "breaks", **explain(model, x)})
    rows.append(
        {
            "case": "LeNet-5 step: forward + loss + backward (lenet.step)",
            "kind": "breaks",
            **explain(step.forward_backward, x, y),
        }
    )
    rows.append(
        {
            "case": "LeNet-5 seed-style step: loss.item(), then backward",
            "kind": "breaks",
            **explain(seed_style_step, x, y),
        }
    )
    toy_shapes = [(64,), (128,), (256,), (512,)]
    lenet_shapes = [(256, 1, 28, 28), (96, 1, 28, 28), (128, 1, 28, 28)]  # 60,000 = 234 × 256 + a last batch of 96
    with torch.no_grad():
        for dynamic, how in ((False, "dynamic=False"), (None, "default (automatic dynamic)")):
            rows.append(
                {
                    "case": f"toy, 4 input sizes, {how}",
                    "kind": "recompiles",
                    "shapes": len(toy_shapes),
                    "compiles": count_compiles(toy_clean, toy_shapes, dynamic),
                }
            )
            rows.append(
                {
                    "case": f"LeNet-5 forward, batches 256, 96, 128, {how}",
                    "kind": "recompiles",
                    "shapes": len(lenet_shapes),
                    "compiles": count_compiles(model, lenet_shapes, dynamic),
                }
            )
    for r in rows:
        if "compiles" in r:
            r["recompiles"] = r["compiles"] - 1
        else:
            # a break counts where a graph follows it; Dynamo lists every call it fell back on
            r["fallbacks"] = len(r["break_reasons"])
            r["first_break"] = r["break_reasons"][0] if r["break_reasons"] else ""
    return rows


def markdown(rows: list[dict]) -> str:
    breaks = [
        "| case | graphs | graph breaks | calls Dynamo fell back on | ops traced | the first one's reason |",
        "| --- | ---: | ---: | ---: | ---: | --- |",
    ]
    breaks += [
        f"| {r['case']} | {r['graphs']} | {r['graph_breaks']} | {r['fallbacks']} | {r['ops']} | {r['first_break'] or '—'} |"
        for r in rows
        if r["kind"] == "breaks"
    ]
    again = ["| case | input shapes | compiles | recompiles |", "| --- | ---: | ---: | ---: |"]
    again += [
        f"| {r['case']} | {r['shapes']} | {r['compiles']} | {r['recompiles']} |"
        for r in rows
        if r["kind"] == "recompiles"
    ]
    return (
        "Graph breaks (`torch._dynamo.explain`; a break counts where a new graph follows it, so a "
        "`.item()` at the end of a function is a fallback, not a break):\n\n"
        + "\n".join(breaks)
        + "\n\nRecompiles on a new shape (a counting backend):\n\n"
        + "\n".join(again)
    )
