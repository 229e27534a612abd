"""`trainlab report RUN_DIR_OR_JSON... -o OUT_DIR`."""

from __future__ import annotations

from pathlib import Path

from trainlab.flags import check_value, output_dir
from trainlab.io import refuse_foreign
from trainlab.report.build import build_report


def run_report(args) -> int:
    check_value(args.out, output_dir, "-o/--out")
    refuse_foreign([Path(args.out) / name for name in ("index.html", "report.md")], "-o/--out")
    result = build_report(args.inputs, args.out, title=args.title)
    for note in result["notes"]:
        print(f"note: {note}")
    print(f"report: {result['index']} ({len(result['runs'])} runs, {len(result['results'])} result files, "
          f"{len(result['images'])} figures)")
    return 0


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("report", help="build an HTML/Markdown report from run directories and result JSONs")
    p.add_argument("inputs", nargs="+", help="run directories (or a folder of runs) and trainlab result .json files")
    p.add_argument("-o", "--out", required=True, help="output directory (index.html, report.md, PNGs)")
    p.add_argument("--title", default="trainlab report", help="the page's title")
    p.set_defaults(func=run_report)
