"""Report figures with matplotlib's Agg backend (no display needed). Each returns the PNG's path."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from trainlab.io import atomic_write_bytes  # noqa: E402
from trainlab.telemetry.figures import misclassified_figure  # noqa: E402

MISCLASSIFIED_FILE = "misclassified.npz"  # written by the trainer (lenet/misclassified.py)


def _figure(width: float, height: float):
    """A figure whose layout engine keeps titles, labels and legends inside it (constrained layout:
    no clipped titles, no legend spilling over the axes)."""
    return plt.subplots(figsize=(width, height), layout="constrained")


def _title(ax, text: str, width: int = 60) -> None:
    """A title wrapped to the figure's width instead of running off its edges."""
    import textwrap

    from trainlab.text import shown

    text = shown(text)  # the text gate: a file name's control characters or lone surrogates as escapes
    ax.set_title("\n".join(textwrap.wrap(text, width)) or text, fontsize=10)


def _save(fig, path: Path) -> Path:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())
    return path


def loss_curves(run, path: Path) -> Path | None:
    steps, losses = [], []
    for rec in run.epochs:
        first = rec["global_step"] - len(rec.get("step_losses", [])) + 1
        for i, loss in enumerate(rec.get("step_losses", [])):
            steps.append(first + i)
            losses.append(loss)
    if not run.epochs:
        return None
    fig, ax = _figure(6.4, 3.6)
    if losses:
        ax.plot(steps, losses, lw=0.6, alpha=0.5, label="train loss (per step)")
    ax.plot(
        [r["global_step"] for r in run.epochs],
        [r["train_loss"] for r in run.epochs],
        "o-",
        label="train loss (epoch mean)",
    )
    ax.plot([r["global_step"] for r in run.epochs], [r["test_loss"] for r in run.epochs], "s-", label="test loss")
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy")
    _title(ax, f"{run.name}: loss")
    ax.legend(loc="best", fontsize=8)
    ax.grid(alpha=0.3)
    return _save(fig, path)


def accuracy_curve(run, path: Path) -> Path | None:
    """Test accuracy per epoch next to the running training accuracy (per epoch, and per step faintly)."""
    if not run.epochs:
        return None
    fig, ax = _figure(6.4, 3.6)
    steps_per_epoch = [len(r.get("step_accuracies") or []) for r in run.epochs]
    if all(steps_per_epoch):
        x, y = [], []
        for rec, n in zip(run.epochs, steps_per_epoch):
            first = rec["epoch"] - 1
            x += [first + (i + 1) / n for i in range(n)]
            y += rec["step_accuracies"]
        ax.plot(x, y, lw=0.5, alpha=0.35, color="#4c72b0", label="train accuracy (per step, its batch)")
    epochs = [r["epoch"] for r in run.epochs]
    if any("train_accuracy" in r for r in run.epochs):
        # a mean over the epoch's steps, so it belongs to the middle of the epoch, not its end
        ax.plot(
            [e - 0.5 for e in epochs],
            [r.get("train_accuracy") for r in run.epochs],
            "o-",
            color="#4c72b0",
            label="train accuracy (epoch mean, at mid-epoch)",
        )
    ax.plot(
        epochs, [r["test_accuracy"] for r in run.epochs], "s-", color="#dd8452", label="test accuracy (end of epoch)"
    )
    ax.axhline(99.0, color="gray", ls="--", lw=0.8)
    top = [r["test_accuracy"] for r in run.epochs] + [
        r["train_accuracy"] for r in run.epochs if r.get("train_accuracy") is not None
    ]
    ax.set_ylim(max(0.0, min(min(top) - 1.0, 97.0)), 100.2)
    ax.set_xlabel("epoch")
    ax.set_ylabel("accuracy (%)")
    _title(ax, f"{run.name}: accuracy")
    ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    return _save(fig, path)


def per_class_bars(run, path: Path) -> Path:
    acc = run.summary["per_class_accuracy"]
    fig, ax = _figure(6.4, 3.2)
    ax.bar(range(len(acc)), acc, color="#4c72b0")
    ax.set_xticks(range(len(acc)))
    ax.set_ylim(min(acc) - 1.0, 100.0)
    ax.set_xlabel("digit")
    ax.set_ylabel("accuracy (%)")
    _title(ax, f"{run.name}: per-class test accuracy")
    return _save(fig, path)


def confusion(run, path: Path) -> Path:
    import numpy as np

    cm = np.array(run.summary["confusion_matrix"])
    fig, ax = _figure(5.0, 4.4)
    off = cm.copy()
    np.fill_diagonal(off, 0)  # the diagonal dwarfs the errors; colour the errors
    im = ax.imshow(off, cmap="Reds")
    for i in range(cm.shape[0]):
        for j in range(cm.shape[1]):
            ax.text(j, i, str(cm[i, j]), ha="center", va="center", fontsize=7, color="black" if i != j else "#1f4e9c")
    ax.set_xlabel("predicted")
    ax.set_ylabel("true")
    ax.set_xticks(range(10))
    ax.set_yticks(range(10))
    _title(ax, f"{run.name}: confusion matrix (errors coloured)")
    fig.colorbar(im, ax=ax, fraction=0.046)
    return _save(fig, path)


def gpu_timeline(run, path: Path) -> Path | None:
    """Every GPU of the run on one time axis: utilization above, memory below, one line per (rank,
    device), so nn.DataParallel's idle replicas and DDP's even load are visible side by side."""
    if not run.gpu:
        return None
    lines: dict[tuple, list[dict]] = {}
    for r in run.gpu:
        lines.setdefault((r.get("rank"), r.get("gpu")), []).append(r)
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(6.4, 4.6), sharex=True, layout="constrained")
    for (rank, gpu), rows in sorted(lines.items(), key=lambda kv: (kv[0][0] or 0, kv[0][1] or 0)):
        label = (f"rank {rank:g} " if rank is not None else "") + (f"cuda:{gpu:g}" if gpu is not None else "GPU")
        t = [r["time_s"] for r in rows]
        ax.plot(t, [r["utilization_pct"] for r in rows], label=label, lw=1.2)
        ax2.plot(t, [r["memory_used_mib"] for r in rows], label=label, lw=1.2)
    ax.set_ylabel("utilization (%)")
    ax.set_ylim(0, 105)
    ax2.set_ylabel("memory used (MiB)")
    ax2.set_xlabel("time since the rank's sampler started (s)")
    ax.legend(fontsize=7, ncol=min(4, len(lines)), loc="lower right")
    _title(ax, f"{run.name}: every GPU (NVML, ~10 Hz)")
    return _save(fig, path)


def bars(
    labels: list[str], values: list[float], path: Path, title: str, ylabel: str, errors: list[float] | None = None
) -> Path:
    fig, ax = _figure(min(9.0, max(5.0, 0.7 * len(labels) + 2)), 3.6)
    ax.bar(range(len(values)), values, yerr=errors, capsize=3, color="#4c72b0")
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(ylabel)
    _title(ax, title)
    ax.grid(axis="y", alpha=0.3)
    return _save(fig, path)


def misclassified_grid(run, path: Path) -> Path | None:
    """The run's misclassified test images (its misclassified.npz), captioned true→predicted."""
    f = Path(run.path) / MISCLASSIFIED_FILE
    if not f.exists():
        return None
    examples = load_misclassified(f)
    if not len(examples["index"]):
        return None
    return _save(misclassified_figure(examples, run.name), path)


MISCLASSIFIED_MAX_BYTES = 16 * 2**20  # the trainer keeps at most a few hundred 28×28 images


def load_misclassified(f: Path) -> dict:
    """A run's misclassified.npz, read capped and checked: a damaged or crafted file is one `UserError`
    line (the report shows it in place of the figure), never a traceback from the plot."""
    import io
    import zipfile

    import numpy as np

    from trainlab.errors import UserError
    from trainlab.io import read_capped

    data = read_capped(f, MISCLASSIFIED_MAX_BYTES, "a misclassified.npz")
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            ex = {k: z[k] for k in ("index", "image", "label", "predicted", "total", "tested")}
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as e:
        raise UserError(f"{f}: not a trainlab misclassified.npz ({type(e).__name__}: {str(e)[:80]})") from None
    n = len(ex["index"]) if ex["index"].ndim == 1 else -1
    ok = (
        n >= 0
        and ex["image"].ndim in (3, 4)
        and len(ex["image"]) == n
        and ex["image"].shape[-1] <= 64
        and ex["label"].shape == (n,)
        and ex["predicted"].shape == (n,)
        and ex["total"].size == 1
        and ex["tested"].size == 1
        and all(np.issubdtype(ex[k].dtype, np.integer) for k in ("index", "label", "predicted", "total", "tested"))
        and n <= 1000
    )
    if not ok:
        raise UserError(f"{f}: not a trainlab misclassified.npz (its arrays' shapes or types differ)")
    return ex


def sweep_lines(key: str, series: dict[str, list], path: Path, metric: str = "test accuracy (%)") -> Path:
    """`metric` against the values of one swept flag, one line per combination of the other flags,
    error bars ±1 sd over seeds. Categorical values (optimizer names) are spaced evenly."""
    values = []
    for points in series.values():
        values += [v for v, *_ in points if v not in values]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    log = numeric and len(values) > 2 and min(values) > 0 and max(values) / min(values) >= 20
    fig, ax = _figure(6.4, 3.6)
    for k, (label, points) in enumerate(series.items()):
        # categories (optimizer names) have no order to draw a line along: markers, nudged apart
        nudge = 0.0 if numeric else 0.06 * (k - (len(series) - 1) / 2)
        xs = [p[0] if numeric else values.index(p[0]) + nudge for p in points]
        ax.errorbar(
            xs,
            [p[1] for p in points],
            yerr=[p[2] for p in points],
            fmt="o-" if numeric else "o",
            capsize=3,
            label=f"{label} (n={'/'.join(str(p[3]) for p in points)})",
        )
    if not numeric:
        ax.set_xticks(range(len(values)))
        ax.set_xticklabels([str(v) for v in values])
        ax.set_xlim(-0.5, len(values) - 0.5)
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(key)
    ax.set_ylabel(metric)
    _title(ax, f"{metric} against {key} (mean ± sd over seeds)")
    ax.grid(alpha=0.3)
    # below the axes, in the figure: many series never cover the points
    fig.legend(loc="outside lower center", fontsize=7, ncols=min(3, max(1, len(series))))
    return _save(fig, path)
