"""Elastic distortion (Simard et al. 2003): field statistics, the blur against conv2d, determinism, sharding."""

import math

import pytest
import torch
import torch.nn.functional as F
from data_fixtures import collect_epoch as _collect
from data_fixtures import tiny_arrays

from trainlab.data import MNIST, DeviceLoader, make_dataloader
from trainlab.data.augment import (
    Distortion,
    affine_matrices,
    apply_affine,
    elastic_displacement,
    gaussian_blur_matrix,
    gaussian_kernel1d,
    identity_matrices,
    seeded_generator,
)
from trainlab.errors import ConfigError


@pytest.fixture(scope="module")
def arrays():
    return tiny_arrays(n_train=70, n_test=10, seed=11)


def test_gaussian_kernel_is_normalized_with_the_right_width():
    k = gaussian_kernel1d(4.0, dtype=torch.float64)
    assert len(k) == 25 and math.isclose(float(k.sum()), 1.0, rel_tol=1e-12)
    t = torch.arange(-12, 13, dtype=torch.float64)
    variance = float((k * t**2).sum())
    assert variance == pytest.approx(16.0, rel=0.02)  # σ² = 16, a little less after truncation at 3σ


def test_blur_matrices_equal_a_zero_padded_separable_conv2d():
    # Independent reference: conv2d with the 1-D kernel along each axis, zero padding.
    noise = torch.rand(6, 1, 28, 28, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    k = gaussian_kernel1d(4.0, dtype=torch.float64)
    r = (len(k) - 1) // 2
    ref = F.conv2d(F.conv2d(noise, k.view(1, 1, 1, -1), padding=(0, r)), k.view(1, 1, -1, 1), padding=(r, 0))
    m = gaussian_blur_matrix(28, 4.0).double()
    torch.testing.assert_close(m @ noise @ m.T, ref, rtol=0, atol=1e-6)


def test_field_statistics_match_the_theory():
    alpha, sigma = 34.0, 4.0
    d = elastic_displacement(4000, 28, 28, alpha, sigma, seeded_generator(0, 0)).double()
    assert d.shape == (4000, 28, 28, 2)
    # Interior pixels (the blur kernel fits inside): uniform[-1, 1] noise has variance 1/3 and a 2-D
    # separable blur k⊗k scales it by (Σk²)², so std = α·sqrt(1/3)·Σk² (≈1.37 px for α=34, σ=4).
    k = gaussian_kernel1d(sigma, dtype=torch.float64)
    expected_std = alpha * math.sqrt(1 / 3) * float((k**2).sum())
    interior = d[:, 12:16, 12:16]
    assert float(interior.std()) == pytest.approx(expected_std, rel=0.03)
    assert abs(float(interior.mean())) < 0.1  # ~6 standard errors of the mean
    # Smooth: neighbouring displacements are strongly correlated (white noise would give ~0).
    a, b = d[:, 14, 14, 0], d[:, 14, 15, 0]
    assert float(torch.corrcoef(torch.stack([a, b]))[0, 1]) > 0.95
    # x and y fields are independent.
    assert abs(float(torch.corrcoef(torch.stack([d[:, 14, 14, 0], d[:, 14, 14, 1]]))[0, 1])) < 0.06
    # The field scales linearly with α.
    d1 = elastic_displacement(3, 28, 28, alpha, sigma, seeded_generator(0, 1))
    d2 = elastic_displacement(3, 28, 28, 2 * alpha, sigma, seeded_generator(0, 1))
    torch.testing.assert_close(d2, 2 * d1)


def test_constant_displacement_is_a_pixel_shift():
    # out(p) = in(p + d): d = (+2, +3) px samples 2 to the right and 3 below, moving the digit left and up.
    x = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    d = torch.tensor([2.0, 3.0]).expand(2, 28, 28, 2)
    y = apply_affine(x, identity_matrices(2), fill=-7.0, displacement=d)
    expected = torch.full_like(x, -7.0)
    expected[..., :-3, :-2] = x[..., 3:, 2:]
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-4)  # float32 sampling of values offset by the fill


def test_zero_displacement_leaves_images_unchanged():
    x = torch.randn(3, 1, 28, 28, generator=torch.Generator().manual_seed(1))
    y = apply_affine(x, identity_matrices(3), displacement=torch.zeros(3, 28, 28, 2))
    torch.testing.assert_close(y, x, rtol=0, atol=1e-5)


def test_device_loader_elastic_is_seeded_by_seed_and_epoch(arrays):
    def batches(seed, epoch, affine=False):
        loader = DeviceLoader(
            arrays.train_images,
            arrays.train_labels,
            32,
            "cpu",
            seed=seed,
            augment=Distortion(affine=affine, elastic_alpha=34.0),
        )
        return _collect(loader, epoch)

    plain = _collect(DeviceLoader(arrays.train_images, arrays.train_labels, 32, "cpu", seed=1), 0)
    a = batches(1, 0)
    torch.manual_seed(99)  # the global RNG must not matter: a resumed run draws the same fields
    b = batches(1, 0)
    for (xa, ya), (xb, _), (xp, yp) in zip(a, b, plain):
        assert torch.equal(ya, yp) and torch.equal(xa, xb)
        assert ((xa - xp).abs().amax(dim=(1, 2, 3)) > 0.1).all()  # every image distorted
    assert not torch.equal(batches(1, 1)[0][0], a[0][0])
    assert not torch.equal(batches(2, 0)[0][0], a[0][0])
    # With the affine too: the same fields, one grid_sample; differs from affine alone and elastic alone.
    both = batches(1, 0, affine=True)
    affine_only = _collect(DeviceLoader(arrays.train_images, arrays.train_labels, 32, "cpu", seed=1, augment=True), 0)
    assert not torch.equal(both[0][0], a[0][0]) and not torch.equal(both[0][0], affine_only[0][0])


@pytest.mark.parametrize("world_size", [2, 4])
def test_elastic_rank_shards_concatenate_to_the_single_process_batch(arrays, world_size):
    def loader(rank, ws):
        return DeviceLoader(
            arrays.train_images,
            arrays.train_labels,
            12,
            "cpu",
            seed=9,
            rank=rank,
            world_size=ws,
            augment=Distortion(affine=True, degrees=10.0, elastic_alpha=20.0),
        )

    single = _collect(loader(0, 1), 2)
    shards = [_collect(loader(r, world_size), 2) for r in range(world_size)]
    for i, (x, y) in enumerate(single):
        torch.testing.assert_close(torch.cat([s[i][0] for s in shards]), x, rtol=0, atol=1e-6)
        assert torch.equal(torch.cat([s[i][1] for s in shards]), y)


def test_dataset_path_elastic_is_per_sample_and_reproducible(arrays):
    elastic = Distortion(elastic_alpha=34.0)
    ds = MNIST(arrays=arrays, augment=elastic, seed=3)
    plain = MNIST(arrays=arrays)
    x0, x0_again = ds[5][0], MNIST(arrays=arrays, augment=elastic, seed=3)[5][0]
    assert torch.equal(x0, x0_again) and not torch.equal(x0, plain[5][0])
    ds.set_epoch(1)
    assert not torch.equal(ds[5][0], x0)
    # The same sample gets the same field whatever batch it lands in.
    loader = make_dataloader(MNIST(arrays=arrays, augment=elastic, seed=3), 10, shuffle=False)
    loader.set_epoch(0)
    assert torch.equal(next(iter(loader))[0][5], x0)


@pytest.mark.parametrize("affine, alpha", [(True, 0.0), (False, 34.0), (True, 34.0)])
def test_probability_leaves_the_other_images_untouched(arrays, affine, alpha):
    def epoch(p):
        loader = DeviceLoader(
            arrays.train_images,
            arrays.train_labels,
            16,
            "cpu",
            seed=5,
            augment=Distortion(affine=affine, elastic_alpha=alpha, p=p),
        )
        return torch.cat([x for x, _ in _collect(loader, 3)])

    plain = torch.cat(
        [x for x, _ in _collect(DeviceLoader(arrays.train_images, arrays.train_labels, 16, "cpu", seed=5), 3)]
    )
    always, half = epoch(1.0), epoch(0.5)
    untouched = (half - plain).abs().amax(dim=(1, 2, 3)) < 1e-4  # identity grid_sample: float rounding only
    assert 0.3 < float(untouched.float().mean()) < 0.7  # about half, drawn per image
    # The distorted half is distorted exactly as with p=1 (same matrices and fields), the rest is the input.
    torch.testing.assert_close(half[~untouched], always[~untouched], rtol=0, atol=1e-6)
    assert (((always - plain).abs().amax(dim=(1, 2, 3))) > 1e-3).all()
    # The Dataset path draws the same way per sample.
    ds, ds_plain = (
        MNIST(arrays=arrays, augment=Distortion(affine=affine, elastic_alpha=alpha, p=0.5), seed=5),
        MNIST(arrays=arrays),
    )
    same = [torch.equal(ds[i][0], ds_plain[i][0]) for i in range(len(ds))]
    assert 0.3 < sum(same) / len(same) < 0.7


def test_affine_ranges_are_the_distortion_s():
    # A narrower Distortion draws from the narrower ranges (the same uniform numbers, rescaled).
    wide = Distortion(affine=True).matrices(2000, seeded_generator(0, 0)).double()
    narrow = (
        Distortion(affine=True, degrees=5.0, translate=0.05, scale=0.1).matrices(2000, seeded_generator(0, 0)).double()
    )
    assert torch.equal(wide.float(), affine_matrices(2000, seeded_generator(0, 0)))  # the defaults are the old ranges
    angle = torch.atan2(narrow[:, 0, 1], narrow[:, 0, 0]).rad2deg()
    zoom = 1 / narrow[:, :, :2].det().sqrt()
    assert -5 <= angle.min() < -4.9 and 4.9 < angle.max() <= 5
    assert 0.9 <= zoom.min() < 0.91 and 1.09 < zoom.max() <= 1.1


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(elastic_alpha=-1.0), "--elastic-alpha -1"),
        (dict(elastic_alpha=34.0, elastic_sigma=0.0), "--elastic-sigma 0"),
        (dict(elastic_alpha=float("inf")), "--elastic-alpha inf"),
        (dict(degrees=-1.0), "--augment-degrees -1"),
        (dict(translate=1.5), "--augment-translate 1.5"),
        (dict(scale=float("nan")), "--augment-scale nan"),
        (dict(p=0.0), "--augment-p 0"),
    ],
)
def test_bad_distortion_parameters_name_the_flag(kwargs, needle):
    with pytest.raises(ConfigError, match=needle):
        Distortion(affine=True, **kwargs)
