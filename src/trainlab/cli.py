"""Command line: parse arguments and call the library. No logic lives here.

`COMMANDS` is the registry: each command's one-line help and the `module:function` that adds its flags to
its parser and sets `func`, the function that runs it. Only the command named on the command line is
imported (`trainlab --help` imports none; `trainlab train --help` only the LeNet CLI and its configs), so
a help text or a flag error costs no torch import: the CLI modules import their libraries inside the
functions that run a command (tests/test_cli.py holds the help path free of torch). A command whose
module fails to import is a bug, and it fails loudly: a command must never silently vanish.

`trainlab worker SPEC.json` (hidden) is how every worker process starts: the parent wrote its resolved
config as JSON (`distributed.launch`), and `WORKERS` names the function that runs it. Every worker (and
every rank under a torchrun of the user's) ends one way, `distributed.launch.end_worker`: its results
are written by then; a barrier with the process-group timeout; exit without the destructors.

`main` is the one place errors reach the user (exit codes in `trainlab.errors`): a `UserError` is its
one line; any other `OSError` (disk full, a permission the checks could not foresee) is one line naming
the path; anything else is a bug, shown with its traceback and a request to report it. A worker under
`trainlab`'s launcher also leaves its line in the launcher's error file (`distributed.launch`), so
the parent prints one line for the whole job instead of one per rank.
"""

from __future__ import annotations

import argparse
import importlib
import shlex
import sys
import traceback

from trainlab.errors import UserError
from trainlab.flags import Parser
from trainlab.io import set_force

# command → ("module:function" that fills its parser, its one-line help), in --help order
COMMANDS = {
    "train": ("trainlab.lenet.cli:add_train", "train LeNet-5 on MNIST"),
    "eval": ("trainlab.lenet.cli:add_eval", "re-evaluate a checkpoint on the test set"),
    "sweep": ("trainlab.lenet.cli:add_sweep", "train over a grid of flag values and seeds (each a run directory)"),
    "dp": ("trainlab.lenet.cli:add_dp", "data-parallel LeNet-5: compare none / dp / ddp / allreduce / ring"),
    "profile": (
        "trainlab.lenet.cli:add_profile",
        "per-layer forward/backward time of LeNet-5 training steps, ATen's layers and ours side by side "
        "(torch.profiler; Chrome trace in the run directory)",
    ),
    "async": (
        "trainlab.lenet.cli:add_async",
        "the asynchronous-execution and automatic-parallelism experiments: queued vs finished, "
        "t1 + N·t2 + t3, one stream vs two, a copy behind compute, the CPU and the GPU at once",
    ),
    "data": ("trainlab.data.cli:add_data", "show, verify, fetch or convert the MNIST and Fashion-MNIST data"),
    "ops": ("trainlab.ops.cli:add_ops", "our operators: check and benchmark every rung vs aten"),
    "gelu": ("trainlab.ops.cli:add_gelu", "verify and benchmark the GELU rungs (= trainlab ops check|bench --op gelu)"),
    "gpt": ("trainlab.gpt.cli:add_gpt", "GPT-2 strategies: run one, predict memory, run a matrix"),
    "report": (
        "trainlab.report.cli:add_report",
        "build an HTML/Markdown (and PDF) report from run directories, result JSONs or a lab folder",
    ),
    "lab": ("trainlab.lab.cli:add_lab", "the whole lab, budgeted and resumable, with its report"),
}

# spec["worker"] → "module:function" taking the spec dict and returning an exit code
WORKERS = {
    "train": "trainlab.lenet.cli:train_worker",
    "dp-compare": "trainlab.lenet.compare:run_worker",
    "gpt-bench": "trainlab.gpt.bench:bench_worker",
}


def _run_worker(args: argparse.Namespace) -> int:
    from trainlab.distributed.launch import die_with_parent  # a worker ends through this module: `_launch`
    from trainlab.io import read_json

    spec = read_json(args.spec)
    name = spec.get("worker") if isinstance(spec, dict) else None
    if name not in WORKERS:
        raise UserError(f'{args.spec}: not a trainlab worker spec ("worker" must be one of {", ".join(WORKERS)})')
    module, func = WORKERS[name].split(":")
    worker = getattr(importlib.import_module(module), func)
    args.ends_as_worker = True  # from here on this process ends by the one rule (`main`, `end_worker`)
    die_with_parent()  # a worker never outlives its launcher (the elastic agent starts it without that)
    return worker(spec)


def command_word(argv: list[str]) -> str:
    """The command an argv names: its first word that is not an option ("" for none, e.g. `--help`)."""
    return next((a for a in argv if not a.startswith("-")), "")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every command (`command` None), or of the top level and `command` alone: the other
    commands are listed with their help but their modules are not imported."""
    parser = Parser(
        prog="trainlab",
        description="Train neural networks fast and measure what each acceleration technique buys.",
        epilog="`trainlab COMMAND --help` lists a command's flags.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (where, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_[:1].upper() + help_[1:] + ".")
        if command is None or command == name:
            module, func = where.split(":")
            getattr(importlib.import_module(module), func)(p)
    w = sub.add_parser("worker")  # internal; not listed in the COMMAND help
    w.add_argument("spec", help="JSON spec written by the launching process")
    w.set_defaults(func=_run_worker)
    sub._choices_actions = [a for a in sub._choices_actions if a.dest != "worker"]
    for command in leaf_parsers(parser):
        if _writes(command):
            command.add_argument(
                "--force",
                action="store_true",
                help="replace existing files that trainlab did not write (it refuses otherwise)",
            )
    return parser


_OUTPUT_FLAGS = ("--out", "-o", "--json", "--dir")


def leaf_parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    """Every command parser that has no subcommands (`train`, `dp compare`, `data pack`, …)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [parser]
    return [leaf for a in subs for p in dict.fromkeys(a.choices.values()) for leaf in leaf_parsers(p)]


def _writes(parser: argparse.ArgumentParser) -> bool:
    """A command that writes files (an output flag or an `out` argument) takes --force."""
    return any(o in _OUTPUT_FLAGS and a.nargs != 0 for a in parser._actions for o in a.option_strings) or any(
        a.dest == "out" for a in parser._actions
    )


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(command_word(argv))
    args = parser.parse_args(argv)
    args.command_line = shlex.join(["trainlab", *argv])  # recorded next to results
    set_force(bool(getattr(args, "force", False)))
    code = _run(args)
    launch = _launch()
    if launch is not None and (getattr(args, "ends_as_worker", False) or launch.under_torchrun()):
        launch.end_worker(code)  # a worker or a rank: barrier (on success), then exit without destructors
    return code


def _launch():
    """`trainlab.distributed.launch` if this process imported it, else None. It imports torch, so the CLI
    does not: a process that never imported it joined no process group (`init_distributed` lives there)
    and is no launched worker (`_run_worker` imports it), so it has no worker ending to do and no
    launcher to leave its error line for."""
    return sys.modules.get("trainlab.distributed.launch")


def _run(args: argparse.Namespace) -> int:
    try:
        result = args.func(args)
    except UserError as e:
        failure = sys.modules.get("trainlab.distributed.failure")  # not imported: no collective ran
        return _fail(
            f"trainlab: error: {e}", e.exit_code, peer=failure is not None and isinstance(e, failure.PeerFailure)
        )
    except KeyboardInterrupt:
        return _fail("trainlab: interrupted", 130)
    except OSError as e:  # the file system or the OS said no, somewhere no check could foresee
        return _fail(f"trainlab: error: {os_error_line(e)}", 2)
    except Exception as e:
        traceback.print_exc()
        return _fail(
            f"trainlab: internal error ({type(e).__name__}): this is a bug in trainlab; please report it "
            "with the command line and the traceback above",
            1,
        )
    return int(result or 0)


def os_error_line(e: OSError) -> str:
    """'PATH: No space left on device' — the path first, as every other trainlab error."""
    paths = [p for p in (e.filename, e.filename2) if p is not None]
    reason = e.strerror or str(e) or type(e).__name__
    return f"{' -> '.join(map(str, paths))}: {reason}" if paths else f"{reason} ({type(e).__name__})"


def _fail(line: str, code: int, peer: bool = False) -> int:
    # A launched worker's line goes to its launcher, which prints one line for all ranks; the worker
    # prints it itself only when no launcher listens (a plain run, a test's hand-made ranks).
    launch = _launch()
    if launch is None or not launch.record_worker_error(line, code, peer):
        print(line, file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
