"""Command line: parse arguments and call the library. No logic lives here.

Each command group lives in its workload's `cli` module, which exposes `add_parser(subparsers)`; the
parser it adds sets `func` to the function that runs the command with the parsed namespace. A group
whose module fails to import is a bug, and it fails loudly: a command must never silently vanish.

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

from trainlab.distributed.failure import PeerFailure
from trainlab.distributed.launch import die_with_parent, end_worker, record_worker_error, under_torchrun
from trainlab.errors import UserError
from trainlab.flags import Parser
from trainlab.io import set_force

# command group → module that defines `add_parser(subparsers)`, in --help order
COMMAND_MODULES = (
    "trainlab.lenet.cli",  # train, eval, sweep, dp
    "trainlab.data.cli",  # data
    "trainlab.ops.cli",  # ops, and its alias gelu
    "trainlab.gpt.cli",  # gpt
    "trainlab.report.cli",  # report
    "trainlab.lab.cli",  # lab
)

# spec["worker"] → "module:function" taking the spec dict and returning an exit code
WORKERS = {
    "train": "trainlab.lenet.cli:train_worker",
    "dp-compare": "trainlab.lenet.compare:run_worker",
    "gpt-bench": "trainlab.gpt.bench:bench_worker",
}


def _run_worker(args: argparse.Namespace) -> int:
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


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="trainlab",
        description="Train neural networks fast and measure what each acceleration technique buys.",
        epilog="`trainlab COMMAND --help` lists a command's flags.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).add_parser(sub)
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
    parser = build_parser()
    args = parser.parse_args(argv)
    args.command_line = shlex.join(["trainlab", *argv])  # recorded next to results
    set_force(bool(getattr(args, "force", False)))
    code = _run(args)
    if getattr(args, "ends_as_worker", False) or under_torchrun():
        end_worker(code)  # a worker or a rank: barrier (on success), then exit without destructors
    return code


def _run(args: argparse.Namespace) -> int:
    try:
        result = args.func(args)
    except UserError as e:
        return _fail(f"trainlab: error: {e}", e.exit_code, peer=isinstance(e, PeerFailure))
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
    if not record_worker_error(line, code, peer):
        print(line, file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
