"""Device loader, DataLoader path, epoch order, rank sharding and on-device augmentation."""

import math

import numpy as np
import pytest
import torch
from data_fixtures import tiny_arrays

from trainlab.data import MNIST, DeviceLoader, epoch_permutation, make_dataloader, random_affine
from trainlab.data.augment import affine_matrices, apply_affine, seeded_generator
from trainlab.data.mnist import BACKGROUND, MEAN, STD
from trainlab.errors import ConfigError


@pytest.fixture(scope="module")
def arrays():
    return tiny_arrays(n_train=103, n_test=20, seed=7)


def _collect(loader, epoch):
    loader.set_epoch(epoch)
    return [(x.clone(), y.clone()) for x, y in loader]


def test_epoch_permutation_is_a_pure_seeded_permutation():
    p = epoch_permutation(1000, seed=1, epoch=0)
    assert p.dtype == torch.int64 and sorted(p.tolist()) == list(range(1000))
    assert torch.equal(p, epoch_permutation(1000, seed=1, epoch=0))
    assert not torch.equal(p, epoch_permutation(1000, seed=1, epoch=1))
    assert not torch.equal(p, epoch_permutation(1000, seed=2, epoch=0))
    torch.manual_seed(123)  # the global RNG state must not matter (resume sees the same order)
    assert torch.equal(p, epoch_permutation(1000, seed=1, epoch=0))


def test_device_loader_batches(arrays):
    loader = DeviceLoader(arrays.train_images, arrays.train_labels, batch_size=16, device="cpu", seed=0)
    assert len(loader) == 7  # ceil(103 / 16)
    batches = _collect(loader, 0)
    assert [len(y) for _, y in batches] == [16] * 6 + [7]
    x, y = batches[0]
    assert x.shape == (16, 1, 28, 28) and x.dtype == torch.float32 and y.dtype == torch.int64
    # Each epoch is a permutation of the split, with labels still attached to their images.
    order = epoch_permutation(103, 0, 0)
    all_x = torch.cat([b[0] for b in batches])
    all_y = torch.cat([b[1] for b in batches])
    expected = (arrays.train_images[order.numpy()].astype(np.float64) / 255 - MEAN) / STD
    np.testing.assert_allclose(all_x[:, 0].numpy(), expected, rtol=0, atol=1e-6)
    assert all_y.tolist() == arrays.train_labels[order.numpy()].tolist()
    # Resuming at epoch 1 gives what an uninterrupted second epoch gives; epochs differ.
    again = DeviceLoader(arrays.train_images, arrays.train_labels, 16, "cpu", seed=0)
    e1, e1_again = _collect(loader, 1), _collect(again, 1)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(e1, e1_again))
    assert not torch.equal(e1[0][1], batches[0][1])


def test_drop_last_and_no_shuffle(arrays):
    loader = DeviceLoader(arrays.train_images, arrays.train_labels, 16, "cpu", shuffle=False, drop_last=True)
    batches = _collect(loader, 3)
    assert len(loader) == len(batches) == 6
    assert torch.cat([y for _, y in batches]).tolist() == arrays.train_labels[:96].tolist()


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_path_gives_identical_batches(arrays, workers):
    device = DeviceLoader(arrays.train_images, arrays.train_labels, 16, "cpu", seed=5)
    standard = make_dataloader(MNIST(arrays=arrays), 16, seed=5, workers=workers)
    assert len(standard) == len(device)
    for epoch in (0, 1):
        a, b = _collect(device, epoch), _collect(standard, epoch)
        assert len(a) == len(b)
        for (xa, ya), (xb, yb) in zip(a, b):
            assert torch.equal(xa, xb) and torch.equal(ya, yb)  # bit-identical, not just close


@pytest.mark.parametrize("augment", [False, True])
@pytest.mark.parametrize("world_size", [2, 3, 4, 5])
def test_rank_shards_concatenate_to_the_single_process_batch(arrays, world_size, augment):
    def loader(rank, ws):
        return DeviceLoader(
            arrays.train_images, arrays.train_labels, 12, "cpu", seed=9, augment=augment, rank=rank, world_size=ws
        )

    single = _collect(loader(0, 1), 2)
    shards = [_collect(loader(r, world_size), 2) for r in range(world_size)]
    # 103 = 8·12 + 7: with 4 ranks the last global batch (7 rows) still gives every rank a row;
    # 3 and 5 ranks do not divide 12: uneven shards, not an error.
    assert all(len(s) == len(single) for s in shards)
    for i, (x, y) in enumerate(single):
        assert torch.equal(torch.cat([s[i][1] for s in shards]), y)
        torch.testing.assert_close(torch.cat([s[i][0] for s in shards]), x, rtol=0, atol=1e-6)
        assert {len(s[i][1]) for s in shards} <= {len(y) // world_size, len(y) // world_size + 1}


@pytest.mark.parametrize("world_size", [1, 2, 3, 5])
def test_shard_weights_make_the_rank_average_the_global_mean(arrays, world_size):
    # Σ_r (w_r / W) · mean_r(v) = mean(v) over the global batch: what weighting each rank's loss by w_r buys.
    ranks = [
        DeviceLoader(arrays.train_images, arrays.train_labels, 12, "cpu", shuffle=False, rank=r, world_size=world_size)
        for r in range(world_size)
    ]
    single = [y.double() for _, y in DeviceLoader(arrays.train_images, arrays.train_labels, 12, "cpu", shuffle=False)]
    weights = [r.shard_weights() for r in ranks]
    shards = [[y.double() for _, y in r] for r in ranks]
    for step, y in enumerate(single):
        combined = sum(weights[r][step] / world_size * shards[r][step].mean() for r in range(world_size))
        assert combined.item() == pytest.approx(y.mean().item(), rel=1e-12)
    if world_size in (1, 2):
        assert all(w == 1.0 for ws in weights for w in ws[:-1])  # even shards: exactly 1, nothing rescaled
    else:
        assert any(w != 1.0 for ws in weights for w in ws)


def test_last_batch_smaller_than_world_size_is_dropped():
    a = tiny_arrays(n_train=26)  # 2 full batches of 12 and a last batch of 2 rows
    ranks = [DeviceLoader(a.train_images, a.train_labels, 12, "cpu", rank=r, world_size=4) for r in range(4)]
    assert all(len(r) == 2 for r in ranks) and all(len(list(r)) == 2 for r in ranks)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=3, world_size=4), "--batch-size 3 is smaller than the world size 4"),
        (dict(batch_size=0), "--batch-size must be a positive integer"),
        (dict(batch_size=8, rank=2, world_size=2), "rank 2 is not valid"),
    ],
)
def test_bad_loader_config(arrays, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DeviceLoader(arrays.train_images, arrays.train_labels, device="cpu", **kwargs)


def test_bad_dataloader_config(arrays):
    with pytest.raises(ConfigError, match="--workers"):
        make_dataloader(MNIST(arrays=arrays), 8, workers=-1)


# ----------------------------------------------------------------------------- augmentation


def test_augmentation_shape_dtype_changes_and_reproducible(arrays):
    def batches(seed, epoch):
        loader = DeviceLoader(arrays.train_images, arrays.train_labels, 32, "cpu", seed=seed, augment=True)
        return _collect(loader, epoch)

    plain = _collect(DeviceLoader(arrays.train_images, arrays.train_labels, 32, "cpu", seed=1), 0)
    a, b = batches(1, 0), batches(1, 0)
    for (xa, ya), (xb, yb), (xp, yp) in zip(a, b, plain):
        assert xa.shape == xp.shape and xa.dtype == torch.float32
        assert torch.equal(ya, yp)  # labels untouched, order unchanged
        assert torch.equal(xa, xb)  # same seed and epoch → same pixels
        changed = (xa - xp).abs().amax(dim=(1, 2, 3)) > 0.1
        assert changed.all()  # every image moved
    assert not torch.equal(batches(1, 1)[0][0], a[0][0])
    assert not torch.equal(batches(2, 0)[0][0], a[0][0])


def test_identity_parameters_leave_images_unchanged():
    x = torch.randn(5, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    y = random_affine(x, torch.Generator().manual_seed(0), degrees=0.0, translate=0.0, scale=(1.0, 1.0))
    torch.testing.assert_close(y, x, rtol=0, atol=1e-5)


def test_translation_matches_a_pixel_shift():
    # Independent reference: shifting right by 2 px and down by 3 px is a roll with background fill.
    x = torch.randn(2, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    theta = torch.tensor([[1.0, 0.0, -2 * 2 / 28], [0.0, 1.0, -2 * 3 / 28]]).expand(2, 2, 3)
    y = apply_affine(x, theta, fill=-7.0)
    expected = torch.full_like(x, -7.0)
    expected[..., 3:, 2:] = x[..., :-3, :-2]
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-5)


def test_rotation_by_90_degrees_matches_rot90():
    # output(x, y) samples input(y, -x): a quarter turn, which torch.rot90 computes independently.
    x = torch.randn(1, 1, 28, 28, generator=torch.Generator().manual_seed(0))
    y = apply_affine(x, torch.tensor([[[0.0, 1.0, 0.0], [-1.0, 0.0, 0.0]]]))
    torch.testing.assert_close(y, torch.rot90(x, k=-1, dims=(2, 3)), rtol=0, atol=1e-4)


def test_background_stays_background():
    black = torch.full((8, 1, 28, 28), BACKGROUND)
    y = random_affine(black, torch.Generator().manual_seed(0), fill=BACKGROUND)
    torch.testing.assert_close(y, black, rtol=0, atol=1e-6)


def test_parameter_ranges():
    theta = affine_matrices(4000, seeded_generator(0, 0), degrees=15.0, translate=0.1, scale=(0.8, 1.2)).double()
    inv = theta[:, :, :2]
    zoom = 1 / inv.det().sqrt()
    angle = torch.atan2(inv[:, 0, 1], inv[:, 0, 0]).rad2deg()
    shift = -(torch.linalg.inv(inv) @ theta[:, :, 2:]).squeeze(-1) * 28 / 2  # in pixels
    assert 0.8 <= zoom.min() < 0.81 and 1.19 < zoom.max() <= 1.2
    assert -15 <= angle.min() < -14.9 and 14.9 < angle.max() <= 15
    assert -2.8 <= shift.min() < -2.75 and 2.75 < shift.max() <= 2.8
    assert math.isclose(float(angle.mean()), 0.0, abs_tol=0.5)


@pytest.mark.gpu
@pytest.mark.parametrize("augment", [False, True])
def test_cuda_loader_matches_cpu(augment):
    a = tiny_arrays(n_train=5000)  # > one normalization chunk on the device path

    def run(device):
        loader = DeviceLoader(a.train_images, a.train_labels, 512, device, seed=4, augment=augment)
        return _collect(loader, 1)

    for (xc, yc), (xg, yg) in zip(run("cpu"), run("cuda")):
        assert xg.device.type == "cuda" and torch.equal(yc, yg.cpu())
        if augment:  # same transforms (drawn on the CPU); grid_sample arithmetic differs slightly
            torch.testing.assert_close(xg.cpu(), xc, rtol=0, atol=1e-4)
        else:
            assert torch.equal(xg.cpu(), xc)


def test_dataloader_augmentation_varies_by_epoch_through_a_subset(arrays):
    ds = torch.utils.data.Subset(MNIST(arrays=arrays, augment=True, seed=2), range(50))
    loader = make_dataloader(ds, 10, seed=2)
    e0, e0_again, e1 = _collect(loader, 0), _collect(loader, 0), _collect(loader, 1)
    assert sum(len(y) for _, y in e0) == 50
    assert all(torch.equal(a[0], b[0]) for a, b in zip(e0, e0_again))
    assert not torch.equal(e0[0][0], e1[0][0])
    # Same samples, same epoch → same per-sample transforms regardless of the batch they land in.
    shuffled_off = make_dataloader(ds, 25, shuffle=False, seed=2)
    shuffled_off.set_epoch(0)
    x_all = torch.cat([x for x, _ in shuffled_off])
    order = epoch_permutation(50, 2, 0)
    torch.testing.assert_close(torch.cat([x for x, _ in e0]), x_all[order], rtol=0, atol=0)
