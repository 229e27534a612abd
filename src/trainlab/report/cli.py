"""`trainlab report RUN_DIR_OR_JSON... -o OUT_DIR [--pdf]`, and `trainlab report LABDIR -o OUT_DIR [--pdf]`:
a lab folder (its results.json) is rebuilt into the lab's own report, from its files alone — on any
machine, nothing rerun."""

from __future__ import annotations

from pathlib import Path

from trainlab.errors import UserError
from trainlab.flags import check_value, output_dir
from trainlab.io import refuse_foreign

OUTPUTS = ("index.html", "report.md", "report.pdf")


def run_report(args) -> int:
    from trainlab.report.build import build_report
    from trainlab.report.lab import build_lab_report
    from trainlab.report.lab_folder import load_lab
    from trainlab.text import shown

    check_value(args.out, output_dir, "-o/--out")
    refuse_foreign([Path(args.out) / name for name in OUTPUTS], "-o/--out")
    student = {k: v for k, v in (("name", args.name), ("student_id", args.student_id)) if v}
    for flag, value in (("--name", args.name), ("--student-id", args.student_id)):
        if value is not None and (not value.strip() or len(value) > 200 or not value.isprintable()):
            raise UserError(f"{flag}: expected printable text of 1 to 200 characters")
    lab = load_lab(Path(args.inputs[0])) if len(args.inputs) == 1 and Path(args.inputs[0]).is_dir() else None
    if lab is not None:
        index = build_lab_report(Path(args.inputs[0]), lab, Path(args.out), student)
        print(f"report: {shown(index)} (the lab in {shown(args.inputs[0])}: {len(lab['steps'])} step records)")
    else:
        if any((Path(p) / "results.json").is_file() for p in args.inputs if Path(p).is_dir()) and len(args.inputs) > 1:
            raise UserError(
                "trainlab report: a lab folder (with results.json) is rebuilt on its own: give it as the only input"
            )
        result = build_report(args.inputs, args.out, title=args.title)
        for note in result["notes"]:
            print(f"note: {shown(note)}")
        index = Path(result["index"])
        print(
            f"report: {index} ({len(result['runs'])} runs, {len(result['results'])} result files, "
            f"{len(result['images'])} figures)"
        )
    if args.pdf:
        from trainlab.report.pdf import chromium, no_chromium, write_pdf

        if chromium() is None:  # the HTML and Markdown stand; one line says what would print them
            raise no_chromium(f"the HTML report and report.md are written: {index}")
        print(f"report: {write_pdf(index)} (printed by headless Chromium)")
    return 0


def add_report(p) -> None:
    p.add_argument(
        "inputs",
        nargs="+",
        help="run directories (or a folder of runs) and trainlab result .json files; or one "
        "`trainlab lab` folder (with results.json), whose report is rebuilt from its files",
    )
    p.add_argument("-o", "--out", required=True, help="output directory (index.html, report.md, PNGs, report.pdf)")
    p.add_argument(
        "--name",
        default=None,
        help="the student's name, on the lab report's first screen (or student.json in the lab folder)",
    )
    p.add_argument(
        "--student-id", default=None, help="the student's ID, on the lab report's first screen (or student.json)"
    )
    p.add_argument("--title", default="trainlab report", help="the page's title (run directories and result files)")
    p.add_argument(
        "--pdf",
        action="store_true",
        help="also print the page to OUT/report.pdf with headless Chromium (Debian: apt-get install chromium)",
    )
    p.set_defaults(func=run_report)
