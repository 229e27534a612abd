"""What breaks under torch.compile: graph breaks (`.item()`, data-dependent control flow, LeNet-5's step)
and recompiles on a new shape, counted by TorchDynamo (trainlab.lenet.compile_report).

    python benchmarks/compile_breaks.py [--out DIR]

The counts do not depend on the device (Dynamo traces Python on the host), so this runs on a CPU; the
lab runs it as its `compile_breaks` step (issue 29, goal 4).
"""

from __future__ import annotations

import argparse

import torch
from _common import add_output_args, check_output, save

from trainlab.lenet.compile_report import markdown, report


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16, help="LeNet-5 batch for the break counts (default 16)")
    ap.add_argument("--name", default="compile_breaks", help="result file stem")
    add_output_args(ap)
    args = ap.parse_args()
    if args.batch < 1:
        ap.error(f"--batch {args.batch}: expected an integer >= 1")
    check_output(args.out, args.name, force=args.force)
    torch.manual_seed(0)
    rows = report(args.batch)
    text = markdown(rows)
    print(text)
    save(args.name, {"rows": rows}, text, text.splitlines(), torch.device("cpu"), out=args.out)


if __name__ == "__main__":
    main()
