"""Every lab step holds a typed config, and the line a student types is derived from it (issue 36): parsed
back by the command's own parser it gives the same config (`trainlab …` through trainlab's parser and the
command's own preset rule; a `benchmarks/` script through the flags its argparse declares, read from its
source), and the line names no path of this machine."""

from __future__ import annotations

import ast
import dataclasses
import functools
import shlex
from pathlib import Path

import pytest

from trainlab.cli import build_parser
from trainlab.flags import Config, Parser, add_flags, explicit_values, flag_name, to_argv
from trainlab.hardware import Machine
from trainlab.lab.machine import from_table
from trainlab.lab.plan import LEVERS, best_levers
from trainlab.lab.steps import SIZES, lab_steps
from trainlab.lab.steps.scripts import SCRIPTS
from trainlab.lenet.config import TrainConfig, apply_preset

ROOT = Path(__file__).resolve().parents[1]
CPU = Machine(cpus=2)
MACHINES = {
    "cpu": CPU,
    "1xH100": from_table("NVIDIA H100 80GB HBM3", 1, 16),
    "2xA100-80G": from_table("NVIDIA A100-SXM4-80GB", 2, 32),
    "2xRTX2080Ti": from_table("NVIDIA GeForce RTX 2080 Ti", 2, 16),
    "4xH200": from_table("NVIDIA H200", 4, 64),
}
CASES = [(m, size) for m in MACHINES for size in (SIZES if m == "cpu" else ("full",))]


def _all_steps():
    for machine, size in CASES:
        for step in lab_steps(MACHINES[machine], size):
            yield f"{machine}-{size}-{step.name}", step


STEPS = dict(_all_steps())


@functools.cache
def _parser():
    return build_parser()


def parse_back(step):
    """The config the step's own command builds from the derived line."""
    words = step.command.words()
    cfg = step.config
    cls = type(cfg)
    if words[0] == "python":  # a benchmarks/ script: the flags its argparse declares (checked below)
        parser = Parser(prog=words[1])
        add_flags(parser, cls)
        return cls(**explicit_values(parser.parse_args(words[2:]), cls))
    args = _parser().parse_args(words[1:])
    values = explicit_values(args, cls)
    for field, excluded in step.command.nested:
        inner = type(getattr(cfg, field))
        values[field] = inner(**explicit_values(args, inner, exclude=excluded))
    back = cls(**values)
    if cls is TrainConfig:  # `trainlab train`: explicit flags over the preset over the defaults (lenet.cli)
        back = apply_preset(back, values.get("preset", "default"), explicit=set(values))
    return back


@pytest.mark.parametrize("key", sorted(STEPS))
def test_the_line_parses_back_to_the_steps_config(key):
    step = STEPS[key]
    assert isinstance(step.config, Config), "a lab step holds a typed config, never an argv"
    assert parse_back(step) == step.config
    line = step.command.line(f"steps/{step.name}")
    assert str(ROOT) not in line and "/tmp" not in line and " /" not in line, line  # relative to the lab folder
    assert shlex.split(line) == [w.replace("{out}", f"steps/{step.name}") for w in step.command.words()]


def test_to_argv_inverts_the_flag_parser_for_every_kind_of_field():
    cfg = TrainConfig(epochs=3, lr=0.0123, augment=True, batchnorm_conv1=False, train_subset=7, out="x y")
    argv = to_argv(cfg)
    assert {"--augment", "--no-batchnorm-conv1", "x y", "0.0123"} <= set(argv) and len(argv) == 10, argv
    args = _parser().parse_args(["train", *argv])
    assert TrainConfig(**explicit_values(args, TrainConfig)) == cfg
    assert to_argv(TrainConfig()) == []  # the defaults need no flag


def _declared_flags(script: str) -> dict[str, object]:
    """flag → its literal default (or ... where not a literal), from the script's add_argument calls."""
    found = {}
    for node in ast.walk(ast.parse((ROOT / script).read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args:
            flag = node.args[0].value if isinstance(node.args[0], ast.Constant) else None
            kw = {k.arg: k.value for k in node.keywords}
            if kw.get("action") is not None and getattr(kw["action"], "value", None) == "store_true":
                default = False
            else:
                default = ast.literal_eval(kw["default"]) if "default" in kw else None
                default = default if isinstance(kw.get("default"), ast.Constant) or "default" not in kw else ...
            found[flag] = default
    text = (ROOT / script).read_text()
    if "add_output_args(ap)" in text:
        found["--out"] = ...  # benchmarks/_common.py: --out DIR (default benchmarks/results)
    return found


@pytest.mark.parametrize("cls", list(SCRIPTS), ids=lambda c: c.__name__)
def test_script_configs_are_the_scripts_own_flags(cls):
    declared = _declared_flags(SCRIPTS[cls])
    for f in dataclasses.fields(cls):
        flag = flag_name(f)
        assert flag in declared, f"{SCRIPTS[cls]} takes no {flag}"
        if declared[flag] is not ...:
            assert f.default == declared[flag], (flag, f.default, declared[flag])


@pytest.mark.parametrize("machine", ["1xH100", "2xA100-80G", "2xRTX2080Ti", "cpu"])
def test_gpt_best_runs_the_glue_levers_only_where_bf16_measured_them(machine):
    """Issue 35's glue (residual in bf16, fused boundary, cast once, loss auto) joined gpt_best after the
    H200 measured it there; fp16 (sm75) and the CPU keep issue 30's levers, which the command says."""
    size = "full" if machine != "cpu" else "tiny"
    cfg = STEPS[f"{machine}-{size}-gpt_best"].config
    line = STEPS[f"{machine}-{size}-gpt_best"].command.words()
    glue = (cfg.residual_16bit, cfg.fused_boundary, cfg.cast_once, cfg.loss)
    bf16 = machine in ("1xH100", "2xA100-80G")
    assert glue == ((True, True, True, "auto") if bf16 else (False, False, False, "chunked")), glue
    assert ("--residual-16bit" in line) == bf16 and cfg.vocab_multiple == 64 and cfg.fused_qkv


def test_the_gpu_gpt_benchmark_runs_the_labs_gpt_best():
    """benchmarks/gpu_gpt.py (issue 35's measuring script) reads its levers from lab.plan: its gpt_best row
    parses to the lab's bf16 gpt_best (amp, compile, fused AdamW, TF32 and the model levers), its glue rows' base
    to issue 30's levers, and that base with all the glue to gpt_best again."""
    import importlib.util

    from trainlab.gpt.config import GPTBenchConfig

    spec = importlib.util.spec_from_file_location("gpu_gpt", ROOT / "benchmarks" / "gpu_gpt.py")
    gpu_gpt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_gpt)

    def parsed(argv):
        return explicit_values(_parser().parse_args(["gpt", "bench", *argv]), GPTBenchConfig)

    def levers(argv):
        run = ("strategy", "micro_batch_auto", "fused_optimizer", "tf32")
        return GPTBenchConfig(**{k: v for k, v in parsed(argv).items() if k not in run})

    lab = STEPS["1xH100-full-gpt_best"].config
    best = parsed(gpu_gpt.BEST)
    # the lab runs the planner's micro-batch (no accumulation at the H100's), the script accumulates to its
    # global batch at the micro-batch --micro-batch-auto picks
    assert set(lab.strategy.split("+")) <= set(best["strategy"].split("+")) and lab.fused_optimizer
    assert (best["fused_optimizer"], best["tf32"]) == (True, lab.tf32)
    assert levers(gpu_gpt.BEST) == GPTBenchConfig(**best_levers("bf16"))
    assert levers(gpu_gpt.LEVERS_30) == GPTBenchConfig(**LEVERS)
    assert levers([*gpu_gpt.LEVERS_30, *gpu_gpt.GLUE_ALL]) == GPTBenchConfig(**best_levers("bf16"))
    for name, value in best_levers("bf16").items():
        assert getattr(lab, name) == value, name
