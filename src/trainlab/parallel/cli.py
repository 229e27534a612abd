"""`trainlab dp compare`: parse flags and call trainlab.parallel.compare."""

from __future__ import annotations

import argparse

MODES_HELP = "comma-separated: none (single process), dp (nn.DataParallel, ≥2 GPUs), ddp, allreduce (hand-written)"


def run_compare(args: argparse.Namespace) -> int:
    from trainlab.io import atomic_write_json, atomic_write_text
    from trainlab.parallel.compare import compare, format_report, parse_modes, parse_workers

    rows, loader_rows = compare(parse_modes(args.modes), nproc=args.nproc, epochs=args.epochs, device=args.device,
                                batch_size=args.batch_size, train_subset=args.train_subset, test_subset=args.test_subset,
                                workers=parse_workers(args.workers), seed=args.seed, threads=args.threads,
                                repeats=args.repeats)
    report = format_report(rows, loader_rows)
    print(report)
    if args.json:
        atomic_write_json(args.json, rows)  # the contract: a list of rows, one per mode
        if loader_rows:
            sweep = args.json[:-5] if args.json.endswith(".json") else args.json
            atomic_write_json(sweep + ".loaders.json", loader_rows)
    if args.md:
        atomic_write_text(args.md, report)
    return 0


def run_worker(args: argparse.Namespace) -> int:
    from trainlab.parallel.compare import run_worker as worker

    return worker(args.spec, args.result)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("dp", help="data-parallel LeNet-5: compare none / dp / ddp / allreduce",
                              description="Data-parallel LeNet-5: single process, nn.DataParallel, DDP and a hand-written all-reduce.")
    sub = p.add_subparsers(dest="dp_command", metavar="SUBCOMMAND")
    sub.required = True
    c = sub.add_parser("compare", help="run several modes on the same global batches and say where the time goes")
    c.add_argument("--modes", default="none,ddp,allreduce", help=MODES_HELP)
    c.add_argument("--nproc", type=int, default=2, help="processes for ddp/allreduce (one per GPU on CUDA)")
    c.add_argument("--epochs", type=int, default=1)
    c.add_argument("--device", default="auto", help="auto | cpu | cuda")
    c.add_argument("--batch-size", type=int, default=128,
                   help="global batch, split across ranks (default 128: the reference batch of --scale-lr)")
    c.add_argument("--train-subset", type=int, default=None, help="train on the first N images")
    c.add_argument("--test-subset", type=int, default=None, help="evaluate on the first N test images")
    c.add_argument("--workers", default="0,1,2,4", help="DataLoader num_workers sweep ('' to skip)")
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--repeats", type=int, default=1, help="run everything R times round-robin; report medians")
    c.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads per process for every mode (default: torch's choice single-process, 1 per rank)")
    c.add_argument("--json", default=None, metavar="OUT.json", help="write the rows (and OUT.loaders.json for the sweep)")
    c.add_argument("--md", default=None, metavar="OUT.md", help="write the tables as markdown")
    c.set_defaults(func=run_compare)
    w = sub.add_parser("worker", help="(internal) one process of a compare run")
    w.add_argument("spec")
    w.add_argument("result")
    w.set_defaults(func=run_worker)
