"""Figures shared by TensorBoard (written during a run) and the report (drawn from the run directory).

Built on `matplotlib.figure.Figure` directly, not pyplot: no global figure state and no display
backend, so a training process can draw one without side effects.
"""

from __future__ import annotations

import numpy as np


def digit_grid_figure(images: np.ndarray, titles: list[str], ncol: int = 9, title: str | None = None):
    """A grid of grayscale images [N, H, W] (uint8 or float), each captioned with its title."""
    from matplotlib.figure import Figure

    n = len(images)
    ncol = max(1, min(ncol, n))
    nrow = max(1, (n + ncol - 1) // ncol)
    fig = Figure(figsize=(0.95 * ncol, 1.1 * nrow + (0.35 if title else 0.0)))
    for i in range(nrow * ncol):
        ax = fig.add_subplot(nrow, ncol, i + 1)
        ax.set_axis_off()
        if i < n:
            ax.imshow(images[i], cmap="gray_r", interpolation="nearest")
            ax.set_title(titles[i], fontsize=8, pad=2)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.subplots_adjust(left=0.01, right=0.99, bottom=0.01, top=0.90 if title else 0.95, wspace=0.08, hspace=0.35)
    return fig


def misclassified_figure(examples: dict, name: str = ""):
    """The grid of a run's `misclassified.npz` (lenet/misclassified.py), each image captioned true→predicted."""
    titles = [f"{t}→{p}" for t, p in zip(examples["label"], examples["predicted"])]
    shown, total = len(examples["index"]), int(examples["total"])
    head = f"{name}: " if name else ""
    return digit_grid_figure(
        examples["image"],
        titles,
        title=f"{head}{total} of {int(examples['tested']):,} test images misclassified"
        f"{f' (first {shown} shown)' if shown < total else ''}, true→predicted",
    )
