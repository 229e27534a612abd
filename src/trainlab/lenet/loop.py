"""LeNet-5 training, top to bottom: set up → (resume) → per epoch: train, evaluate, log, checkpoint → summary.

The loop keeps the GPU busy: per-step losses and correct-prediction counts stay on the device and are
read back once per epoch (a `.item()` per step would be a CPU-GPU sync point per step). Training
accuracy is measured on the batches the optimizer sees (augmented, in train mode, before the update),
so it is a running figure, not a re-evaluation of the training set.
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path

import torch

from trainlab.data.datasets import describe_dataset, load_dataset
from trainlab.device import set_matmul_precision, synchronize
from trainlab.distributed.launch import describe_timeout
from trainlab.distributed.wrappers import unwrap
from trainlab.errors import TrainingDiverged
from trainlab.io import progress_bar
from trainlab.lenet import misclassified
from trainlab.lenet.architecture import architecture_rows
from trainlab.lenet.batches import build_test_batches, build_train_batches, to_device
from trainlab.lenet.checkpoint import load_checkpoint, restore_checkpoint, restore_grad_scaler, save_checkpoint
from trainlab.lenet.config import TrainConfig
from trainlab.lenet.data_parallel import setup_data_parallel
from trainlab.lenet.ema import EMA
from trainlab.lenet.estimate import announce
from trainlab.lenet.evaluate import evaluate
from trainlab.lenet.model import count_parameters
from trainlab.lenet.models import flops_per_image
from trainlab.lenet.plan import LeNetPlan, resolve
from trainlab.lenet.setup import build_model, build_optimizer, build_scheduler
from trainlab.lenet.shard_weights import setup_shards
from trainlab.lenet.step import Step, make_step
from trainlab.lenet.sync_bn import convert_sync_batchnorm
from trainlab.lenet.tta import evaluate_tta
from trainlab.results.kinds import plan_record, stamp
from trainlab.signals import StopOnSignal
from trainlab.telemetry.env import BusySnapshot, collect_env, format_header
from trainlab.telemetry.figures import misclassified_figure
from trainlab.telemetry.gpu import GPUSampler, gather_samples, log_gpu_tags, rank_csv_name, sampled_devices
from trainlab.telemetry.rundir import RunDir
from trainlab.telemetry.tensorboard import image_grid, make_writer

# The accuracy "time to accuracy" is timed to (summary.json's time_to_99_seconds), as in the speed
# records (airbench, tuomaso/train_mnist_fast): not the handout's pass bar (report.lab.HANDOUT_PASS_BAR).
TIME_TO_ACCURACY_TARGET = 99.0


def default_run_dir(cfg: TrainConfig) -> Path:
    name = cfg.name or f"{cfg.act}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"
    return Path(cfg.out) if cfg.out else Path("runs") / name


def train(cfg: TrainConfig, resume: str | Path | None = None, log=print) -> dict:
    """Train LeNet-5 per `cfg`; with `resume`, continue the run in that directory. Returns the summary.

    `cfg.step_timing` synchronizes at every step boundary to split each step into data / compute /
    communication time (summary["step_times"]); it costs throughput on a GPU, so it is off by default.
    Rank 0 owns the run directory for the whole run (`RunDir.claim`: locked, never silently reused).
    A NaN/inf loss stops the run with `TrainingDiverged`; the last good checkpoint stays.
    """
    # ---- resolve everything up front, so a bad flag fails before any work -------------------------
    cfg.validate()
    par = setup_data_parallel(
        cfg.parallel,
        cfg.device,
        cfg.batch_size,
        step_timing=cfg.step_timing,
        timeout_s=cfg.dist_timeout,
        rank_devices=cfg.rank_devices,
    )
    plan = resolve(cfg, par.device)  # every `auto` decided, every machine check made, once
    model = build_model(plan)  # an implementation this device lacks fails before the run directory exists
    path = resume if resume is not None else default_run_dir(cfg)
    # SIGTERM/SIGINT from here on (the set-up included): stop after the next checkpoint (trainlab.signals)
    with StopOnSignal() as signals:
        if not par.is_main:  # only rank 0 prints, logs to TensorBoard and writes the run directory
            return _train(cfg, plan, model, resume, _silent, par, RunDir(path), signals)
        with RunDir.claim(
            path, resume=resume is not None, overwrite=cfg.overwrite, flag="--resume" if resume is not None else "--out"
        ) as run:
            return _train(cfg, plan, model, resume, log, par, run, signals)


def _train(cfg: TrainConfig, plan: LeNetPlan, model, resume, log, par, run: RunDir, signals: StopOnSignal) -> dict:
    tf32 = set_matmul_precision(plan.matmul_precision)  # --tf32 / --matmul-precision, resolved in the plan
    s = _assemble(cfg, plan, model, resume, par, run, log)

    # ---- record what this run is, before it runs -------------------------------------------------
    env = collect_env(s.device)
    if par.is_main:
        run.write_json("config.json", cfg.to_dict())
        run.write_json("env.json", env)
    log(
        format_header(
            {
                **cfg.to_dict(),
                "dist_timeout": describe_timeout(cfg.dist_timeout),  # as resolved, with its source
                "run_dir": str(run.path),
                "params": s.params,
                "flops_per_image": s.flops,
                "plan": ", ".join(f"{k}={v}" for k, v in plan.to_dict().items()),
                "resumed_from_epoch": s.start_epoch if s.resumed else None,
                "rank_batches": par.rank_batches(cfg.batch_size, getattr(s.train_batches, "shares", None)),
            },
            env,
        )
    )
    log(f"data: {s.data_line}")  # a run on altered data is never silent
    tel = Telemetry(cfg, s, par, run, env, log)

    step = make_step(plan, par.wrap(s.model), s.optimizer, after_backward=par.after_backward, ema=s.ema)
    if s.resumed:
        restore_grad_scaler(step.scaler, s.grad_scaler, run.checkpoint, log)
    model = step.model  # what the step runs: wrapped for data parallelism, compiled in the compile mode
    # Each rank scores its shard of the test set with the plain module: DDP's forward would broadcast
    # buffers, a collective that ranks with different numbers of test batches cannot all join.
    live_model = unwrap(model) if par.multi_process else model
    eval_model = s.ema.module if s.ema is not None else live_model  # what is tested, reported and checkpointed
    warmup_seconds = _prepare(step, s)  # compile / capture / autotune: reported apart from the training time
    log(announce(cfg, s, step, par))  # device, epochs, sizes and a measured estimate, before the first epoch

    # ---- train ----------------------------------------------------------------------------------
    time_to_target = next(
        (h["train_seconds"] for h in s.history if h["test_accuracy"] >= TIME_TO_ACCURACY_TARGET), None
    )
    epochs_run = 0
    try:
        with tel:
            for epoch in range(s.start_epoch, cfg.epochs):
                # nvidia-smi in the second epoch of this call when there is one: the first pays the warm-up
                tel.epoch_starts(snapshot=epochs_run == min(1, cfg.epochs - s.start_epoch - 1))
                epoch_seconds, losses, accuracies, train_accuracy = _train_epoch(cfg, s, step, par, epoch)
                s.train_seconds += epoch_seconds
                tel.epoch_trained()

                record, result = _epoch_record(
                    cfg, s, par, eval_model, live_model, epoch, epoch_seconds, losses, accuracies, train_accuracy, run
                )
                if step.scaler is not None:  # fp16: the loss scale the GradScaler has settled on (checkpointed)
                    record["grad_scale"] = step.scaler.get_scale()
                s.history.append(record)
                if time_to_target is None and result["test_accuracy"] >= TIME_TO_ACCURACY_TARGET:
                    time_to_target = s.train_seconds
                log(
                    f"epoch {epoch + 1:>3}/{cfg.epochs}  train_loss {record['train_loss']:.4f}  test_loss {record['test_loss']:.4f}  "
                    f"train_acc {record['train_accuracy']:6.2f}%  test_acc {record['test_accuracy']:6.2f}%  "
                    f"{record['images_per_s']:>9,.0f} img/s  {epoch_seconds:6.2f} s"
                    + (f"  (live weights {record['live_test_accuracy']:.2f}%)" if s.ema else "")
                )
                tel.epoch_done(record, result, s.global_step, s.scheduler, model)
                if par.is_main:
                    run.write_metrics(s.history)
                    save_checkpoint(
                        run.checkpoint,
                        model=model,
                        optimizer=s.optimizer,
                        scheduler=s.scheduler,
                        epoch=epoch + 1,
                        global_step=s.global_step,
                        history=s.history,
                        train_seconds=s.train_seconds,
                        config=cfg.to_dict(),
                        ema=s.ema.state_dict() if s.ema is not None else None,
                        grad_scaler=step.scaler.state_dict() if step.scaler is not None else None,
                    )
                epochs_run += 1
                signals.stop(par, run.path, epoch + 1, cfg.epochs)
                if cfg.stop_after is not None and epochs_run >= cfg.stop_after and epoch + 1 < cfg.epochs:
                    log(
                        f"stopping after {epochs_run} epoch(s) as asked (--stop-after); resume with: "
                        f"trainlab train --resume {run.path}"
                    )
                    par.close()
                    return {"interrupted": True, "epochs_done": epoch + 1, "run_dir": str(run.path)}
    except Exception as e:
        par.raise_if_peer_failure(e)  # a dead or hung peer rank → one clear line, not a gloo/NCCL trace
        raise

    # ---- summarize ------------------------------------------------------------------------------
    return _summarize(
        cfg,
        plan,
        s,
        par,
        run,
        tel,
        env,
        model,
        eval_model,
        tf32=tf32,
        warmup_seconds=warmup_seconds,
        time_to_target=time_to_target,
        log=log,
    )


def _epoch_record(
    cfg: TrainConfig,
    s,
    par,
    eval_model,
    live_model,
    epoch: int,
    epoch_seconds: float,
    losses: list[float],
    accuracies: list[float],
    train_accuracy: float,
    run: RunDir,
) -> tuple[dict, dict]:
    """Evaluate after an epoch (stopping a diverged run) → (its metrics.jsonl record, the evaluation)."""
    par.broadcast_buffers(eval_model)
    t0 = time.perf_counter()
    result = evaluate(eval_model, s.test_batches, s.device, s.precision, par=par)
    s.eval_seconds += time.perf_counter() - t0  # evaluate ends in a device→host copy: the time is the work's
    _stop_if_diverged(losses, result["test_loss"], epoch, cfg, run)
    record = {
        "epoch": epoch + 1,
        "global_step": s.global_step,
        "train_loss": sum(losses) / len(losses),
        "train_accuracy": train_accuracy,
        "test_loss": result["test_loss"],
        "test_accuracy": result["test_accuracy"],
        "train_test_gap": train_accuracy - result["test_accuracy"],  # overfitting, in points (running train accuracy)
        "per_class_accuracy": result["per_class_accuracy"],
        **(
            {"live_test_accuracy": _live_accuracy(live_model, s.test_batches, s.device, s.precision, par)}
            if s.ema
            else {}
        ),
        "lr": float(s.scheduler.get_last_lr()[0]),  # a device tensor under the cudagraph step
        "epoch_seconds": epoch_seconds,
        "train_seconds": s.train_seconds,
        "images_per_s": s.n_train / epoch_seconds,
        "step_losses": losses,
        "step_accuracies": accuracies,
    }
    return record, result


def _summarize(
    cfg: TrainConfig,
    plan: LeNetPlan,
    s,
    par,
    run: RunDir,
    tel,
    env: dict,
    model,
    eval_model,
    *,
    tf32,
    warmup_seconds: float,
    time_to_target: float | None,
    log,
) -> dict:
    """The final evaluation (TTA too), misclassified digits, the last TensorBoard images, summary.json."""
    par.broadcast_buffers(eval_model)
    t0 = time.perf_counter()
    final = evaluate(eval_model, s.test_batches, s.device, s.precision, par=par, predictions=True)
    s.eval_seconds += time.perf_counter() - t0
    tta = evaluate_tta(eval_model, s.test_batches, s.device, s.precision, par=par) if cfg.tta else None
    wrong = misclassified.misclassified(final["predictions"], *_test_arrays(s.data, cfg))
    if par.is_main:
        misclassified.save(run.file(misclassified.FILE), wrong)
    tel.close(unwrap(model), s.test_batches, s.global_step, wrong)
    summary = {
        "test_accuracy": final["test_accuracy"],
        "architecture": architecture_rows(cfg.to_dict()),  # the report reads it here, never builds the model
        "train_accuracy": s.history[-1].get("train_accuracy") if s.history else None,
        "test_loss": final["test_loss"],
        "per_class_accuracy": final["per_class_accuracy"],
        "confusion_matrix": final["confusion_matrix"],
        "tta_test_accuracy": tta["test_accuracy"] if tta else None,
        "ema_decay": cfg.ema or None,
        "epochs": cfg.epochs,
        "data": s.data_line,
        # the timed training only; data loading, compile/capture and evaluation are reported apart
        "train_seconds": s.train_seconds,
        "data_seconds": s.data_seconds,
        "warmup_seconds": warmup_seconds,  # the step's prepare: compile, CUDA-graph capture, cuDNN autotune
        "eval_seconds": s.eval_seconds,
        "step_mode": plan.step_mode,
        "batch_size": plan.batch_size,
        "steps": s.global_step,
        "ms_per_step": 1e3 * s.train_seconds / s.global_step if s.global_step else None,
        "time_to_99_seconds": time_to_target,
        "images_per_s_median": statistics.median(h["images_per_s"] for h in s.history) if s.history else None,
        "device": str(s.device),
        "device_name": env["gpus"][0] if s.device.type == "cuda" and env["gpus"] else env["cpu"],
        "tf32": tf32,
        "params": s.params,
        "flops_per_image": s.flops,
        "model": cfg.model,
        "dataset": cfg.dataset,
        "amp": str(plan.amp_dtype).removeprefix("torch.") if plan.amp_dtype is not None else "off",  # the type that ran
        "channels_last": plan.channels_last,
        "ops": plan.ops_spec,  # --ops auto resolved
        "plan": plan.to_dict(),  # the resolved recipe (lenet/plan.py)
        "act": cfg.act,
        "seed": cfg.seed,
        "gpu": tel.gpu.summary() if tel.gpu is not None else None,
        "parallel": par.mode,
        "world_size": par.world_size,
        "shard_weights": s.sharding,
        "step_times": par.timer.summary(),
        "run_dir": str(run.path),
    }
    if par.is_main:
        n_test = len(_test_arrays(s.data, cfg)[1])
        record = plan_record(
            str(s.device),
            device_name=summary["device_name"],
            precision=summary["amp"] if summary["amp"] != "off" else ("tf32" if plan.tf32 else "fp32"),
            threads=torch.get_num_threads() if s.device.type == "cpu" else None,
            dataset={"name": cfg.dataset, "train": s.n_train, "test": n_test},
            model={"name": cfg.model, "act": cfg.act, "params": s.params},
            resolved=plan.to_dict(),
        )
        # the file's plan is the record (its resolved LeNetPlan under "resolved"); the returned summary keeps its own
        run.write_json("summary.json", stamp("lenet_train", {k: v for k, v in summary.items() if k != "plan"}, record))
    par.close()
    if tta:
        log(
            f"test-time augmentation ({tta['views']} views, reported separately): test accuracy {tta['test_accuracy']:.2f}%"
        )
    log(
        f"done: test accuracy {summary['test_accuracy']:.2f}%{' (EMA weights)' if s.ema else ''}  train time {s.train_seconds:.1f} s  "
        f"time to {TIME_TO_ACCURACY_TARGET:g}%: {f'{time_to_target:.1f} s' if time_to_target is not None else 'not reached'}  run dir: {run.path}"
    )
    return summary


@dataclass
class _Parts:
    """What a run is assembled from (`_assemble`), and where it stands: epochs done, steps, seconds."""

    device: torch.device
    data: object
    train_batches: object
    test_batches: object
    n_train: int
    channels_last: bool
    precision: torch.dtype | None
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    ema: EMA | None
    params: int
    resumed: bool
    sharding: dict | None = None  # the --shard-weights split as resolved (lenet/shard_weights.py)
    grad_scaler: dict | None = None  # a resumed fp16 run: the checkpoint's GradScaler state (restored into the step)
    flops: int = 0  # forward FLOPs per image (lenet/models.py)
    data_line: str = ""  # source, fingerprint, official or not: hashed once, logged and summarized
    start_epoch: int = 0
    global_step: int = 0
    history: list = field(default_factory=list)
    train_seconds: float = 0.0
    data_seconds: float = 0.0  # reading the dataset and building the (device-resident) batches
    eval_seconds: float = 0.0  # every evaluation of this process (not counted in train_seconds)


def _assemble(cfg: TrainConfig, plan: LeNetPlan, model, resume, par, run: RunDir, log) -> _Parts:
    """Data, batches, optimizer, schedule and EMA around the plan's `model`; with `resume`, put back
    where the checkpoint left them."""
    device = par.device
    ckpt = load_checkpoint(run.checkpoint) if resume is not None else None
    synchronize(device)
    t0 = time.perf_counter()
    data = load_dataset(cfg.dataset, cfg.data_dir)
    if cfg.holdout is not None:
        data = data.holdout(cfg.holdout)
    train_batches = build_train_batches(cfg, data, device, par)
    test_batches = build_test_batches(cfg, data, device, par)
    synchronize(device)
    data_seconds = time.perf_counter() - t0
    n_train = len(data.train_images) if cfg.train_subset is None else min(cfg.train_subset, len(data.train_images))
    optimizer = build_optimizer(plan, model)
    # before wrapping: `auto` times the plain model's eager step, no collective (lenet/shard_weights.py)
    sharding = setup_shards(
        cfg.shard_weights, make_step(replace(plan, step_mode="eager"), model, optimizer), train_batches, par, log
    )
    if (
        cfg.sync_bn
    ):  # after the --shard-weights timing (no collectives there); same parameters, so the optimizer keeps them
        model = convert_sync_batchnorm(model)
    steps_per_epoch = len(train_batches)  # after the split: a weighted split may drop a short last batch
    total_steps = train_batches.total_steps(cfg.epochs) if cfg.warmup_batch_size else None  # device loader (validate)
    scheduler = build_scheduler(plan, optimizer, plan.lr, steps_per_epoch, total_steps)
    ema = (
        EMA(model, cfg.ema, cfg.ema_warmup) if cfg.ema else None
    )  # evaluated and checkpointed in place of the live weights
    s = _Parts(
        device,
        data,
        train_batches,
        test_batches,
        n_train,
        plan.channels_last,
        plan.amp_dtype,
        model,
        optimizer,
        scheduler,
        ema,
        params=0,
        resumed=ckpt is not None,
        sharding=sharding,
        data_seconds=data_seconds,
    )
    if ckpt is not None:
        s.start_epoch, s.global_step, s.history, s.train_seconds = restore_checkpoint(
            ckpt, cfg, model, optimizer, scheduler, run, steps_per_epoch, log, ema=ema
        )
        s.grad_scaler = ckpt.get("grad_scaler")
    s.params, s.flops = count_parameters(model), flops_per_image(model)
    s.data_line = describe_dataset(cfg.dataset, data)
    return s


def _train_epoch(
    cfg: TrainConfig, s: _Parts, step: Step, par, epoch: int
) -> tuple[float, list[float], list[float], float]:
    """One pass over the training batches → (seconds, per-step global loss, per-step accuracy, epoch accuracy).

    Per-step losses and correct counts stay on the device and come back in one copy at the end."""
    s.train_batches.set_epoch(epoch)  # the order is a pure function of (seed, epoch): resumable
    step.model.train()
    step_losses, step_correct, step_sizes = [], [], []
    weights = par.shard_weights(s.train_batches)  # None unless the world size leaves uneven shards
    synchronize(s.device)
    t0 = time.perf_counter()
    bar = progress_bar(
        s.train_batches, cfg.progress, total=len(s.train_batches), desc=f"epoch {epoch + 1}/{cfg.epochs}", leave=False
    )
    for i, (x, y) in enumerate(par.timer.batches(bar, lambda b: to_device(*b, s.device, s.channels_last))):
        loss, correct = step(x, y, scale=None if weights is None else weights[i])
        s.scheduler.step()  # under cudagraph: fills the optimizer's lr tensor in place, read by the next replay
        par.timer.step_done()
        step_losses.append(loss)
        step_correct.append(correct)  # stays on the device
        step_sizes.append(len(y))
        s.global_step += 1
        if not bar.disable and s.global_step % 50 == 0:
            bar.set_postfix(loss=f"{loss.item():.4f}")  # sync point, once per 50 steps
    synchronize(s.device)
    seconds = time.perf_counter() - t0
    # one sync for the whole epoch: the global batches' mean losses and accuracies
    losses, accuracies, train_accuracy = par.step_means(torch.stack(step_losses), torch.stack(step_correct), step_sizes)
    return seconds, losses, accuracies, train_accuracy


class Telemetry:
    """What a run reports beside its metrics, kept out of the loop's body: TensorBoard (rank 0), GPU
    sampling (NVML, every rank its own GPUs) and the nvidia-smi snapshot taken while the first epoch trains.
    `with tel:` samples the GPU for the duration and writes gpu.rank<N>.csv (and, gathered on rank 0, the TensorBoard curves) at the end."""

    def __init__(self, cfg: TrainConfig, s: _Parts, par, run: RunDir, env: dict, log):
        self.run, self.env = run, env
        self.writer = make_writer(
            run.path, cfg.tensorboard and par.is_main, purge_step=s.global_step if s.resumed else None
        )
        self.histograms = cfg.histograms and self.writer is not None
        if self.writer is not None and not s.resumed:
            _log_graph(self.writer, s.model, next(iter(s.test_batches))[0][:8])
            _log_layout(self.writer)
        device = s.device
        self.par = par
        self.gpu = (
            GPUSampler(indices=sampled_devices(par.mode, device), log=log)  # every rank its own GPU(s)
            if cfg.gpu_telemetry and device.type == "cuda"
            else None
        )
        self.busy = BusySnapshot()  # nvidia-smi while an epoch trains (env.json's is taken idle)
        if cfg.gpu_telemetry and device.type != "cuda":
            log("gpu telemetry: skipped — training on the CPU")

    def __enter__(self) -> Telemetry:
        if self.gpu is not None:
            self.gpu.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.gpu is None:
            return
        self.gpu.stop()
        self.gpu.write_csv(self.run.file(rank_csv_name(self.par.rank)))
        if exc[0] is None:  # the same on every rank (device type and flag are), so all join the gather
            per_rank = gather_samples(self.gpu.samples, self.par.multi_process)
            if self.writer is not None:
                log_gpu_tags(self.writer, per_rank)

    def epoch_starts(self, snapshot: bool) -> None:
        if snapshot and self.gpu is not None and self.par.is_main:
            self.busy.start()  # in the background: nvidia-smi answers while the epoch's steps run

    def epoch_trained(self) -> None:
        snapshot = self.busy.finish()
        if snapshot is not None:
            self.env["nvidia_smi_busy"] = snapshot
            self.run.write_json("env.json", self.env)
            self.run.write_text("nvidia-smi-busy.txt", snapshot["text"])

    def epoch_done(self, record: dict, result: dict, global_step: int, scheduler, model) -> None:
        if self.writer is not None:
            _log_epoch(
                self.writer, record, record["step_losses"], record["step_accuracies"], global_step, result, scheduler
            )
        if self.histograms:
            t0 = time.perf_counter()
            _log_histograms(self.writer, unwrap(model), global_step)
            record["histogram_seconds"] = time.perf_counter() - t0  # what --histograms costs, per epoch

    def close(self, model, test_batches, global_step: int, wrong) -> None:
        if self.writer is not None:
            _log_images(self.writer, model, test_batches, global_step)
            self.writer.add_figure("test/misclassified", misclassified_figure(wrong, self.run.path.name), global_step)
            self.writer.close()


def _log_histograms(writer, model, step: int) -> None:
    """--histograms: each weight and its gradient of the epoch's last step (averaged over ranks: the one
    the optimizer applied), so a dying layer (weights collapsing, gradients vanishing) shows epoch by epoch."""
    for name, p in model.named_parameters():
        writer.add_histogram(f"weights/{name}", p.detach().float().cpu(), step)
        if p.grad is not None:
            writer.add_histogram(f"gradients/{name}", p.grad.detach().float().cpu(), step)


def _silent(*_args, **_kwargs) -> None:
    pass


def _live_accuracy(live_model, test_batches, device, precision, par) -> float:
    """With --ema, the live (not averaged) weights' test accuracy, for the log and metrics.jsonl."""
    par.broadcast_buffers(live_model)
    return evaluate(live_model, test_batches, device, precision, par=par)["test_accuracy"]


def _test_arrays(data, cfg: TrainConfig):
    """The raw test images and labels the run scored (the whole test set or its --test-subset)."""
    n = len(data.test_labels) if cfg.test_subset is None else min(cfg.test_subset, len(data.test_labels))
    return data.test_images[:n], data.test_labels[:n]


def _stop_if_diverged(losses: list[float], test_loss: float, epoch: int, cfg: TrainConfig, run: RunDir) -> None:
    """A NaN/inf loss ends the run before this epoch is recorded: its metrics and checkpoint would be
    NaN. Checked on the epoch's losses, already on the host (no extra sync per step); the test loss
    catches weights that blew up in the epoch's last update. Every rank sees the same (averaged) values."""
    bad_step = next((i for i, x in enumerate(losses) if not math.isfinite(x)), None)
    if bad_step is None and math.isfinite(test_loss):
        return
    what = (
        f"the training loss became {losses[bad_step]} at step {bad_step + 1} of epoch {epoch + 1}"
        if bad_step is not None
        else f"the weights became non-finite in epoch {epoch + 1} (test loss {test_loss})"
    )
    kept = (
        f"the checkpoint of epoch {epoch} is kept in {run.path}"
        if epoch > 0 and run.checkpoint.exists()
        else "no checkpoint was written"
    )
    raise TrainingDiverged(f"training diverged: {what} (--lr {cfg.lr:g} too high?); the run stopped, {kept}")


def _prepare(step: Step, s: _Parts) -> float:
    """The step's warm-up (compile, CUDA-graph capture, cuDNN autotuning) on the first batch of epoch 0,
    the model and optimizer left exactly as they were so the run stays deterministic; its seconds."""
    if not step.needs_prepare:
        return 0.0
    s.train_batches.set_epoch(0)
    x, y = next(iter(s.train_batches))
    return step.prepare(*to_device(x, y, s.device, s.channels_last))


def _log_graph(writer, model, example) -> None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # the tracer warns about LeNet5's input-shape check
            writer.add_graph(model, example)
    except Exception as e:  # tracing custom ops can fail; the graph is a nicety, not a result
        print(f"tensorboard: model graph skipped ({type(e).__name__})")


def _log_layout(writer) -> None:
    """TensorBoard's Custom Scalars tab: train and test curves of one quantity in one chart."""
    writer.add_custom_scalars(
        {
            "train vs test": {
                "accuracy (%)": ["Multiline", ["train/accuracy_epoch", "test/accuracy"]],
                "loss": ["Multiline", ["train/loss_epoch", "test/loss"]],
            }
        }
    )


def _log_epoch(writer, record, losses, accuracies, global_step, result, scheduler) -> None:
    first = global_step - len(losses) + 1
    for i, (loss, acc) in enumerate(zip(losses, accuracies)):
        writer.add_scalar("train/loss", loss, first + i)
        writer.add_scalar("train/accuracy", acc, first + i)  # of the step's (global) batch
    writer.add_scalar("train/loss_epoch", record["train_loss"], global_step)
    writer.add_scalar("train/accuracy_epoch", record["train_accuracy"], global_step)
    writer.add_scalar("train/lr", record["lr"], global_step)
    writer.add_scalar("test/loss", record["test_loss"], global_step)
    writer.add_scalar("test/accuracy", record["test_accuracy"], global_step)
    for c, acc in enumerate(result["per_class_accuracy"]):
        writer.add_scalar(f"test/class_accuracy/{c}", acc, global_step)
    writer.add_scalar("perf/images_per_s", record["images_per_s"], global_step)
    writer.flush()


@torch.no_grad()
def _log_images(writer, model, test_batches, global_step) -> None:
    """First-layer filters and feature maps of a few test digits: the handout's 'visualize intermediate layers'."""
    if not hasattr(model, "first_layer_maps"):  # --model linear/mlp: no conv layer to show
        return
    writer.add_image("layers/conv1_filters", image_grid(model.conv1.weight[:, 0]), global_step)
    x, _ = next(iter(test_batches))
    model.eval()
    maps = model.first_layer_maps(x[:4].contiguous())  # [4, 6, 28, 28]
    writer.add_image("layers/input_digits", image_grid(x[:4, 0]), global_step)
    writer.add_image("layers/conv1_feature_maps", image_grid(maps.flatten(0, 1), ncol=maps.shape[1]), global_step)
