"""Command line: parse arguments and call the library. No logic lives here.

Each command group lives in its own module that exposes `add_parser(subparsers)`; the parser it
adds sets `func` to the function that runs the command with the parsed namespace.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from trainlab.errors import UserError

# command → module that defines `add_parser(subparsers)`
COMMANDS = {
    "train": "trainlab.train.cli",
    "eval": "trainlab.train.cli",
    "data": "trainlab.data.cli",
    "gelu": "trainlab.ops.cli",
    "dp": "trainlab.parallel.cli",
    "gpt": "trainlab.bench.gpt_cli",
    "report": "trainlab.report.cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trainlab",
        description="Train neural networks fast and measure what each acceleration technique buys.",
        epilog="`trainlab COMMAND --help` lists a command's flags.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for module_name in dict.fromkeys(COMMANDS.values()):  # each module once, in order
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("trainlab"):
                continue  # command group not built in this checkout
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except UserError as e:
        print(f"trainlab: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trainlab: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    raise SystemExit(main())
