"""Figures shared by TensorBoard (written during a run) and the report (drawn from the run directory).

Built on `matplotlib.figure.Figure` directly, not pyplot: no global figure state and no display
backend, so a training process can draw one without side effects.
"""

from __future__ import annotations

import numpy as np


def digit_grid_figure(images: np.ndarray, titles: list[str], ncol: int = 9, title: str | None = None):
    """A grid of grayscale images [N, H, W] (uint8 or float), each captioned with its title.

    Drawn as one mosaic in one axes, each tile scaled to its own range as an image of its own would be:
    an axes per image (36 for a run's misclassified digits) took ~0.5 s of CPU to lay out and draw, in
    every training run's last TensorBoard write and every report."""
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    images = np.asarray(images, dtype=np.float64)
    n = len(images)
    ncol = max(1, min(ncol, n))
    nrow = max(1, (n + ncol - 1) // ncol)
    h, w = images.shape[1:3] if n else (28, 28)
    gap, caption = max(1, w // 8), max(1, h // 3)  # pixels between tiles; the caption's band above each tile
    cell_h, cell_w = h + caption, w + gap
    mosaic = np.full((nrow * cell_h, ncol * cell_w - gap), np.nan)  # NaN: the page's white
    for i, image in enumerate(images):
        low, high = image.min(), image.max()
        r, c = divmod(i, ncol)
        top, left = r * cell_h + caption, c * cell_w
        mosaic[top : top + h, left : left + w] = (image - low) / (high - low) if high > low else 0.0
    fig = Figure(figsize=(0.95 * ncol, 1.1 * nrow + (0.35 if title else 0.0)))
    ax = fig.add_axes((0.01, 0.01, 0.98, (0.90 if title else 0.97) - 0.01))
    ax.set_axis_off()
    cmap = colormaps["gray_r"].with_extremes(bad="white")
    ax.imshow(np.ma.masked_invalid(mosaic), cmap=cmap, vmin=0.0, vmax=1.0, interpolation="nearest")
    for i, text in enumerate(titles[:n]):
        r, c = divmod(i, ncol)
        ax.text(c * cell_w + w / 2, r * cell_h + caption - 1.5, text, ha="center", va="bottom", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
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
