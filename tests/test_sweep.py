"""`trainlab sweep`: flags derived from TrainConfig, the grid, validation before anything runs, the GPU
scheduler (tested with fake launches, no GPU needed), and a real small sweep grouped by the report."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from trainlab import cli
from trainlab.cli import main
from trainlab.errors import ConfigError, HardwareError
from trainlab.flags import Config, add_list_flags, cli_fields, flag_name, list_values, opt
from trainlab.lenet import sweep
from trainlab.lenet.config import NOT_SWEPT, SweepConfig, TrainConfig
from trainlab.lenet.sweep import plan, resolve_gpus, schedule

TINY = [
    "--epochs",
    "1",
    "--train-subset",
    "256",
    "--test-subset",
    "100",
    "--batch-size",
    "64",
    "--device",
    "cpu",
    "--no-tensorboard",
]


def _sweep_parser():
    return cli.build_parser()._subparsers._group_actions[0].choices["sweep"]


def test_every_train_flag_is_a_sweep_flag():
    flags = {o for a in _sweep_parser()._actions for o in a.option_strings}
    for f in cli_fields(TrainConfig, exclude=NOT_SWEPT):
        assert flag_name(f) in flags, f"{f.name}: a train flag that cannot be swept"
    assert "--out" in flags and "--seeds" in flags and "--gpus" in flags
    # derived, not listed: a new field of any config dataclass becomes a list flag by itself
    import argparse

    @dataclasses.dataclass
    class Extra(Config):
        momentum_2: float = opt(0.5, "a setting added later")
        fancy: bool = opt(False, "a switch")

    p = argparse.ArgumentParser()
    add_list_flags(p, Extra)
    args = p.parse_args(["--momentum-2", "0.1,0.2,0.1", "--fancy", "true,false"])
    assert list_values(args, Extra) == {"momentum_2": [0.1, 0.2], "fancy": [True, False]}
    assert list_values(p.parse_args(["--fancy"]), Extra) == {"fancy": [True]}
    assert list_values(p.parse_args(["--no-fancy"]), Extra) == {"fancy": [False]}


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--lr", "1e-3,fast"], "--lr '1e-3,fast': 'fast' is not a number"),
        (["--epochs", "1,,2"], "--epochs '1,,2': expected comma-separated values with none empty"),
        (["--preset", "default,turbo"], "--preset 'default,turbo': 'turbo' is not one of default, fast, best"),
        (["--optimizer", "adam,lion"], "--optimizer 'lion'"),
        (["--seeds", "2", "--seed", "0,1"], "--seeds N and --seed LIST both give the seeds"),
        (["--parallel", "ddp"], "--parallel ddp: a sweep runs single-process runs"),
        (["--gpus", "0,x"], "--gpus '0,x'"),
        (["--augment", "maybe"], "'maybe' is not true/false"),
    ],
)
def test_bad_sweeps_are_one_line_errors_before_any_run(tmp_path, capsys, argv, needle):
    assert main(["sweep", *TINY, "--out", str(tmp_path / "sw"), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("trainlab: error: ") and needle in err[0], err
    assert not (tmp_path / "sw").exists()


def test_plan_is_the_product_in_config_order_with_seeds_last(tmp_path):
    runs, values, swept, root = plan(
        {"lr": [1e-3, 2e-3], "optimizer": ["adam", "sgd"], "epochs": [2]}, SweepConfig(out=str(tmp_path), seeds=2)
    )
    assert swept == ["optimizer", "lr", "seed"] and values["epochs"] == [2]  # one value: fixed, not swept
    assert len(runs) == 8 and root == tmp_path
    assert runs[0].name == "optimizer=adam_lr=0.001_seed=0" and runs[-1].name == "optimizer=sgd_lr=0.002_seed=1"
    assert {r.config.epochs for r in runs} == {2} and runs[3].config.seed == 1 and runs[3].config.lr == 2e-3
    assert all(r.config.out == str(tmp_path / r.name) and not r.config.progress for r in runs)
    # presets apply per run, and a flag given explicitly wins over the preset (as in `trainlab train`)
    best, *_ = plan({"preset": ["best"], "epochs": [1]}, SweepConfig(out=str(tmp_path)))
    assert best[0].config.batchnorm and best[0].config.epochs == 1


# ---- the GPU scheduler, with fake processes -------------------------------------------------------


class FakeCluster:
    """start() returns a handle; wait_any() finishes the running job that was started earliest, or the
    one `finish_order` names next; records what ran where and when."""

    def __init__(self, codes=None, finish_order=None):
        self.clock, self.codes, self.finish_order = 0, codes or {}, list(finish_order or [])
        self.running, self.log = {}, []

    def start(self, job, gpu):
        assert gpu not in self.running.values(), f"GPU {gpu} given a second job while busy"
        handle = ("h", job)
        self.running[handle] = gpu
        self.log.append(("start", job, gpu, self.clock))
        return handle

    def wait_any(self, handles):
        assert set(handles) == set(self.running)
        self.clock += 1
        pick = next((h for h in handles if self.finish_order and h[1] == self.finish_order[0]), handles[0])
        if self.finish_order and pick[1] == self.finish_order[0]:
            self.finish_order.pop(0)
        gpu = self.running.pop(pick)
        self.log.append(("end", pick[1], gpu, self.clock))
        return pick, self.codes.get(pick[1], 0)


def test_scheduler_one_job_per_gpu_fifo_and_lowest_free_gpu():
    fake = FakeCluster(finish_order=["b", "a", "d", "c", "e"])
    results = schedule(list("abcde"), [3, 1], fake.start, fake.wait_any)
    starts = [(job, gpu) for kind, job, gpu, _ in fake.log if kind == "start"]
    assert [job for job, _ in starts] == list("abcde")  # queued order
    assert starts[:2] == [("a", 1), ("b", 3)]  # the lowest free GPU first
    assert starts[2] == ("c", 3)  # b finished first: its GPU takes the next job
    assert set(results) == set(range(5)) and all(code == 0 for _, code in results.values())
    busy = {}
    for kind, job, gpu, _ in fake.log:  # replay: never two jobs on one GPU
        if kind == "start":
            assert gpu not in busy
            busy[gpu] = job
        else:
            assert busy.pop(gpu) == job


def test_scheduler_keeps_going_after_a_failure_and_reports_it():
    fake = FakeCluster(codes={"b": 3})
    heard = []
    results = schedule(
        list("abcd"), [0, 1], fake.start, fake.wait_any, lambda job, gpu, code: heard.append((job, code))
    )
    assert sorted(heard) == [("a", 0), ("b", 3), ("c", 0), ("d", 0)]  # each reported as it finished
    assert results[1][1] == 3 and [results[i][1] for i in (0, 2, 3)] == [0, 0, 0]
    running, most = 0, 0
    for kind, *_ in fake.log:
        running += 1 if kind == "start" else -1
        most = max(most, running)
    assert most == 2  # both GPUs kept busy, also after the failure


def test_scheduler_with_more_gpus_than_jobs_and_with_none():
    fake = FakeCluster()
    assert {gpu for gpu, _ in schedule(["x"], [0, 1, 2, 3], fake.start, fake.wait_any).values()} == {0}
    with pytest.raises(ValueError):
        schedule(["x"], [], fake.start, fake.wait_any)


def test_gpu_choice(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert resolve_gpus("auto", "auto") == [0, 1, 2, 3] and resolve_gpus("auto", "cpu") == []
    assert resolve_gpus("none", "cuda") == [] and resolve_gpus("2,0", "cuda") == [2, 0]
    with pytest.raises(HardwareError, match="GPU 5 is not visible"):
        resolve_gpus("1,5", "cuda")
    with pytest.raises(ConfigError, match="distinct"):
        resolve_gpus("1,1", "cuda")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert resolve_gpus("auto", "cuda") == []  # one GPU: runs one after another, in process


# ---- real sweeps on the CPU --------------------------------------------------------------------


def test_cpu_sweep_writes_run_dirs_resumes_and_the_report_groups_them(tmp_path, capsys, monkeypatch):
    out = tmp_path / "sw"
    argv = ["sweep", "--optimizer", "adam,sgd", "--lr", "2e-3", "--seeds", "2", "--out", str(out), *TINY]
    assert main(argv) == 0
    names = sorted(p.name for p in out.iterdir() if (p / "summary.json").exists())
    assert names == ["optimizer=adam_seed=0", "optimizer=adam_seed=1", "optimizer=sgd_seed=0", "optimizer=sgd_seed=1"]
    record = json.loads((out / "sweep.json").read_text())
    assert record["swept"] == ["optimizer", "seed"] and record["values"]["lr"] == [2e-3]
    cfg = json.loads((out / "optimizer=sgd_seed=1" / "config.json").read_text())
    assert cfg["optimizer"] == "sgd" and cfg["seed"] == 1 and cfg["lr"] == 2e-3 and cfg["epochs"] == 1
    # the same command again finishes an interrupted sweep: nothing left to do, nothing retrained
    before = (out / "optimizer=adam_seed=0" / "summary.json").stat().st_mtime_ns
    capsys.readouterr()
    assert main(argv) == 0
    assert "4 already done" in capsys.readouterr().out
    assert (out / "optimizer=adam_seed=0" / "summary.json").stat().st_mtime_ns == before

    assert main(["report", str(out), "-o", str(tmp_path / "report")]) == 0
    md = (tmp_path / "report" / "report.md").read_text()
    accs = {n: json.loads((out / n / "summary.json").read_text())["test_accuracy"] for n in names}
    import statistics

    for opt_name in ("adam", "sgd"):
        a = [accs[f"optimizer={opt_name}_seed={s}"] for s in (0, 1)]
        row = next(line for line in md.splitlines() if line.startswith(f"| optimizer={opt_name} |"))
        assert f"{statistics.mean(a):.2f} ± {statistics.stdev(a):.2f} %" in row and "| 2 (0, 1) |" in row
    assert "compare_optimizer.png" in md and "compare_seed.png" not in md and "compare_lr.png" not in md
    # with more runs than fit one screen, the summary shows the groups instead of every run
    from trainlab.report import build

    monkeypatch.setattr(build, "SUMMARY_MAX_RUN_ROWS", 3)
    assert main(["report", str(out), "-o", str(tmp_path / "report2")]) == 0
    summary = (tmp_path / "report2" / "report.md").read_text().split("## Comparison")[0]
    assert "| optimizer=adam | 2 (0, 1) |" in summary and "optimizer=adam_seed=0" not in summary


def test_gpu_branch_runs_each_run_in_its_own_process(tmp_path, monkeypatch, capsys):
    # The parallel path end to end without GPUs: two fake "GPUs", each run a `trainlab worker` process on the CPU.
    import subprocess

    from trainlab.distributed.launch import worker_command, write_spec

    started = []

    def start_on_cpu(run, gpu, root):
        started.append((run.name, gpu))
        spec = write_spec(root / "logs" / f"{run.name}.spec.json", "train", config=run.config.to_dict(), resume=None)
        return subprocess.Popen(
            worker_command(1, spec),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
        )

    monkeypatch.setattr(sweep, "resolve_gpus", lambda spec, device: [0, 1])
    monkeypatch.setattr(sweep, "_start_process", start_on_cpu)
    out = tmp_path / "sw"
    assert main(["sweep", "--lr", "1e-3,2e-3", "--out", str(out), *TINY]) == 0
    assert sorted(gpu for _, gpu in started) == [0, 1]  # two runs side by side, one per "GPU"
    assert all((out / name / "summary.json").exists() for name, _ in started)
    text = capsys.readouterr().out
    assert text.count("[gpu ") == 4 and "2 of 2 runs finished" in text and "test accuracy" in text
