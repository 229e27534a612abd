"""MNIST data: IDX reading/writing, sources and cache, a Dataset, and fast device-resident batches;
Fashion-MNIST (`fashion_mnist`, same arrays) and `datasets.load_dataset` for `--dataset`.

    from trainlab.data import load_mnist, DeviceLoader
    arrays = load_mnist()                       # embedded real MNIST (or load_mnist(data_dir=...))
    loader = DeviceLoader(arrays.train_images, arrays.train_labels, 512, "cuda", seed=0)
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        for x, y in loader: ...
"""

from trainlab.data.augment import random_affine
from trainlab.data.idx import read_idx, write_idx
from trainlab.data.loader import DeviceLoader, EpochSampler, epoch_permutation, make_dataloader
from trainlab.data.mnist import MEAN, MNIST, STD, MNISTArrays, load_mnist, normalize

__all__ = [
    "MEAN",
    "STD",
    "MNIST",
    "MNISTArrays",
    "load_mnist",
    "normalize",
    "read_idx",
    "write_idx",
    "DeviceLoader",
    "EpochSampler",
    "epoch_permutation",
    "make_dataloader",
    "random_affine",
]
