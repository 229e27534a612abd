"""Random affine augmentation for whole batches, on whatever device the batch lives on.

The equivalent of torchvision's `RandomAffine(degrees=15, translate=(0.1, 0.1), scale=(0.8, 1.2))`:
per image, a rotation angle in [-15°, 15°], a shift of up to 10 % of the width/height in each
direction and a zoom in [0.8, 1.2], applied with one `affine_grid` + `grid_sample` call for the
whole batch (bilinear; torchvision's default is nearest and whole-pixel shifts, a deliberate
difference: smoother digits, same distribution of poses). Positive angles turn the image clockwise
on screen, torchvision's counter-clockwise; the angle is symmetric about 0, so the distributions match.

Parameters are drawn on the CPU from an explicitly seeded generator, so a given (seed, epoch)
produces the same transforms on every device and after a resume.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F

_STREAMS = {"shuffle": 0, "augment": 1}  # independent random streams derived from one seed


def seeded_generator(seed: int, *keys: int, stream: int = 0) -> torch.Generator:
    """A CPU generator seeded by a hash of (seed, *keys, stream), e.g. (seed, epoch) or (seed, epoch, index).

    numpy's SeedSequence mixes the integers, so nearby seeds/epochs give unrelated streams and the
    result is a pure function of its arguments (what makes resumed runs see the same randomness).
    """
    entropy = [int(k) % 2**64 for k in (seed, *keys, stream)]
    state = np.random.SeedSequence(entropy).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state))


def affine_matrices(n: int, generator: torch.Generator, degrees: float = 15.0, translate: float = 0.1,
                    scale: tuple[float, float] = (0.8, 1.2)) -> torch.Tensor:
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


def apply_affine(x: torch.Tensor, theta: torch.Tensor, fill: float = 0.0) -> torch.Tensor:
    """Warp a batch x [n, C, H, W] by matrices theta [n, 2, 3]; pixels from outside get `fill`."""
    theta = theta.to(device=x.device, dtype=x.dtype)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    # grid_sample pads with zeros; shifting by `fill` makes the padding the background value
    # (for normalized MNIST, black is -MEAN/STD, not 0).
    out = F.grid_sample(x - fill, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
    return out + fill


def random_affine(x: torch.Tensor, generator: torch.Generator, degrees: float = 15.0, translate: float = 0.1,
                  scale: tuple[float, float] = (0.8, 1.2), fill: float = 0.0) -> torch.Tensor:
    """RandomAffine(degrees, (translate, translate), scale) on every image of x [n, C, H, W]."""
    theta = affine_matrices(x.shape[0], generator, degrees, translate, scale)
    return apply_affine(x, theta, fill)
