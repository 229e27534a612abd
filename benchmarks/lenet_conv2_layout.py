"""LeNet-5's conv2 (6 → 16 channels, 5×5, 14×14 → 10×10) in NCHW and channels-last: forward, input
gradient and weight gradient timed apart, interleaved, on one thread.

Why it exists: the `fast` preset runs channels-last (ATen's max-pool and the fused first stage want
it), but oneDNN's input gradient of conv2 — a convolution with 6 output channels — is much slower in
that layout. This measures each of the three convolutions in each layout and dtype, so the choice made
in `lenet.model.NCHWConv2d` (compute conv2 in NCHW, hand the output back channels-last) rests on a
number, and `to NCHW`/`to channels-last` rows give the price of the layout copies it adds.

    python benchmarks/lenet_conv2_layout.py [--batch-size 256] [--rounds 40] [--out DIR] [--name NAME] [--force]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from _common import add_output_args, check_output, save

from trainlab.stats import time_interleaved

CL = torch.channels_last


def convolutions(n: int, dtype: torch.dtype, channels_last: bool) -> dict:
    """The three convolutions of conv2's training step, on random tensors of LeNet's shapes. Each
    gradient is autograd's backward of a graph built once (retain_graph): with only x, or only the
    weight, requiring a gradient, it runs exactly that one convolution of the backward."""
    layout = (lambda t: t.contiguous(memory_format=CL)) if channels_last else (lambda t: t.contiguous())
    x, w, dy = (layout(torch.randn(*shape).to(dtype)) for shape in ((n, 6, 14, 14), (16, 6, 5, 5), (n, 16, 10, 10)))
    x_in, w_in = x.clone().requires_grad_(), w.clone().requires_grad_()
    y_x, y_w = F.conv2d(x_in, w), F.conv2d(x, w_in)
    return {
        "forward": lambda: F.conv2d(x, w),
        "input gradient": lambda: torch.autograd.grad(y_x, x_in, dy, retain_graph=True)[0],
        "weight gradient": lambda: torch.autograd.grad(y_w, w_in, dy, retain_graph=True)[0],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=40, help="timed runs of each convolution")
    ap.add_argument("--name", default="lenet_conv2_layout", help="result file stem: <out>/<name>.{json,md,log}")
    add_output_args(ap)
    args = ap.parse_args()
    if args.batch_size < 1 or args.rounds < 1:
        ap.error(f"--batch-size and --rounds must be positive integers, got {args.batch_size} and {args.rounds}")
    check_output(args.out, args.name, force=args.force)
    torch.set_num_threads(1)  # CPU time is a step's time only on one thread
    fns, cells = {}, {}
    for dtype in (torch.bfloat16, torch.float32):
        for layout, channels_last in (("NCHW", False), ("channels-last", True)):
            for op, fn in convolutions(args.batch_size, dtype, channels_last).items():
                key = f"{str(dtype).removeprefix('torch.')} {layout} {op}"
                fns[key], cells[key] = fn, (str(dtype).removeprefix("torch."), layout, op)
    act = torch.randn(args.batch_size, 16, 10, 10, dtype=torch.bfloat16)
    act_cl = act.contiguous(memory_format=CL)
    fns["bf16 copy to channels-last"] = lambda: act.contiguous(memory_format=CL)
    fns["bf16 copy to NCHW"] = lambda: act_cl.contiguous()
    stats = time_interleaved(fns, warmup=5, rounds=args.rounds, clock=time.process_time)
    rows = [
        {"what": k, "median_ms": s["median"] * 1e3, "p10_ms": s["p10"] * 1e3, "p90_ms": s["p90"] * 1e3}
        for k, s in stats.items()
    ]
    med = {r["what"]: r["median_ms"] for r in rows}
    md = [
        f"conv2 of LeNet-5, batch {args.batch_size}, 1 thread, process CPU time, {args.rounds} interleaved runs each",
        "",
        "| dtype | convolution | NCHW ms [p10, p90] | channels-last ms [p10, p90] | channels-last ÷ NCHW |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for dtype in ("bfloat16", "float32"):
        for op in ("forward", "input gradient", "weight gradient"):
            a, b = (next(r for r in rows if r["what"] == f"{dtype} {lay} {op}") for lay in ("NCHW", "channels-last"))
            md.append(
                f"| {dtype} | {op} | {a['median_ms']:.3f} [{a['p10_ms']:.3f}, {a['p90_ms']:.3f}] | "
                f"{b['median_ms']:.3f} [{b['p10_ms']:.3f}, {b['p90_ms']:.3f}] | {b['median_ms'] / a['median_ms']:.2f} |"
            )
    md += ["", "| layout copy of conv2's output (bf16) | ms |", "| --- | ---: |"]
    md += [f"| {k.removeprefix('bf16 ')} | {med[k]:.3f} |" for k in ("bf16 copy to channels-last", "bf16 copy to NCHW")]
    text = "\n".join(md)
    print(text)
    save(args.name, rows, text, [text], out=args.out)


if __name__ == "__main__":
    main()
