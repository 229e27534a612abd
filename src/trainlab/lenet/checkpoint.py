"""Checkpoints: atomic save every epoch, load for --resume and `trainlab eval`.

A checkpoint is data, not code: it holds tensors and plain values only (the config as a plain dict),
and is loaded with `torch.load(weights_only=True)`, which refuses to unpickle anything else — a
crafted `checkpoint.pt` cannot run code here. Everything read from it is checked before use, so a
foreign or damaged checkpoint is one line naming what differs (a missing entry, a layer whose shape
does not fit, BatchNorm on one side only), not a traceback from deep inside `load_state_dict`.

Resuming with a different `--epochs` rebuilds the LR schedule for the new length and continues it at
the checkpoint's step (the optimizer state, the weights and the data order carry over unchanged); the
remaining epochs then follow the schedule of the new length, so the result differs from a run started
with that length (it equals it when the length is unchanged).
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import torch

from trainlab.distributed.wrappers import unwrap
from trainlab.errors import ConfigError, UserError
from trainlab.io import atomic_torch_save, check_input
from trainlab.lenet.config import TrainConfig
from trainlab.schema import MAX_SECONDS, between, check

SECONDS = between(0, MAX_SECONDS, "a number of seconds")

FORMAT = "trainlab.lenet.v1"
# entry → the type every checkpoint of FORMAT has there
_ENTRIES = {
    "model": dict,
    "optimizer": dict,
    "scheduler": dict,
    "epochs_done": int,
    "global_step": int,
    "history": list,
    "train_seconds": (int, float),
    "config": dict,
}
_HISTORY_NUMBERS = ("epoch", "test_accuracy", "train_seconds", "images_per_s")  # what a resumed run reads back


def save_checkpoint(
    path: Path,
    *,
    model,
    optimizer,
    scheduler,
    epoch: int,
    global_step: int,
    history: list[dict],
    train_seconds: float,
    config: dict,
    ema: dict | None = None,
    grad_scaler: dict | None = None,
) -> None:
    """`ema` (an `EMA.state_dict()`, with --ema) is stored beside the live weights so a resume is exact;
    so is `grad_scaler` (fp16's `GradScaler.state_dict()`: the loss scale it has found and its growth
    counter), or a resumed fp16 run would start over at 65536 and skip steps finding the scale again."""
    atomic_torch_save(
        path,
        {  # into a claimed run directory (RunDir vetted it)
            "format": FORMAT,
            "model": unwrap(model).state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "epochs_done": epoch,
            "global_step": global_step,
            "history": history,
            "train_seconds": train_seconds,
            "config": config,
            "ema": ema,
            "grad_scaler": grad_scaler,
        },
    )


def load_checkpoint(path: str | Path) -> dict:
    path = Path(path)
    if path.is_dir():
        path = path / "checkpoint.pt"
    if not path.exists():
        hint = (
            " (the run stopped before its first epoch ended; start it again with --overwrite)"
            if (path.parent / "config.json").exists()
            else ""
        )
        raise UserError(f"{path}: checkpoint not found{hint}")
    check_input(path)  # a FIFO would block torch.load forever
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated, not a torch file, or refused by the weights-only unpickler
        code = re.search(r"Unsupported global: GLOBAL (\S+)", str(e))
        if code:
            raise UserError(
                f"{path}: refused: it holds Python objects besides tensors and plain values (it would "
                f"import and call {code.group(1)}), which trainlab never writes: another program's file, "
                "or crafted; nothing in it was run"
            ) from None
        reason = str(e).split("WeightsUnpickler error:")[-1].strip().splitlines() or [""]
        raise UserError(f"{path}: not a readable checkpoint ({type(e).__name__}: {reason[0][:160]})") from None
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        bare = isinstance(ckpt, dict) and ckpt and all(isinstance(v, torch.Tensor) for v in ckpt.values())
        raise UserError(
            f"{path}: not a trainlab LeNet checkpoint (missing format {FORMAT!r}"
            + ("; it looks like a bare state_dict)" if bare else ")")
        )
    for key, typ in _ENTRIES.items():
        if not isinstance(ckpt.get(key), typ) or isinstance(ckpt.get(key), bool):
            found = "missing" if key not in ckpt else f"a {type(ckpt[key]).__name__}"
            raise UserError(f"{path}: damaged checkpoint: entry {key!r} is {found}, expected a {_type_name(typ)}")
    epochs = ckpt["config"].get("epochs")
    if not (isinstance(epochs, int) and 0 <= ckpt["epochs_done"] <= epochs) or ckpt["global_step"] < 0:
        raise UserError(
            f"{path}: damaged checkpoint: epochs_done {ckpt['epochs_done']} and global_step "
            f"{ckpt['global_step']} (expected 0 <= epochs_done <= the config's epochs {epochs}, global_step >= 0)"
        )
    for i, record in enumerate(ckpt["history"]):
        if not (isinstance(record, dict) and all(isinstance(record.get(k), (int, float)) for k in _HISTORY_NUMBERS)):
            raise UserError(f"{path}: damaged checkpoint: history[{i}] lacks the numbers {', '.join(_HISTORY_NUMBERS)}")
        check(record["train_seconds"], SECONDS, f"{path}: damaged checkpoint", f"history[{i}]['train_seconds']")
    # the summary adds to it: NaN or 1e308 would cost a whole epoch and then fail (schema bounds)
    check(ckpt["train_seconds"], SECONDS, f"{path}: damaged checkpoint", "'train_seconds'")
    ema = ckpt.get("ema")
    if ema is not None and not (
        isinstance(ema, dict)
        and isinstance(ema.get("model"), dict)
        and isinstance(ema.get("decay"), float)
        and isinstance(ema.get("updates"), int)
    ):
        raise UserError(
            f"{path}: damaged checkpoint: entry 'ema' must hold decay, updates and the averaged weights "
            "under 'model' (or be absent)"
        )
    return ckpt


def _type_name(typ) -> str:
    return " or ".join(t.__name__ for t in typ) if isinstance(typ, tuple) else typ.__name__


def checkpoint_config(ckpt: dict, path) -> TrainConfig:
    """The checkpoint's own config, type-checked and validated like a command line."""
    cfg = TrainConfig.from_dict(ckpt["config"], source=f"{path} [config]")
    try:
        cfg.validate()
    except ConfigError as e:
        raise ConfigError(f"{path} [config]: {e}") from None
    return cfg


def load_model_state(model: torch.nn.Module, state: dict, path) -> None:
    """`model.load_state_dict(state)`, after checking that it fits: one line naming every difference."""
    want = unwrap(model).state_dict()
    if not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()):
        raise UserError(f"{path}: damaged checkpoint: 'model' must map parameter names to tensors")
    odd = [f"{k} ({v.layout})" for k, v in state.items() if str(v.layout) != "torch.strided"]  # sparse, mkldnn, …
    if odd:  # load_state_dict would fail deep inside copy_ (sparse into dense)
        raise UserError(f"{path}: damaged checkpoint: {', '.join(odd[:3])}: expected dense tensors, as trainlab writes")
    problems = []
    bn_ckpt, bn_model = (any(k.endswith("running_mean") for k in d) for d in (state, want))
    if bn_ckpt != bn_model:
        problems.append(
            f"the checkpoint was trained {'with' if bn_ckpt else 'without'} BatchNorm, the model is "
            f"built {'with' if bn_model else 'without'} it"
        )
    else:
        missing = [k for k in want if k not in state]
        unexpected = [k for k in state if k not in want]
        shapes = [
            f"{k} {list(state[k].shape)} vs {list(want[k].shape)}"
            for k in want
            if k in state and state[k].shape != want[k].shape
        ]
        for label, items in (("missing", missing), ("unexpected", unexpected), ("shape (checkpoint vs model)", shapes)):
            if items:
                problems.append(
                    f"{label}: {', '.join(items[:4])}{f' and {len(items) - 4} more' if len(items) > 4 else ''}"
                )
    if problems:
        raise UserError(f"{path}: the checkpoint does not fit this LeNet-5: {'; '.join(problems)}")
    unwrap(model).load_state_dict(state)


def restore_checkpoint(
    ckpt: dict, cfg: TrainConfig, model, optimizer, scheduler, run, steps_per_epoch: int, log=print, ema=None
) -> tuple[int, int, list[dict], float]:
    """Put a resumed run back where its checkpoint left it → (epochs done, global step, history, seconds).

    The checkpoint must come from this run's config (fields that decide the result identical); a
    different --epochs rebuilds the schedule (module docstring)."""
    path = run.checkpoint
    saved = checkpoint_config(ckpt, path)
    differ = cfg.result_differences(saved)
    if differ:
        raise UserError(
            f"{path}: written by a different config than {run.file('config.json')}: "
            + ", ".join(f"{k} {getattr(saved, k)!r} vs {getattr(cfg, k)!r}" for k in differ)
        )
    done, step = ckpt["epochs_done"], ckpt["global_step"]
    # the most optimizer steps `done` epochs can take (a batch-size warm-up takes smaller, so more, steps)
    most = done * steps_per_epoch * -(-cfg.batch_size // min(cfg.batch_size, cfg.warmup_batch_size or cfg.batch_size))
    if step > most:
        raise UserError(
            f"{path}: damaged checkpoint: global_step {step} after {done} epoch(s) of at most "
            f"{steps_per_epoch} steps (expected <= {most})"
        )
    if done > cfg.epochs or (done == cfg.epochs and run.file("summary.json").exists()):
        raise ConfigError(
            f"--resume {run.path}: the run has done {done} of {saved.epochs} epochs"
            + (" and is complete" if done == cfg.epochs else "")
            + f"; pass --epochs N with N > {done} to extend it"
        )
    load_model_state(model, ckpt["model"], path)
    if ema is not None:  # the same --ema (checked above), so the checkpoint holds the average
        load_model_state(ema.module, ckpt["ema"]["model"], path)  # checked: one line naming any mismatch
        ema.load_state_dict(ckpt["ema"])
    try:
        optimizer.load_state_dict(ckpt["optimizer"])
    except (ValueError, KeyError, TypeError, RuntimeError) as e:
        raise UserError(
            f"{path}: the optimizer state does not fit this run's optimizer ({cfg.optimizer}): "
            f"{str(e).splitlines()[0] if str(e) else type(e).__name__}"
        ) from None
    if saved.epochs == cfg.epochs:
        scheduler.load_state_dict(ckpt["scheduler"])
    else:
        _fast_forward(scheduler, step)
        log(
            f"resume: --epochs {cfg.epochs} (was {saved.epochs}): the LR schedule is rebuilt for {cfg.epochs} epochs "
            f"({cfg.epochs * steps_per_epoch} steps) and continues at step {step}"
        )
    return done, step, ckpt["history"], float(ckpt["train_seconds"])


def restore_grad_scaler(scaler, state: dict | None, path, log=print) -> None:
    """Put fp16's loss scale back (`save_checkpoint(grad_scaler=...)`); a checkpoint from before it was
    saved, or from a run without fp16, says so and the scaler starts over."""
    if scaler is None:
        return
    if not isinstance(state, dict) or not isinstance(state.get("scale"), (int, float)):
        log(
            f"resume: {path} holds no GradScaler state (written before trainlab saved it): the fp16 loss scale starts over"
        )
        return
    scaler.load_state_dict(state)


def _fast_forward(scheduler, steps: int) -> None:
    """Advance a freshly built schedule to `steps` (the LRs are closed-form in the step count, so this
    sets exactly the LR, and OneCycle's momentum, an uninterrupted run of this length has there)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "lr_scheduler.step() before optimizer.step()": no training here
        for _ in range(steps):
            scheduler.step()
