"""The command line: one config dataclass per command, flags derived from it, loud import failures,
and one way to start workers (a JSON spec)."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest

from trainlab import cli
from trainlab.errors import ConfigError
from trainlab.flags import cli_fields, flag_name
from trainlab.gpt.config import CompareConfig, GPTBenchConfig, PlanConfig
from trainlab.lenet.config import CompareConfig as DPCompareConfig
from trainlab.lenet.config import TrainConfig
from trainlab.ops.config import BenchConfig as GeluBenchConfig
from trainlab.ops.config import CheckConfig as GeluCheckConfig


def test_a_broken_command_group_fails_loudly(monkeypatch):
    monkeypatch.setitem(cli.COMMANDS, "broken", ("trainlab.no_such_group:add_broken", "a group that fails to import"))
    with pytest.raises(ModuleNotFoundError, match="trainlab.no_such_group"):
        cli.build_parser()
    with pytest.raises(ModuleNotFoundError, match="trainlab.no_such_group"):
        cli.main(["broken", "--help"])


def test_the_registry_names_a_parser_function_for_every_command():
    import importlib

    for name, (where, help_) in cli.COMMANDS.items():
        module, func = where.split(":")
        assert callable(getattr(importlib.import_module(module), func)), name
        assert help_ and not help_.endswith("."), name  # one line, argparse adds nothing after it


@pytest.mark.parametrize(
    "argv, cls",
    [
        (["train"], TrainConfig),
        (["dp", "compare"], DPCompareConfig),
        (["gpt", "bench"], GPTBenchConfig),
        (["gpt", "plan"], PlanConfig),
        (["gelu", "check"], GeluCheckConfig),
        (["gelu", "bench"], GeluBenchConfig),
    ],
)
def test_every_cli_field_is_a_flag_and_defaults_come_from_the_dataclass(argv, cls):
    parser = cli.build_parser()
    sub = parser._subparsers._group_actions[0].choices[argv[0]]
    if len(argv) > 1:
        sub = sub._subparsers._group_actions[0].choices[argv[1]]
    flags = {opt for action in sub._actions for opt in action.option_strings}
    for f in cli_fields(cls):
        assert flag_name(f) in flags, f"{' '.join(argv)}: {f.name} has no flag"
    args = parser.parse_args(argv)
    assert all(getattr(args, f.name) is None for f in cli_fields(cls))  # unset flags leave the dataclass default


def test_gpt_compare_takes_the_shared_bench_flags_once():
    args = cli.build_parser().parse_args(
        ["gpt", "compare", "--model", "tiny", "--steps", "3", "--strategies", "none,ddp"]
    )
    assert args.model == "tiny" and args.steps == 3 and args.strategies == "none,ddp"
    assert CompareConfig(strategies="none,ddp").strategy_list == ["none", "ddp"]
    assert GPTBenchConfig().model == "gpt2-1.6b"  # the one default, as documented


def test_config_json_is_type_checked_with_one_line_naming_file_and_key():
    good = TrainConfig(epochs=3).to_dict()
    assert TrainConfig.from_dict(good) == TrainConfig(epochs=3)
    with pytest.raises(ConfigError, match=r"run/config.json: 'epochs' must be an integer, got '3'"):
        TrainConfig.from_dict({**good, "epochs": "3"}, source="run/config.json")
    with pytest.raises(ConfigError, match="unknown config keys: bogus"):
        TrainConfig.from_dict({**good, "bogus": 1})
    with pytest.raises(ConfigError, match="expected a JSON object"):
        TrainConfig.from_dict([1, 2])
    assert TrainConfig.from_dict({**good, "lr": 1}).lr == 1.0  # an integer is a valid float


def test_worker_spec_must_name_a_known_worker(tmp_path, capsys):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"worker": "rm -rf"}))
    assert cli.main(["worker", str(spec)]) == 2
    assert "not a trainlab worker spec" in capsys.readouterr().err
    assert "worker" not in cli.build_parser().format_help().split("options:")[0].split("COMMAND\n", 1)[-1]


def test_a_worker_runs_from_its_json_spec_alone(tmp_path):
    # The parent's resolved config reaches the worker as JSON: here a 1-process train worker.
    import subprocess

    from trainlab.distributed.launch import worker_command, write_spec

    cfg = TrainConfig(
        epochs=1,
        train_subset=128,
        test_subset=64,
        batch_size=64,
        device="cpu",
        progress=False,
        tensorboard=False,
        gpu_telemetry=False,
        out=str(tmp_path / "run"),
        lr=2e-3,
    )
    cmd = worker_command(1, write_spec(tmp_path / "spec.json", "train", config=cfg.to_dict(), resume=None))
    assert cmd[:4] == [sys.executable, "-m", "trainlab", "worker"]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved == dataclasses.asdict(cfg)


# ----------------------------------------------------------------------------- --help for every command


def _commands(parser, path=()):
    """(argv prefix, parser) for the root and every command and subcommand, the hidden worker aside."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, __import__("argparse")._SubParsersAction):
            for name, sub in action.choices.items():
                if name != "worker":
                    yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(cli.build_parser()))


# Help and flag errors must be instant: they import no torch and no numpy (≈ 5 s of CPU on a loaded 2-core
# box). Flags are built from configs whose choices are plain names (trainlab.hardware, gpt.shape,
# ops.choices); the libraries are imported by the functions that run a command. `lab --plan` is held to
# none of the heaviest parts (torch._dynamo, pipelining, the GPT bench).
HEAVY = ("torch._dynamo", "torch.distributed.pipelining", "trainlab.gpt.bench")

_IMPORTS_AFTER = """
import contextlib, io, json, sys
from trainlab import cli
try:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = cli.main(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}))
"""


def _modules_after(argv: list[str]) -> tuple[int, set[str]]:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS_AFTER, *argv], capture_output=True, text=True, timeout=300, check=True
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    return out["code"], set(out["modules"])


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "trainlab")
def test_help_and_flag_errors_import_no_torch(path):
    for argv in ([*path, "--help"], [*path, "--no-such-flag"]):
        code, modules = _modules_after(argv)
        assert code in (0, 2), argv
        assert "torch" not in modules and "numpy" not in modules, f"trainlab {' '.join(argv)} imports torch"


def test_lab_plan_imports_only_what_planning_needs(tmp_path):
    code, modules = _modules_after(["lab", "--plan", "--out", str(tmp_path / "lab"), "--device", "cpu"])
    assert code == 0 and not [m for m in HEAVY if m in modules], [m for m in HEAVY if m in modules]


@pytest.mark.parametrize("path, parser", COMMANDS, ids=[" ".join(p) or "trainlab" for p, _ in COMMANDS])
def test_help_works_and_every_flag_says_what_it_does_and_its_default_once(path, parser, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main([*path, "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith("usage: trainlab"), out[:500]
    formatter, problems = parser._get_formatter(), []
    for action in parser._actions:
        if action.help == "==SUPPRESS==" or "-h" in action.option_strings or action.choices and action.nargs == "A...":
            continue  # hidden aliases (--no-x of a sweep flag), -h, the subcommand list (each has its help)
        name = "/".join(action.option_strings) or action.dest
        text = formatter._expand_help(action) if action.help else ""
        if not text.strip():
            problems.append(f"{name}: no description")
        if text.count("default:") > 1:
            problems.append(f"{name}: the default is named twice: {text}")
        if action.option_strings and action.default not in (None, False, [], "==SUPPRESS==") and "default:" not in text:
            problems.append(f"{name}: its default {action.default!r} is not shown")
    assert not problems, f"trainlab {' '.join(path)}: " + "; ".join(problems)


def test_a_percent_sign_in_help_text_is_printed_not_formatted(capsys):
    from trainlab.flags import Parser

    p = Parser(prog="trainlab x")
    p.add_argument("--rate", default=5, help="50% of the time, %(default)s otherwise; 100%% sure")
    p.print_help()
    assert "50% of the time, 5 otherwise; 100% sure" in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize(
    "argv, hint",
    [
        (["train", "--lr-rate", "3"], "train: unrecognized argument --lr-rate (did you mean --lr?)"),
        (["dp", "compare", "--nprocs", "2"], "dp compare: unrecognized argument --nprocs (did you mean --nproc?)"),
        (
            ["gpt", "plan", "--gpu-memory", "8GiB"],
            "gpt plan: unrecognized argument --gpu-memory (did you mean --gpu-mem?)",
        ),
        (
            ["sweep", "--dry-run", "--seed=1,2", "--epoch-count", "1"],
            "sweep: unrecognized argument --epoch-count (did you mean --epochs?)",
        ),
    ],
)
def test_an_unknown_flag_gets_the_subcommands_usage_and_the_nearest_flag(argv, hint, capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2
    assert err[0].startswith(f"usage: trainlab {' '.join(argv[: 2 if argv[0] in ('dp', 'gpt') else 1])} ")
    assert err[-1].startswith(f"trainlab: error: {hint}"), err[-1]


@pytest.mark.parametrize("gpus", [1, 2])
def test_gpt_plan_on_a_gpu_without_bf16_plans_the_autocast_rows_in_fp16(gpus, capsys):
    assert cli.main(["gpt", "plan", "--sm", "75", "--gpu-mem", "11GiB", "--gpus", str(gpus), "--json", "-"]) == 0
    rows = {r["strategy"]: r for r in json.loads(capsys.readouterr().out)["strategies"]}
    assert not [s for s, r in rows.items() if r.get("error")], rows
    assert not [s for s in rows if "amp" in s.split("+") or "bf16" in s.split("+")]
    assert ("fp16+ckpt" if gpus == 1 else "ddp+fp16+ckpt") in rows and ("pp+ckpt" in rows) == (gpus > 1)
    if gpus == 1:  # the handout's CPU offload: an 11 GiB card trains the 1.6B model in fp16 with ckpt + offload
        assert rows["fp16+ckpt+offload"]["fits"] and not rows["fp16"]["fits"]
    assert cli.main(["gpt", "plan", "--sm", "90", "--json", "-"]) == 0  # from sm80 on: bf16, as before
    assert "amp" in {r["strategy"] for r in json.loads(capsys.readouterr().out)["strategies"]}
