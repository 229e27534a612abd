"""A report page printed to PDF by headless Chromium (Debian's `chromium`): the file a student hands in.

Chromium is not a Python dependency: where it is missing, `write_pdf` raises one line saying what to
install, and the HTML report stands as it is. The page prints as it shows, folded details folded."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from trainlab.errors import UserError
from trainlab.io import atomic_write_bytes

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-pdf-header-footer",
    "--virtual-time-budget=10000",
]
TIMEOUT_S = 180


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def no_chromium(then: str) -> UserError:
    return UserError(f"--pdf: no headless Chromium on PATH (Debian/Ubuntu: apt-get install chromium); {then}")


def write_pdf(page: Path, pdf: Path | None = None) -> Path:
    """Print `page` (an index.html) to `pdf` (default: report.pdf beside it); returns the PDF's path."""
    page = Path(page).resolve()
    pdf = page.with_name("report.pdf") if pdf is None else Path(pdf).resolve()
    exe = chromium()
    if exe is None:
        raise no_chromium(f"the HTML report is written: {page}")
    with tempfile.TemporaryDirectory(prefix="trainlab_chromium_") as tmp:
        printed = Path(tmp) / "page.pdf"  # printed aside, then written in one step (and recorded as trainlab's)
        try:
            proc = subprocess.run(
                [exe, *FLAGS, f"--user-data-dir={Path(tmp) / 'profile'}", f"--print-to-pdf={printed}", page.as_uri()],
                capture_output=True,
                text=True,
                timeout=TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise UserError(
                f"--pdf: Chromium did not print {page} within {TIMEOUT_S} s; the HTML report is written"
            ) from None
        data = printed.read_bytes() if printed.exists() else b""
    if data[:5] != b"%PDF-":
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or [f"exit {proc.returncode}"]
        raise UserError(f"--pdf: Chromium wrote no PDF for {page}: {tail[0][:200]}")
    return atomic_write_bytes(pdf, data)
