"""docs/lab-walkthrough.md: every command in it works and is exercised by a test or a benchmark.

The walkthrough is the page students follow, so a command in it that has rotted (a renamed flag, a
removed choice) or was never run is a defect. For each `trainlab …` command in its code blocks:
1. the real argument parser accepts it (no unknown flag, no bad choice);
2. it is exercised: either
   - run here (`train` and `sweep` commands: the doc's command with small-size overrides appended —
     argparse keeps the last value, so only sizes, device and output change), or
   - found in a test or benchmark: some invocation in tests/*.py (a list literal such as
     `main(["train", ...])` inside a test function, module-level lists expanded; functions that test
     rejections — named bad/error/reject/… — and this file do not count) or benchmarks/*.sh (a `trainlab …` /
     `-m trainlab …` line, arrays defined in the script expanded) has the same subcommand and every
     flag the doc uses, with the same value unless the value is a size, a path or a placeholder (a
     script that passes its own arguments on with "$@" accepts any further flag).
Scripts the doc names (`python benchmarks/x.py`, `bash benchmarks/x.sh`, `make x`) must exist.
The checker is tested on a made-up document, so that it can fail.
"""

from __future__ import annotations

import argparse
import ast
import functools
import re
import shlex
import sys
from pathlib import Path

import pytest

from trainlab import cli

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "lab-walkthrough.md"
ANY = "<any>"  # a value the source computes (a variable, a path built at run time)
OPEN = "<open>"  # a script's "$@": whatever flags its caller passes on
# flags whose value never decides whether a command was exercised: sizes, places, seeds, devices
FREE = {
    "out",
    "json",
    "md",
    "data_dir",
    "seed",
    "seeds",
    "epochs",
    "train_subset",
    "test_subset",
    "batch_size",
    "eval_batch_size",
    "steps",
    "warmup",
    "global_batch",
    "micro_batch",
    "seq",
    "n",
    "budget",
    "sizes",
    "name",
    "timeout",
    "repeats",
    "threads",
    "workers",
    "nproc",
    "gpus",
    "gpu_mem",
    "title",
    "device",
    "dist_timeout",
}
RUN_HERE = {("train",), ("sweep",)}


# ---------------------------------------------------------------------------------- the document


def doc_commands(text: str) -> list[list[str]]:
    """The argv (after `trainlab`) of every trainlab command line in the fenced code blocks."""
    commands = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            argv = _trainlab_argv(line.strip().removeprefix("$ "))
            if argv:
                commands.append(argv)
    return commands


def doc_scripts(text: str) -> list[str]:
    """`benchmarks/…` scripts and `make` targets named in the code blocks."""
    names = []
    for block in re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S):
        names += re.findall(r"(benchmarks/[\w./-]+\.(?:py|sh))", block)
        names += [f"make:{t}" for t in re.findall(r"(?m)^\s*(?:\$ )?make ([\w-]+)", block)]
    return names


def _trainlab_argv(line: str) -> list[str] | None:
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:
        return None
    while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", tokens[0]):  # VAR=value prefixes
        tokens.pop(0)
    for i, tok in enumerate(tokens):
        if tok == "trainlab" and (i == 0 or tokens[i - 1] == "-m"):
            return tokens[i + 1 :] or None
        if i == 0 and tok not in ("python", "python3", "nice", "timeout", "env") and not tok.endswith("python"):
            return None
    return None


# ---------------------------------------------------------------------------------- the tests and benchmarks


def invocations(root: Path = ROOT) -> list[list[str]]:
    """Every trainlab argv found in tests/*.py and benchmarks/*.sh (unknown values as ANY)."""
    names = set(_subparsers(cli.build_parser()))
    found = []
    for path in sorted((root / "tests").glob("*.py")) + sorted((root / "benchmarks").glob("*.py")):
        if path.name != Path(__file__).name:  # this file's made-up commands exercise nothing
            found += _python_lists(path.read_text(), names)
    for path in sorted((root / "benchmarks").glob("*.sh")):
        found += _shell_commands(path.read_text())
    return found


def _python_lists(source: str, names: set[str]) -> list[list[str]]:
    tree = ast.parse(source)
    constants: dict[str, list] = {}
    for node in tree.body:  # module-level lists, e.g. TINY = ["--epochs", "1", ...]
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.List)
        ):
            constants[node.targets[0].id] = node.value.elts
    out, seen = [], set()
    for func in ast.walk(tree):
        if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)) or REJECTS.search(func.name):
            continue
        for node in ast.walk(func):
            if (
                isinstance(node, ast.List)
                and id(node) not in seen
                and node.elts
                and isinstance(node.elts[0], ast.Constant)
                and node.elts[0].value in names
            ):
                seen.add(id(node))
                out.append(_flatten(node.elts, constants))
    return out


# tests of refusals run a command only to see it rejected: that exercises nothing a student would type
REJECTS = re.compile(r"bad|error|reject|refus|invalid|hostile|corrupt|missing|fail|wrong|unknown|broken")


def _flatten(elts, constants) -> list[str]:
    argv = []
    for e in elts:
        if isinstance(e, ast.Constant) and isinstance(e.value, str):
            argv.append(e.value)
        elif isinstance(e, ast.Starred) and isinstance(e.value, ast.Name) and e.value.id in constants:
            argv += _flatten(constants[e.value.id], constants)
        elif not isinstance(e, ast.Starred):
            argv.append(ANY)
    return argv


def _shell_commands(source: str) -> list[list[str]]:
    text = source.replace("\\\n", " ")
    arrays = {m.group(1): m.group(2) for m in re.finditer(r"(?m)^\s*(\w+)=\((.*?)\)\s*$", text)}
    out = []
    for line in text.splitlines():
        if "trainlab" not in line or line.lstrip().startswith("#"):
            continue
        definition = re.fullmatch(r"\s*\w+=\((.*)\)\s*", line)  # CMD=(... -m trainlab ...)
        if definition:
            line = definition.group(1)
        for name, body in arrays.items():
            line = line.replace(f'"${{{name}[@]}}"', body).replace(f"${{{name}[@]}}", body)
        line = line.split("|")[0].split(">")[0].split(";")[0]
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:
            continue
        for i, tok in enumerate(tokens):
            if tok == "trainlab" and i and tokens[i - 1] == "-m":
                # "$@", or an array of the caller's arguments the script did not define itself (benchmarks/
                # out_args.sh leaves them in ARGS): the flags are passed on
                out.append(
                    [
                        OPEN if t == "$@" or re.match(r"\$\{\w+\[@\]", t) else ANY if "$" in t else t
                        for t in tokens[i + 1 :]
                    ]
                )
                break
    return out


# ---------------------------------------------------------------------------------- matching


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return parser._subparsers._group_actions[0].choices if parser._subparsers else {}


@functools.cache
def _full_parser() -> argparse.ArgumentParser:
    """Every command's parser, built once: `signature` reads its actions for each of hundreds of argvs."""
    return cli.build_parser()


def signature(
    argv: list[str], parser: argparse.ArgumentParser | None = None
) -> tuple[tuple[str, ...], dict[str, list]]:
    """(subcommand path, {dest: [values]}) of an argv, read with the real parser's actions."""
    parser = parser or _full_parser()
    path, i = [], 0
    while i < len(argv) and argv[i] in _subparsers(parser):
        parser = _subparsers(parser)[argv[i]]
        path.append(argv[i])
        i += 1
    actions = {opt: a for a in parser._actions for opt in a.option_strings}
    flags: dict[str, list] = {}
    while i < len(argv):
        tok = argv[i]
        name, _, inline = tok.partition("=") if tok.startswith("--") else (tok, "", "")
        action = actions.get(name)
        if action is None:  # a positional or a value we do not understand: free
            i += 1
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            value = not name.startswith("--no-")
        elif action.nargs == 0:
            value = action.const if action.const is not None else True
        elif inline:
            value = inline
        elif action.nargs == "?" and (i + 1 >= len(argv) or argv[i + 1].startswith("-")):
            value = action.const
        else:
            i += 1
            value = argv[i] if i < len(argv) else ANY
        flags.setdefault(action.dest, []).append(value)
        i += 1
    return tuple(path), flags


def _free(dest: str, value) -> bool:
    if dest in FREE or value == ANY:
        return True
    text = str(value)
    return bool(re.fullmatch(r"[-+]?[\d.]+(e[-+]?\d+)?([KMG](iB)?)?", text)) or "/" in text


def exercised_by(doc_argv: list[str], found: list[list[str]], parser=None) -> bool:
    path, flags = signature(doc_argv, parser)
    for inv in found:
        ipath, iflags = signature(inv, parser)
        if ipath != path:
            continue
        open_ = OPEN in inv
        if all(
            (dest not in iflags and open_)
            or (dest in iflags and all(_free(dest, v) or v in iflags[dest] or ANY in iflags[dest] for v in values))
            for dest, values in flags.items()
        ):
            return True
    return False


def parse_error(argv: list[str]) -> str | None:
    """The parser's complaint about an argv, or None when it parses."""
    parser = cli.build_parser()

    def fail(message):
        raise ValueError(message)

    for p in [parser, *_all_subparsers(parser)]:
        p.error = fail
    try:
        parser.parse_args(argv)
    except ValueError as e:
        return str(e)
    except SystemExit as e:
        return f"exit {e.code}"
    return None


def _all_subparsers(parser):
    for sub in _subparsers(parser).values():
        yield sub
        yield from _all_subparsers(sub)


# ---------------------------------------------------------------------------------- the tests

COMMANDS = doc_commands(DOC.read_text()) if DOC.exists() else []


def test_the_walkthrough_is_short_and_tells_no_development_history():
    text = DOC.read_text()
    assert len(text.splitlines()) <= 510  # 500, and the printed model as the model prints it (model_block)
    history = re.findall(
        r"(?i)\b(?:session \d|issue \d+'s goals|was \S+ before|before (?:issue|the) \w+ change|"
        r"as it was|since issue|used to be|earlier run)\b",
        text,
    )
    assert history == [], history


def test_the_walkthrough_exists_has_commands_and_the_readme_links_it_first():
    assert DOC.exists()
    assert len(COMMANDS) >= 15
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"\]\((docs/[^)]+)\)", readme)
    assert links and links[0] == "docs/lab-walkthrough.md"


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a)[:60])
def test_every_doc_command_parses(argv):
    assert parse_error(argv) is None, f"trainlab {' '.join(argv)}: {parse_error(argv)}"


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a)[:60])
def test_every_doc_command_is_exercised(argv):
    path, flags = signature(argv)
    if path in RUN_HERE and "nproc" not in flags and "resume" not in flags:
        return  # run by test_train_and_sweep_commands_of_the_doc_run
    assert exercised_by(argv, _found()), (
        f"`trainlab {' '.join(argv)}` is in the walkthrough but no test or benchmark "
        "runs that subcommand with these flags"
    )


_FOUND: list = []


def _found():
    if not _FOUND:
        _FOUND.extend(invocations())
    return _FOUND


@pytest.mark.parametrize("name", doc_scripts(DOC.read_text()) if DOC.exists() else [])
def test_scripts_named_in_the_doc_exist(name):
    if name.startswith("make:"):
        assert re.search(rf"(?m)^{re.escape(name[5:])}:", (ROOT / "Makefile").read_text()), name
    else:
        assert (ROOT / name).exists(), name


OVERRIDES = {
    ("train",): [
        "--epochs",
        "1",
        "--train-subset",
        "256",
        "--test-subset",
        "100",
        "--device",
        "cpu",
        "--no-progress",
        "--no-tensorboard",
    ],
    ("sweep",): [
        "--seeds",
        "1",
        "--epochs",
        "1",
        "--train-subset",
        "128",
        "--test-subset",
        "64",
        "--device",
        "cpu",
        "--no-tensorboard",
    ],
}
RUNNABLE = [
    a
    for a in COMMANDS
    if signature(a)[0] in RUN_HERE and "nproc" not in signature(a)[1] and "resume" not in signature(a)[1]
]


@pytest.mark.parametrize("argv", RUNNABLE, ids=lambda a: " ".join(a)[:60])
def test_train_and_sweep_commands_of_the_doc_run(argv, tmp_path):
    path, flags = signature(argv)
    override = list(OVERRIDES[path])
    if "seed" in flags and path == ("sweep",):
        override.remove("--seeds"), override.remove("1")  # the doc lists its seeds itself
    assert cli.main([*argv, *override, "--out", str(tmp_path / "run")]) == 0
    produced = list(tmp_path.rglob("summary.json"))
    assert produced, "no run finished"


# ---- every other doc: README.md and docs/*.md ------------------------------------------------------
# Every command parses with the real parser (a missing required flag, such as `lab --plan` without --out,
# fails here); the cheap ones run as written (plans), the train/sweep ones with the small-size overrides;
# a long one (a GPU bench, a whole lab, a multi-node job) runs as `--help` of its command.

ALL_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDERS = {"...", "…"}  # "and the flags above": `train --parallel ddp ...` is not a command to run
EVERY = [
    (doc.name, argv)
    for doc in ALL_DOCS
    for argv in doc_commands(doc.read_text())
    if not PLACEHOLDERS & set(argv) and doc != DOC  # the walkthrough's own tests are above
]


def _ids(item) -> str:
    return f"{item[0]}: {' '.join(item[1])}"[:80]


def _kind(argv: list[str]) -> str:
    path, flags = signature(argv)
    if path == ("gpt", "plan") or (path == ("lab",) and "plan" in flags):
        return "as written"
    if path in RUN_HERE and not {"nproc", "resume"} & set(flags):
        return "small"
    return "help"


@pytest.mark.parametrize(
    "item", [pytest.param(i, marks=[pytest.mark.slow] if _kind(i[1]) == "small" else []) for i in EVERY], ids=_ids
)
def test_every_command_of_every_doc_parses_and_runs(item, tmp_path, capsys):
    doc, argv = item
    assert parse_error(argv) is None, f"{doc}: trainlab {' '.join(argv)}: {parse_error(argv)}"
    path, flags = signature(argv)
    kind = _kind(argv)
    if kind == "help":
        with pytest.raises(SystemExit) as done:
            cli.main([*path, "--help"])
        assert done.value.code == 0
        return
    if kind == "small":
        argv = [*argv, *OVERRIDES[path]]
    argv = [*argv, "--out", str(tmp_path / "out")] if "out" in flags or kind == "small" else argv
    assert cli.main(argv) == 0, f"{doc}: trainlab {' '.join(argv)}: {capsys.readouterr().err[-500:]}"


# ---- the checker itself can fail ------------------------------------------------------------------

FAKE_DOC = """
Some text `trainlab train --not-in-code-block`.
```bash
$ trainlab train --act gelu-cpp --epochs 3   # a comment
OMP_NUM_THREADS=1 trainlab dp compare --modes none,ring \\
    --nproc 2
python -m trainlab gelu check --impl cpp
make train
python benchmarks/no_such_benchmark.py
```
"""


def test_checker_reads_commands_scripts_and_rejects_what_is_not_exercised():
    cmds = doc_commands(FAKE_DOC)
    assert cmds == [
        ["train", "--act", "gelu-cpp", "--epochs", "3"],
        ["dp", "compare", "--modes", "none,ring", "--nproc", "2"],
        ["gelu", "check", "--impl", "cpp"],
    ]
    assert doc_scripts(FAKE_DOC) == ["benchmarks/no_such_benchmark.py", "make:train"]
    found = [
        ["train", "--act", "gelu-cpp", "--epochs", "1", "--device", "cpu"],
        ["dp", "compare", "--modes", ANY, "--nproc", "4"],
        ["gelu", "check"],
    ]
    assert exercised_by(cmds[0], found)  # sizes may differ
    assert not exercised_by(["train", "--act", "relu"], found)  # a choice may not
    assert exercised_by(cmds[1], found)  # a computed value matches anything
    assert not exercised_by(["dp", "compare", "--modes", "ring", "--threads", "1"], found)  # a flag never given
    assert not exercised_by(cmds[2], found)  # --impl never given
    assert not exercised_by(["train", "--compile"], found)
    assert parse_error(["train", "--not-a-flag"]) is not None
    assert parse_error(["train", "--preset", "turbo"]) is not None
    assert parse_error(["train", "--preset", "best"]) is None
    assert signature(["sweep", "--augment", "--lr", "1e-3,2e-3"])[1] == {"augment": ["true"], "lr": ["1e-3,2e-3"]}


def test_invocations_are_read_from_python_lists_and_shell_scripts(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        'SMALL = ["--epochs", "1"]\n'
        'def test(tmp):\n    main(["train", "--act", "gelu-cpp", *SMALL, "--out", str(tmp)])\n'
        '    other = ["not", "a", "command"]\n'
    )
    (tmp_path / "benchmarks" / "b.sh").write_text(
        'COMMON=(--model tiny --steps 2)\n$PY -m trainlab gpt bench "${COMMON[@]}" --strategy "$S" --json "$OUT/x.json" > log\n'
        'CMD=("$PY" -m trainlab dp compare --modes "$MODES" "$@")\n'
        '$PY -m trainlab train --act relu ${ARGS[@]+"${ARGS[@]}"}\n'
    )
    assert invocations(tmp_path) == [
        ["train", "--act", "gelu-cpp", "--epochs", "1", "--out", ANY],
        ["gpt", "bench", "--model", "tiny", "--steps", "2", "--strategy", ANY, "--json", ANY],
        ["dp", "compare", "--modes", ANY, OPEN],
        ["train", "--act", "relu", OPEN],
    ]
    found = invocations(tmp_path)
    assert exercised_by(["dp", "compare", "--modes", "ring", "--threads", "1"], found)  # passed on by "$@"
    assert not exercised_by(["gpt", "bench", "--model", "tiny", "--impl", "hf"], found)  # no "$@" there
    assert exercised_by(["train", "--act", "relu", "--threads", "1"], found)  # the caller's ARGS passed on
    assert not exercised_by(["train", "--act", "gelu", "--threads", "1"], found)  # but not another choice


def test_the_handout_numbers_quoted_in_the_walkthrough():
    # The parameter counts and FLOPs per token the walkthrough quotes, recomputed here: the handout's
    # get_model_size verbatim on our 1.6B model (meta device: shapes only), our count, the FLOP formulas.
    import torch

    from trainlab.gpt.flops import attention_flops_per_token, flops_per_token, hardware_flops_per_token
    from trainlab.gpt.model import GPT
    from trainlab.gpt.shape import count_params, get_preset

    cfg = get_preset("gpt2-1.6b")
    with torch.device("meta"):
        model = GPT(cfg)

    def get_model_size(model):  # the handout's, verbatim
        total_numel = 0
        for module in model.modules():
            for p in module.parameters(recurse=False):
                total_numel += p.numel()
        return total_numel

    handout, ours = get_model_size(model), sum(p.numel() for p in model.parameters())
    assert (handout, ours) == (1_638_022_400, 1_557_611_200) and ours == count_params(cfg)
    assert handout - ours == cfg.vocab_size * cfg.n_embd  # the tied embedding, counted twice
    text = DOC.read_text()
    for n in (
        handout,
        ours,
        handout - ours,
        6 * ours,
        attention_flops_per_token(cfg, 1024),
        flops_per_token(cfg, 1024),
        hardware_flops_per_token(cfg, 1024, "full"),
        8 * handout,
    ):
        assert f"{int(n):,}" in text, f"{int(n):,} not in the walkthrough"


# ---------------------------------------------------------------------------------- quoted output (docs/excerpts.py)


def _excerpts_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("doc_excerpts", ROOT / "docs" / "excerpts.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


EXCERPTS = _excerpts_module()
QUOTED = [ex for doc in EXCERPTS.doc_paths() for ex in EXCERPTS.excerpts(doc)]


def test_the_walkthrough_quotes_the_plan_table_from_the_tool():
    assert any(ex.kind == "output" and ex.source.startswith("trainlab gpt plan") and ex.doc == DOC for ex in QUOTED)


@pytest.mark.parametrize("ex", QUOTED, ids=lambda ex: f"{ex.doc.name}: {ex.source}"[:80])
def test_every_quoted_output_is_what_its_command_prints(ex):
    assert EXCERPTS.problem(ex) is None, EXCERPTS.problem(ex)


def test_the_excerpt_checker_fails_on_a_drifted_quote(tmp_path):
    log = tmp_path / "run.log"
    log.write_text("epoch 1  loss 0.5  12.3 s\ndone: 99.1 %\n")
    doc = tmp_path / "doc.md"
    doc.write_text(
        "<!-- output: trainlab gpt plan --model tiny --gpus 1 --micro-batch 1 -->\n```\nmodel tiny  stale table\n```\n"
        f"<!-- output-log: {log.name} -->\n```\nepoch 1  loss 0.5  9.9 s\ndone: 99.2 %\n```\n"
    )
    plan, quoted_log = EXCERPTS.excerpts(doc)
    assert "the output of `trainlab gpt plan" in EXCERPTS.problem(plan)
    assert EXCERPTS.problem(quoted_log, root=tmp_path) == f"doc.md: not in {log.name}: 'done: 99.2 %'"  # timings aside
    EXCERPTS.regenerate(doc)
    assert EXCERPTS.problem(EXCERPTS.excerpts(doc)[0]) is None and "stale" not in doc.read_text()


# ---------------------------------------------------------------------------------- the printed model

MODEL_MARK = "`print(LeNet5())`"


def model_block() -> str:
    """The walkthrough's model block, made from the model: `print(LeNet5())` without the `Identity` slots
    (BatchNorm's places under --batchnorm), each feature layer's output shape for one 1×28×28 image as a
    comment, and the parameter count. Paste it into the doc when the model changes."""
    import torch
    from torch import nn

    from trainlab.lenet.model import LeNet5, count_parameters

    model = LeNet5().eval()
    shapes = {}
    hooks = [
        m.register_forward_hook(lambda m, i, out: shapes.__setitem__(m, tuple(out.shape[1:]))) for m in model.features
    ]
    with torch.no_grad():
        model(torch.zeros(1, 1, 28, 28))
    for h in hooks:
        h.remove()
    lines = [f"{type(model).__name__}("]
    for name, seq in model.named_children():
        lines.append(f"  ({name}): {type(seq).__name__}(")
        for idx, m in seq.named_children():
            if isinstance(m, nn.Identity):
                continue
            row = f"    ({idx}): {m!r}"
            if name == "features":
                row = f"{row:<84} # → {'×'.join(map(str, shapes[m]))}"
            lines.append(row)
        lines.append("  )")
    lines += [")", f"{count_parameters(model):,} parameters"]
    return "\n".join(lines) + "\n"


def test_the_printed_model_is_the_model():
    text = DOC.read_text()
    after = text[text.index(MODEL_MARK) :]
    quoted = re.search(r"```[a-z]*\n(.*?)```", after, flags=re.S).group(1)
    assert quoted == model_block(), "docs/lab-walkthrough.md's model block; the model prints:\n" + model_block()
