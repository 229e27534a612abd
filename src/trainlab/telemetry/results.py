"""The one writer of benchmark results: `<stem>.json`, `<stem>.md` and `<stem>.log` side by side.

Every result carries its evidence (modded-nanogpt's habit): the JSON holds the command and the
environment next to the data, the Markdown starts with the command and the machine, and the log is
the raw text the run printed, headed by the command. Each file is written atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainlab.io import atomic_write_json, atomic_write_text
from trainlab.results.kinds import stamp
from trainlab.telemetry.env import collect_env

# The columns of `trainlab dp compare`'s rows that the lab report tabulates: one list, because a mode whose
# run wrote no row is filled in with each of them (empty) by lenet/compare.py, and the report (which imports
# no workload) reads them here.
DP_COMPARE_COLUMNS = (
    "mode",
    "world_size",
    "loader",
    "workers",
    "epoch_seconds",
    "images_per_s",
    "data_ms",
    "compute_ms",
    "comm_ms",
    "comm_overlapped",
    "test_accuracy",
    "status",
)


def machine_line(env: dict) -> str:
    gpus = f", GPU {', '.join(env['gpus'])}" if env.get("gpus") else ", no GPU"
    return f"{env['cpu']} ({env['cpu_count']} cores){gpus}; torch {env['torch']}; {env['time_utc']}"


def write_results(
    out_dir: str | Path,
    stem: str,
    data: Any,
    markdown: str,
    log_lines: list[str],
    command: str,
    *,
    kind: str,
    plan: dict,
    device=None,
    env: dict | None = None,
) -> dict[str, str]:
    """Write out_dir/<stem>.json ({kind, schema, plan, command, env, **data}, a list of rows as
    `rows`: `results.kinds.stamp`), .md and .log."""
    out = Path(out_dir)
    env = env if env is not None else collect_env(device)
    payload = stamp(
        kind, {"command": command, "env": env, **(data if isinstance(data, dict) else {"rows": data})}, plan
    )
    header = f"Command: `{command}`  \nMachine: {machine_line(env)}\n\n"
    paths = {
        "json": atomic_write_json(out / f"{stem}.json", payload),
        "md": atomic_write_text(out / f"{stem}.md", header + markdown.rstrip("\n") + "\n"),
        "log": atomic_write_text(
            out / f"{stem}.log", "\n".join([f"$ {command}", f"# {machine_line(env)}", *log_lines]) + "\n"
        ),
    }
    return {k: str(v) for k, v in paths.items()}
