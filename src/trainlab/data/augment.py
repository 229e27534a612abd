"""Random affine augmentation for whole batches, on whatever device the batch lives on.

The equivalent of torchvision's `RandomAffine(degrees=15, translate=(0.1, 0.1), scale=(0.8, 1.2))`:
per image, a rotation angle in [-15°, 15°], a shift of up to 10 % of the width/height in each
direction and a zoom in [0.8, 1.2], applied with one `affine_grid` + `grid_sample` call for the
whole batch (bilinear; torchvision's default is nearest and whole-pixel shifts, a deliberate
difference: smoother digits, same distribution of poses). Positive angles turn the image clockwise
on screen, torchvision's counter-clockwise; the angle is symmetric about 0, so the distributions match.

Parameters are drawn on the CPU from an explicitly seeded generator, so a given (seed, epoch)
produces the same transforms on every device and after a resume.

Elastic distortion (Simard, Steinkraus & Platt, ICDAR 2003, §2): every pixel gets a random
displacement, uniform in [-1, 1] per axis, the field is smoothed by a Gaussian of width σ and scaled
by α (pixels); the paper's MNIST values are α = 34, σ = 4. The field is added to the affine sampling
grid, so affine and elastic cost one `grid_sample`. Its noise is drawn on the batch's device (a field
per image is 2·28·28 numbers, too many to draw for a whole epoch on the CPU and copy over) from a
generator seeded by (seed, epoch, batch): reproducible and resumable on a given device type, but CPU
and CUDA draw different fields (different generators).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from trainlab.errors import ConfigError

# Independent random streams derived from one seed; the device loader and the Dataset path share them,
# so both draw the same order, transforms and elastic fields.
SHUFFLE_STREAM, AUGMENT_STREAM, ELASTIC_STREAM = 0, 1, 2


@dataclass(frozen=True)
class Distortion:
    """What training augmentation does to each image: a random affine and/or an elastic distortion.

    The affine draws a rotation in ±`degrees`, a shift of up to `translate`·width/height and a zoom in
    [1 − `scale`, 1 + `scale`]; `elastic_alpha` > 0 adds Simard's elastic field (α, σ in pixels).
    Each image is distorted with probability `p`; the others pass unchanged. Every resampled image is
    slightly blurred by the bilinear interpolation while the test digits are crisp, so a share of
    untouched images keeps the training distribution anchored to the test one.
    """

    affine: bool = False
    degrees: float = 15.0
    translate: float = 0.1
    scale: float = 0.2
    elastic_alpha: float = 0.0
    elastic_sigma: float = 4.0
    p: float = 1.0

    def __post_init__(self):
        checks = [
            ("degrees", self.degrees, 0 <= self.degrees <= 180, "an angle in [0, 180]"),
            ("translate", self.translate, 0 <= self.translate < 1, "a fraction of the image in [0, 1)"),
            ("scale", self.scale, 0 <= self.scale < 1, "a zoom fraction in [0, 1)"),
            (
                "elastic-alpha",
                self.elastic_alpha,
                math.isfinite(self.elastic_alpha) and self.elastic_alpha >= 0,
                "a displacement scale >= 0 in pixels (0 = off)",
            ),
            (
                "elastic-sigma",
                self.elastic_sigma,
                math.isfinite(self.elastic_sigma) and self.elastic_sigma > 0,
                "a Gaussian width > 0 in pixels",
            ),
            ("p", self.p, 0 < self.p <= 1, "a probability in (0, 1]"),
        ]
        for name, value, ok, expected in checks:
            if not ok:  # NaN fails every comparison, so it lands here too
                raise ConfigError(
                    f"--{'augment-' if name in ('degrees', 'translate', 'scale', 'p') else ''}{name} {value:g}: "
                    f"expected {expected}"
                )

    @classmethod
    def of(cls, augment: bool | Distortion) -> Distortion:
        """`True` → the default affine; `False` → nothing; a Distortion → itself."""
        return augment if isinstance(augment, Distortion) else cls(affine=bool(augment))

    @property
    def enabled(self) -> bool:
        return self.affine or self.elastic_alpha > 0

    def matrices(self, n: int, generator: torch.Generator) -> torch.Tensor:
        return affine_matrices(n, generator, self.degrees, self.translate, (1 - self.scale, 1 + self.scale))

    def selected(self, n: int, generator: torch.Generator) -> torch.Tensor | None:
        """Which of n images get distorted (bool [n], drawn after the matrices), or None when all do."""
        return torch.rand(n, generator=generator) < self.p if self.p < 1 else None


def seeded_generator(seed: int, *keys: int, stream: int = 0, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on `device` seeded by a hash of (seed, *keys, stream), e.g. (seed, epoch) or (seed, epoch, index).

    numpy's SeedSequence mixes the integers, so nearby seeds/epochs give unrelated streams and the
    result is a pure function of its arguments (what makes resumed runs see the same randomness).
    """
    entropy = [int(k) % 2**64 for k in (seed, *keys, stream)]
    state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator(device=device).manual_seed(int(state))


def affine_matrices(
    n: int,
    generator: torch.Generator,
    degrees: float = 15.0,
    translate: float = 0.1,
    scale: tuple[float, float] = (0.8, 1.2),
) -> torch.Tensor:
    """n random `affine_grid` matrices [n, 2, 3] (float32, CPU) mapping output to input coordinates."""
    u = torch.rand(n, 4, generator=generator, dtype=torch.float64)
    angle = (u[:, 0] * 2 - 1) * math.radians(degrees)
    # affine_grid works in [-1, 1] coordinates, so a shift of `translate`·width is 2·translate there.
    shift = (u[:, 1:3] * 2 - 1) * (2 * translate)
    zoom = scale[0] + u[:, 3] * (scale[1] - scale[0])
    # Forward map: p_out = zoom·R(angle)·p_in + shift. affine_grid wants the inverse:
    # p_in = R(-angle)/zoom · (p_out - shift).
    cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
    inv = torch.stack([torch.stack([cos, sin], -1), torch.stack([-sin, cos], -1)], -2)  # [n, 2, 2]
    offset = -(inv @ shift.unsqueeze(-1))  # [n, 2, 1]
    return torch.cat([inv, offset], dim=-1).float()


def gaussian_kernel1d(sigma: float, device=None, dtype=torch.float32) -> torch.Tensor:
    """A normalized 1-D Gaussian of standard deviation `sigma`, truncated at 3σ (radius ≥ 1)."""
    radius = max(1, math.ceil(3 * sigma))
    t = torch.arange(-radius, radius + 1, device=device, dtype=torch.float64)
    k = torch.exp(-0.5 * (t / sigma) ** 2)
    return (k / k.sum()).to(dtype)


def elastic_displacement(
    n: int, height: int, width: int, alpha: float, sigma: float, generator: torch.Generator, device=None
) -> torch.Tensor:
    """n random displacement fields [n, H, W, 2] in pixels, (dx, dy) per output pixel (Simard et al. 2003).

    Uniform noise in [-1, 1] per pixel and axis, smoothed by a separable Gaussian of width σ with zero
    padding (scipy's `gaussian_filter(mode="constant")`, as the common implementations do), times α.
    """
    noise = torch.rand(n, 2, height, width, generator=generator, device=device) * 2 - 1
    # The separable blur with zero padding is a banded matrix on each side: rows·noise·colsᵀ, two
    # small batched matmuls (~10× faster on a CPU than conv2d with a 1×25 kernel on one channel).
    rows = gaussian_blur_matrix(height, sigma, device=noise.device)
    cols = gaussian_blur_matrix(width, sigma, device=noise.device)
    smooth = rows @ noise @ cols.T
    return (alpha * smooth).permute(0, 2, 3, 1)


@functools.lru_cache(maxsize=16)  # the same few (size, σ, device) every batch: build each once (never mutated)
def gaussian_blur_matrix(size: int, sigma: float, device=None) -> torch.Tensor:
    """[size, size] matrix M with (M @ v)[i] = Σ_j k[j − i] v[j]: a 1-D Gaussian blur of v, zeros outside."""
    k = gaussian_kernel1d(sigma, device=device)
    r = (len(k) - 1) // 2
    offset = torch.arange(size, device=device).view(1, -1) - torch.arange(size, device=device).view(-1, 1)  # j − i
    inside = offset.abs() <= r
    return torch.where(inside, k[(offset + r).clamp(0, len(k) - 1)], torch.zeros((), device=device))


def apply_affine(
    x: torch.Tensor, theta: torch.Tensor, fill: float = 0.0, displacement: torch.Tensor | None = None
) -> torch.Tensor:
    """Warp a batch x [n, C, H, W] by matrices theta [n, 2, 3]; pixels from outside get `fill`.

    `displacement` [n, H, W, 2] (pixels, from `elastic_displacement`) moves each output pixel's sampling
    point further, in the input's frame: out(p) = in(A·p + d(p)).
    """
    theta = theta.to(device=x.device, dtype=x.dtype)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    if displacement is not None:
        # grid_sample's coordinates span [-1, 1] over W (resp. H) pixels: one pixel is 2/W.
        # Python scalars, not a tensor built on the host: no host→device copy (and GPU sync) per batch.
        d = displacement.to(x.dtype)
        grid = grid + torch.stack((d[..., 0] * (2.0 / x.shape[-1]), d[..., 1] * (2.0 / x.shape[-2])), dim=-1)
    # grid_sample pads with zeros; shifting by `fill` makes the padding the background value
    # (for normalized MNIST, black is -MEAN/STD, not 0).
    out = F.grid_sample(x - fill, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out + fill


def identity_matrices(n: int) -> torch.Tensor:
    """n identity `affine_grid` matrices [n, 2, 3] (elastic distortion without the affine)."""
    return torch.eye(2, 3).expand(n, 2, 3)


def random_affine(
    x: torch.Tensor,
    generator: torch.Generator,
    degrees: float = 15.0,
    translate: float = 0.1,
    scale: tuple[float, float] = (0.8, 1.2),
    fill: float = 0.0,
) -> torch.Tensor:
    """RandomAffine(degrees, (translate, translate), scale) on every image of x [n, C, H, W]."""
    theta = affine_matrices(x.shape[0], generator, degrees, translate, scale)
    return apply_affine(x, theta, fill)
