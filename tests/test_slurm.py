"""The launcher's rendezvous inside a SLURM job (docs/slurm.md): the torchrun arguments and the elastic
agent's config built from SLURM_* variables, and the sbatch scripts of the page."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

from trainlab.cli import build_parser
from trainlab.distributed.launch import first_host, launch_config_kwargs, torchrun_args, worker_command
from trainlab.errors import ConfigError

DOC = Path(__file__).resolve().parent.parent / "docs" / "slurm.md"
TWO_NODES = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_NODEID": "1",
}


def test_torchrun_args_from_a_two_node_slurm_job():
    assert torchrun_args(4, TWO_NODES) == [
        "--nnodes=2",
        "--nproc-per-node=4",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=gpu07:29500",
        "--rdzv-id=slurm-4242",
    ]
    kw = launch_config_kwargs(4, TWO_NODES)
    assert (kw["min_nodes"], kw["max_nodes"], kw["nproc_per_node"]) == (2, 2, 4)
    assert kw["rdzv_endpoint"] == "gpu07:29500" and kw["run_id"] == "slurm-4242" and kw["rdzv_backend"] == "c10d"
    cmd = worker_command(4, "spec.json", TWO_NODES)
    assert (
        cmd[1:3] == ["-m", "torch.distributed.run"] and "--rdzv-endpoint=gpu07:29500" in cmd and cmd[-1] == "spec.json"
    )


def test_master_port_and_the_older_node_count_variable():
    env = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "3", "SLURM_JOB_NODELIST": "a100-n[3,5-6]", "MASTER_PORT": "31000"}
    assert "--rdzv-endpoint=a100-n3:31000" in torchrun_args(8, env) and "--nnodes=3" in torchrun_args(8, env)


def test_one_node_or_no_slurm_is_standalone():
    assert torchrun_args(2, {}) == ["--standalone", "--nproc-per-node=2"]
    assert torchrun_args(2, {**TWO_NODES, "SLURM_JOB_NUM_NODES": "1"}) == ["--standalone", "--nproc-per-node=2"]
    kw = launch_config_kwargs(2, {})
    assert kw["rdzv_endpoint"] == "localhost:0" and kw["min_nodes"] == kw["max_nodes"] == 1


@pytest.mark.parametrize(
    "nodelist, host",
    [
        ("gpu[07-09,12],cpu1", "gpu07"),
        ("node1,node2", "node1"),
        ("a[3]", "a3"),
        ("x-y[001-004]", "x-y001"),
        ("single", "single"),
    ],
)
def test_first_host_of_a_node_list(nodelist, host):
    assert first_host(nodelist) == host


def test_a_broken_slurm_environment_is_one_line():
    with pytest.raises(ConfigError, match="SLURM_JOB_NUM_NODES 'two': expected a whole number"):
        torchrun_args(2, {**TWO_NODES, "SLURM_JOB_NUM_NODES": "two"})
    with pytest.raises(ConfigError, match="SLURM_JOB_NODELIST is not set"):
        torchrun_args(2, {"SLURM_JOB_ID": "1", "SLURM_JOB_NUM_NODES": "2"})


def _scripts() -> list[str]:
    return [b for b in re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S) if b.startswith("#!/bin/bash")]


def test_the_pages_sbatch_scripts_parse_and_their_commands_exist(tmp_path):
    scripts = _scripts()
    assert len(scripts) == 3
    parser = build_parser()
    for i, text in enumerate(scripts):
        path = tmp_path / f"s{i}.sbatch"
        path.write_text(text)
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
        assert "#SBATCH --nodes=" in text
        line = next(ln for ln in text.replace("\\\n", " ").splitlines() if ln.startswith("srun trainlab"))
        argv = [a for a in shlex.split(line.removeprefix("srun trainlab "))]
        argv = [a.replace("$HOME", str(tmp_path)).replace("$SLURM_JOB_ID", "1") for a in argv]
        parser.parse_args(argv)  # every flag exists (argparse exits on an unknown one)
    assert "--ntasks-per-node=1" in scripts[2]  # one launcher per node: the agent starts the workers
    doc_args = re.search(r"```\n(--nnodes=.*?)\n```", DOC.read_text()).group(1)
    assert doc_args.replace("<job id>", "4242").split() == torchrun_args(4, TWO_NODES)


def _trainlab_lines(block: str) -> list[list[str]]:
    """Every `trainlab ...` command of a fenced block (after `srun`), as argv, comments dropped."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["srun"]:
            words = words[1:]
        if words[:1] == ["trainlab"]:
            out.append(words[1:])
    return out


def test_one_node_two_gpu_sbatch_and_salloc_recipes(tmp_path, capsys, monkeypatch):
    """Issue 31: the course's GPU08 (2×A100 80GB) from a conda environment. Every trainlab command the
    recipes hold parses with trainlab's parser, asks for the two GPUs the allocation has, and the lab's
    plan for that node (replayed through `trainlab lab --plan`) runs every step, each GPT row fitting."""
    from trainlab.cli import main
    from trainlab.gpt import planner
    from trainlab.gpt.shape import get_preset

    text = DOC.read_text()
    sbatch = next(b for b in _scripts() if "#SBATCH --gpus=2" in b)
    salloc = next(b for b in re.findall(r"```bash\n(.*?)```", text, re.S) if b.startswith("salloc "))
    for flag in ("--nodes=1", "--ntasks=1", "--gpus=2"):
        assert f"#SBATCH {flag}" in sbatch and flag in salloc.splitlines()[0]
    script = tmp_path / "lab2.sbatch"
    script.write_text(sbatch)
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    assert "conda activate mytorch" in sbatch and "conda activate mytorch" in salloc
    commands = _trainlab_lines(sbatch) + _trainlab_lines(salloc)
    assert {c[0] for c in commands} == {"lab", "train", "dp", "gpt"}
    parser = build_parser()
    a100 = ["--gpus", "2", "--gpu-mem", "80GiB", "--sm", "80", "--device-name", "NVIDIA A100-SXM4-80GB"]
    for argv in commands:
        argv = [a.replace("$HOME", str(tmp_path)) for a in argv]
        args = parser.parse_args(argv)
        if hasattr(args, "nproc") and args.nproc is not None:
            assert args.nproc == 2, argv
        if argv[0] == "lab":  # the node's plan: every step runs, every GPT row fits
            plan_argv = argv + ([] if "--plan" in argv else ["--plan"]) + a100
            assert main(plan_argv) == 0
            printed = capsys.readouterr().out
            assert "not run" not in printed and "left out" not in printed and "ddp+amp" in printed, printed
            assert not (tmp_path / "lab-2gpu").exists()
        if argv[:2] == ["gpt", "compare"]:
            budget = planner.usable_bytes(80 * 2**30)
            for strategy in args.strategies.split(","):
                world = 2 if "+" in strategy or strategy in ("ddp", "zero2", "zero3", "tp", "pp") else 1
                per_rank = args.global_batch // (world if strategy.split("+")[0] in ("ddp", "zero2", "zero3") else 1)
                need = planner.predict_memory(
                    get_preset(args.model),
                    strategy,
                    world,
                    args.micro_batch,
                    accumulation_steps=per_rank // args.micro_batch,
                    sm=80,
                )["total_bytes"]
                assert need <= budget, (strategy, need / 2**30)
