"""A `trainlab lab` folder as its report reads it: results.json (the plan and each step's record), the
steps' outputs found by what they are, a failed step's reason from its log, and which references the
page cites (those whose technique a GPT row names). Reading only: nothing here writes."""

from __future__ import annotations

import re
from pathlib import Path

from trainlab.errors import UserError
from trainlab.io import contained, read_json
from trainlab.report import format as fmt
from trainlab.report.inputs import ResultFile, TrainingRun, identify, load_run
from trainlab.report.lab_text import STRATEGY_WORDS
from trainlab.report.sections.common import figure
from trainlab.results.kinds import kind_of
from trainlab.schema import INT, NUMBER, STR, DictOf, ListOf, Obj, Opt, check

# The lab folder's results.json, which the lab writes and resumes from and the report reads: what it
# must hold (`trainlab.schema`): a hand-edited or damaged
# file is one line naming the key, never a traceback in the middle of a call.
STEP_RECORD = Obj(
    {
        "status": STR,
        "part": STR,
        "title": STR,
        "estimate_s": NUMBER,
        "limit_s": NUMBER,
        "seconds": NUMBER,
        "limit_used_s": NUMBER,
        "rc": Opt(INT),
        "pgid": INT,
        "reason": Opt(STR),
        "note": STR,
        "log": STR,
        "command": STR,
        "sizes": DictOf(),
        "started_utc": STR,
    },
    required=("status",),
)
LAB_STATE = Obj(
    {
        "version": INT,
        "steps": DictOf(STEP_RECORD),
        "calls": ListOf(
            Obj({"command": STR, "started_utc": STR, "budget_s": NUMBER, "used_s": NUMBER, "parts": ListOf(STR)}),
            max_len=10_000,
        ),
        "size": Opt(STR),
        "hardware": Opt(Obj({"kind": STR, "gpus": INT, "name": STR, "cpus": INT})),
        "plan": ListOf(
            Obj(
                {"name": STR, "part": STR, "title": STR, "estimate_s": NUMBER, "limit_s": NUMBER, "sizes": DictOf()},
                required=("name", "part", "title", "estimate_s", "limit_s", "sizes"),
            ),
            max_len=1000,
        ),
        "data": Opt(DictOf()),
    },
    required=("version", "steps", "calls"),
)


RESULTS = "results.json"
STUDENT = "student.json"  # {"name": ..., "student_id": ...}: the student's own file in the lab folder


def inside(root: Path, path: Path) -> bool:
    """The one rule for every path the lab report follows: `path` lies under the lab folder `root`,
    named without '..', with no link anywhere on the way from `root` (a link is not followed, even one
    that points back inside: the folder is read as it is, never through another). A step named
    `../../outside/steps/x`, a `steps/` that is a link, a results.json that is a link: all refused."""
    root, path = Path(root), Path(path)
    try:
        rel = path.relative_to(root)
    except ValueError:
        return False
    if any(part in ("..", "") for part in rel.parts):
        return False
    here = root
    for part in rel.parts:
        here = here / part
        if here.is_symlink():
            return False
    return contained(root, path)


def relative_command(command: str, root_seen: str | None) -> str:
    """A recorded command as the student would type it in the lab folder: the folder's absolute path
    (`root_seen`, the --out the lab was called with) and a step's staging folder (steps/.NAME.partial)
    made relative."""
    command = re.sub(r"\S*/steps/\.([\w-]+)\.partial", r"steps/\1", command)
    command = re.sub(r"^\S*/python[\d.]*(?=\s)", "python", command)  # the machine's interpreter path
    command = re.sub(r"^python -m trainlab(?=\s)", "trainlab", command)
    command = command.replace("<checkout>/", "")
    if root_seen:
        command = re.sub(re.escape(root_seen.rstrip("/")) + r"/", "", command)
        command = re.sub(r"(?<=\s)" + re.escape(root_seen.rstrip("/")) + r"(?=\s|$)", ".", command)
    return command


def status_line(name: str, rec: dict | None, root: Path) -> str | None:
    """None when the step ran and finished ok; else the one line that says why there is nothing."""
    if rec is None:
        return f"{name}: not run (not reached yet: run the same `trainlab lab` command again, or include its part in --parts)"
    status = rec.get("status")
    if status == "ok":
        return None
    if status == "not run":
        return f"{name}: not run: {rec.get('reason')}"
    if status in ("failed", "timed out"):
        why = f"exit {rec.get('rc')}" if status == "failed" else f"at {fmt.seconds(rec.get('limit_used_s'))}"
        reason = last_error_line(root / "steps" / name / "log.txt", root=root) if status == "failed" else None
        return f"{name}: {status} ({why})" + (f": {reason}" if reason else "") + f" — its log: {rec.get('log')}"
    if status in ("running", "killed", "stopped"):
        return f"{name}: not finished ({status}{': ' + rec['reason'] if rec.get('reason') else ''}); the next call runs it again"
    return f"{name}: {status}"


ERROR_WORDS = re.compile(r"error|fail|exception|traceback|killed|abort|refus|cannot|can't|not found", re.IGNORECASE)


def log_tail(log: Path, root: Path | None = None, max_bytes: int = 64 * 1024) -> list[str]:
    """The lines of a step's log in its last `max_bytes` (a log can be large), and only of a regular file
    inside `root`, the lab folder (default: the log's own folder): a link out of it, or a FIFO, is not read."""
    if not log.is_file() or not (inside(root, log) if root is not None else contained(log.parent, log)):
        return []
    try:
        with log.open("rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read(max_bytes).decode(errors="replace").splitlines()
    except OSError:
        return []


def last_error_line(log: Path, limit: int = 240, root: Path | None = None) -> str | None:
    """The last line of a step's log that names an error (else its last non-empty line), cut to `limit`."""
    lines = [ln.strip() for ln in log_tail(log, root) if ln.strip()]
    if not lines:
        return None
    line = next((ln for ln in reversed(lines) if ERROR_WORDS.search(ln)), lines[-1])
    return line if len(line) <= limit else line[: limit - 1] + "…"


def results_in(root: Path, folder: Path) -> tuple[list[TrainingRun], list[ResultFile], list[tuple[Path, dict]]]:
    """The training runs, the known result files and the other result tables (benchmark scripts'
    {rows: [...]}) a step wrote, following only what `inside(root, ...)` allows."""
    runs, known, other = [], [], []
    if not folder.is_dir() or not inside(root, folder):
        return runs, known, other
    ok = lambda p: inside(root, p)  # noqa: E731
    for p in sorted(filter(ok, folder.rglob("summary.json"))):
        try:
            s = read_json(p)
            if kind_of(s) == "lenet_train":
                runs.append(load_run(p.parent, s, inside=ok))
        except UserError:
            continue  # a damaged run costs its own section only
    for p in sorted(filter(ok, folder.rglob("*.json"))):
        if (
            p.name in ("summary.json", "config.json", "env.json")
            or p.name.endswith(".spec.json")
            or any(r.path in p.parents for r in runs)
        ):
            continue
        try:
            data = read_json(p)
            res = identify(p, data)
        except UserError:
            continue
        if res is not None:
            known.append(res)
        elif isinstance(data, dict) and isinstance(data.get("rows"), list) or isinstance(data, list):
            other.append((p, data))
    return runs, known, other


class Lab:
    """A lab folder as the report reads it: results.json's records and plan, the steps' outputs."""

    def __init__(self, root: Path, state: dict, out: Path):
        self.root, self.state, self.out = Path(root), state, Path(out)
        self.recs: dict = state.get("steps") or {}
        self.plan: list[dict] = state.get("plan") or [
            {
                "name": n,
                "part": r.get("part"),
                "title": r.get("title", n),
                "estimate_s": r.get("estimate_s"),
                "limit_s": r.get("limit_s"),
                "sizes": r.get("sizes") or {},
            }
            for n, r in self.recs.items()
        ]
        self._outputs: dict = {}
        self._refs: list[str] | None = None
        self._words: set[str] | None = None
        self.student: dict = {}  # {"name", "student_id"}: from --name/--student-id or student.json

    def refs(self) -> list[str]:
        if self._refs is None:
            self._refs = used_references(self)
        return self._refs

    def strategy_words(self) -> set[str]:
        if self._words is None:
            self._words = strategy_words(self)
        return self._words

    def cite(self, key: str) -> str:
        """ "[n]": the reference's number in this page's list."""
        return f"[{self.refs().index(key) + 1}]" if key in self.refs() else ""

    def ok(self, name: str) -> bool:
        return (self.recs.get(name) or {}).get("status") == "ok"

    def outputs(self, name: str):
        if name not in self._outputs:
            folder = self.root / "steps" / name
            self._outputs[name] = results_in(self.root, folder) if self.ok(name) else ([], [], [])
        return self._outputs[name]

    def runs(self, name: str) -> list[TrainingRun]:
        return self.outputs(name)[0]

    def result(self, name: str, kind: str) -> ResultFile | None:
        return next((r for r in self.outputs(name)[1] if r.kind == kind), None)

    def bench(self, name: str) -> dict | None:
        res = self.result(name, "gpt_bench")
        return res.data if res else None

    def steps(self, part: str) -> list[dict]:
        return [s for s in self.plan if s.get("part") == part]

    def index(self, name: str) -> int:
        return next((i for i, s in enumerate(self.plan) if s["name"] == name), len(self.plan))

    def figure(self, name: str, run: TrainingRun, draw) -> Path | None:
        """A figure of `run` in the report folder, drawn again only when the run is newer."""
        return figure(self.out / f"{name}.png", run.path / "summary.json", lambda path: draw(run, path))

    def command(self, command: str) -> str:
        """A recorded command relative to the lab folder (`relative_command`)."""
        seen = next(
            (
                m.group(1)
                for c in self.state.get("calls", [])
                for m in [re.search(r"--out[= ](\S+)", c.get("command", ""))]
                if m
            ),
            None,
        )
        return relative_command(command, seen)


def strategy_words(lab: Lab) -> set[str]:
    """The words of every strategy (and attention kernel) a GPT step's rows name: amp, ckpt, flash, …"""
    names: set[str] = set()
    for step in lab.steps("gpt"):
        for res in lab.outputs(step["name"])[1]:
            rows = res.rows if res.kind != "gpt_bench" else [res.data]
            names |= {
                str(r.get("strategy", "")) + "+" + str(r.get("attention", "")) for r in rows if isinstance(r, dict)
            }
        for _path, data in lab.outputs(step["name"])[2]:
            rows = data["rows"] if isinstance(data, dict) else data
            names |= {
                str(r.get("strategy", "")) + "+" + str(r.get("attention", "")) for r in rows if isinstance(r, dict)
            }
    return {w for n in names for w in re.split(r"[+,\s()]+", n.lower()) if w}


def used_references(lab: Lab) -> list[str]:
    """The references this page uses: always PyTorch, LeNet, GELU; GPT-2's when a GPT step ran, each
    technique's only when a row names it."""
    words = lab.strategy_words()
    keys = ["pytorch", "lenet", "gelu"] + (["gpt2"] if words else [])
    return keys + [key for _, _, key, marks in STRATEGY_WORDS if key and words & marks]


def load_lab(root: Path) -> dict | None:
    """results.json of a lab folder, or None when `root` is not one. A results.json that is a link is
    refused (`inside`): the report reads the folder it is given, nothing else."""
    f = Path(root) / RESULTS
    if not f.is_file() and not f.is_symlink():
        return None
    if not inside(Path(root), f):
        raise UserError(f"{f}: a link; trainlab report reads only the lab folder's own files")
    state = read_json(f)
    if not (isinstance(state, dict) and isinstance(state.get("steps"), dict)):
        raise UserError(f'{f}: not a trainlab lab\'s results.json (no "steps" object)')
    return check(state, LAB_STATE, str(f))


def load_student(root: Path) -> dict:
    """The student's name and ID from ROOT/student.json ({"name", "student_id"}), if it is there."""
    f = Path(root) / STUDENT
    if not f.is_file() or not inside(Path(root), f):
        return {}
    data = read_json(f, Obj({"name": STR, "student_id": STR}))
    return {k: data[k] for k in ("name", "student_id") if isinstance(data, dict) and data.get(k)}
