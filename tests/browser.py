"""Render a report page in headless Chromium (Debian's `chromium`) and measure what overflows the page.

Shared by the report and lab tests. `chromium_or_skip` waits for the install `.ci/run` runs in the
background, installs Chromium with apt-get where it is still missing and that is possible (root, a
package index, network), and otherwise skips the test, saying why. The measuring script goes into a
copy of the page, never into the report itself."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
]

# After every image has loaded: each table, figure, image and code block must end inside the page,
# unless it sits in a horizontal scroll wrapper (.scroll, which scrolls itself); the page itself must
# never scroll sideways.
MEASURE = """<script>
window.addEventListener('load', () => {
  const W = document.documentElement.clientWidth, bad = [];
  for (const el of document.querySelectorAll('table, img, figure, pre, .scroll, h1, h2, h3, h4, p, ul')) {
    const box = el.getBoundingClientRect(), wrap = el.parentElement && el.parentElement.closest('.scroll');
    if (!wrap && box.right > W + 1) bad.push(el.tagName + ' ends at ' + Math.round(box.right) + ' px > ' + W + ': '
                                             + (el.textContent || el.getAttribute('src') || '').slice(0, 60));
    if (el.tagName === 'IMG' && !(el.naturalWidth > 0)) bad.push('IMG not loaded: ' + el.getAttribute('src'));
  }
  const sw = document.documentElement.scrollWidth;
  if (sw > W + 1) bad.push('the page scrolls sideways: ' + sw + ' px > ' + W);
  const out = document.createElement('pre');
  out.id = 'overflow-result';
  // the page's height with every <details> closed, as it first shows
  out.textContent = JSON.stringify({width: W, bad: bad, height: document.documentElement.scrollHeight});
  document.body.appendChild(out);
});
</script>"""


CI_INSTALL_WAIT_S = 900.0  # .ci/run's background `apt-get install chromium` took 2 min 22 s on the 2-core box


def chromium_or_skip() -> str:
    done = os.environ.get("TRAINLAB_CI_CHROMIUM_DONE")  # .ci/run installs Chromium in the background
    deadline = time.monotonic() + CI_INSTALL_WAIT_S
    while done and not os.path.exists(done) and time.monotonic() < deadline:
        time.sleep(1)
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe:
        return exe
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(
            "headless Chromium is not installed and cannot be installed here (needs root and apt-get): "
            "apt-get install chromium"
        )
    try:
        proc = subprocess.run(
            ["apt-get", "install", "-y", "-q", "chromium"],
            capture_output=True,
            text=True,
            timeout=600,
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
        )
    except subprocess.TimeoutExpired:
        pytest.skip("headless Chromium is not installed and apt-get install chromium timed out")
    exe = shutil.which("chromium")
    if proc.returncode != 0 or not exe:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        pytest.skip(f"headless Chromium is not installed and apt-get install chromium failed: {tail[0]}")
    return exe


def overflow(page: Path, width: int = 1000, height: int = 900) -> dict:
    """{"width": the viewport's width in CSS px, "bad": what overflows, "height": the page's height in CSS
    px} for `page` in a `width`×`height` window."""
    exe = chromium_or_skip()
    probe = page.with_name(".overflow_probe.html")
    probe.write_text(page.read_text().replace("</body>", MEASURE + "</body>"))
    try:
        with tempfile.TemporaryDirectory(prefix="chromium_") as profile:
            proc = subprocess.run(
                [
                    exe,
                    *FLAGS,
                    f"--user-data-dir={profile}",
                    f"--window-size={width},{height}",
                    "--virtual-time-budget=10000",
                    "--dump-dom",
                    probe.resolve().as_uri(),
                ],
                capture_output=True,
                text=True,
                timeout=180,
            )
    finally:
        probe.unlink()
    m = re.search(r'<pre id="overflow-result">(.*?)</pre>', proc.stdout, re.S)
    assert m, f"Chromium printed no measurement (exit {proc.returncode}): {proc.stderr[-1500:]}"
    return json.loads(m.group(1).replace("&quot;", '"').replace("&gt;", ">").replace("&lt;", "<").replace("&amp;", "&"))


def screenshot(page: Path, png: Path, width: int = 1100, height: int = 3000) -> Path:
    exe = chromium_or_skip()
    with tempfile.TemporaryDirectory(prefix="chromium_") as profile:
        subprocess.run(
            [
                exe,
                *FLAGS,
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                f"--screenshot={png}",
                page.resolve().as_uri(),
            ],
            capture_output=True,
            timeout=180,
            check=True,
        )
    return png
