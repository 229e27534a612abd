"""MNIST data: IDX reading/writing, sources and cache, a Dataset, and fast device-resident batches;
Fashion-MNIST (`fashion_mnist`, same arrays) and `datasets.load_dataset` for `--dataset`.

    from trainlab.data import load_mnist, DeviceLoader
    arrays = load_mnist()                       # embedded real MNIST (or load_mnist(data_dir=...))
    loader = DeviceLoader(arrays.train_images, arrays.train_labels, 512, "cuda", seed=0)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for x, y in loader: ...
"""

import importlib

# name → its module, imported on first use: `trainlab.data.fetch` (and the CLI's --help) must not pay for
# torch, which the loaders and the augmentation import
_EXPORTS = {
    "random_affine": "augment",
    "read_idx": "idx",
    "write_idx": "idx",
    "DeviceLoader": "loader",
    "EpochSampler": "loader",
    "epoch_permutation": "loader",
    "make_dataloader": "loader",
    "MEAN": "mnist",
    "MNIST": "mnist",
    "STD": "mnist",
    "MNISTArrays": "mnist",
    "load_mnist": "mnist",
    "normalize": "mnist",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'trainlab.data' has no attribute {name!r}")
    return getattr(importlib.import_module(f"trainlab.data.{_EXPORTS[name]}"), name)
