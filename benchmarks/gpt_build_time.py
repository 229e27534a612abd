"""Build time of a GPT-2 model before and after building on the target device (issue 18).

before (ours): GPT(cfg) on the CPU — nn.Linear/Embedding draw their default init — then our
               deterministic init drawn on the CPU and copied in, then .to(device);
before (HF):   GPT2LMHeadModel(cfg) on the CPU — HF draws its own init — then our init converted and
               loaded, then .to(device);
after:         `build_gpt` / `build_hf_model(device=...)`: the module on the meta device, uninitialised
               storage on the device, our init drawn once, on the device.
On a CPU "after" saves the default/HF init that "before" drew and threw away; on a GPU it also moves
the one remaining fill from the CPU's single-threaded generator to the GPU's.

    python benchmarks/gpt_build_time.py --models gpt2-medium --device cpu --out /tmp/r
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import add_output_args, check_output, save  # noqa: E402

from trainlab.device import synchronize  # noqa: E402
from trainlab.gpt.model import (
    GPT,
    _canonical_param_names,
    build_gpt,
    build_hf_model,
    gpt_state_dict_to_hf,
    hf_config,
    init_gpt_weights,
    initial_value,
)
from trainlab.gpt.shape import count_params, get_preset


def before_ours(cfg, device):
    model = GPT(cfg)
    init_gpt_weights(model, 0)
    return model.to(device)


def before_hf(cfg, device):
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel(hf_config(cfg))
    ours = {name: initial_value(cfg, name, 0) for name, _ in _canonical_param_names(cfg)}
    model.load_state_dict(gpt_state_dict_to_hf(ours), strict=False)
    model.tie_weights()
    return model.to(device)


VARIANTS = {
    "ours, before": before_ours,
    "ours, after": lambda cfg, device: build_gpt(cfg, 0, device),
    "HF, before": before_hf,
    "HF, after": lambda cfg, device: build_hf_model(cfg, seed=0, device=device),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="gpt2-medium", help="comma-separated presets")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=1, help="rounds, the variants interleaved in each")
    ap.add_argument("--name", default="gpt_build_time")
    add_output_args(ap)
    args = ap.parse_args()
    check_output(args.out, args.name, force=args.force)
    device = torch.device(args.device)
    rows, log = [], []
    for model_name in args.models.split(","):
        cfg = get_preset(model_name)
        for r in range(args.repeats):
            for variant, build in VARIANTS.items():
                gc.collect()
                t0 = time.perf_counter()
                model = build(cfg, device)
                synchronize(device)
                seconds = time.perf_counter() - t0
                checksum = float(next(model.parameters()).detach().double().sum())
                del model
                rows.append(
                    {
                        "model": model_name,
                        "params": count_params(cfg),
                        "variant": variant,
                        "round": r,
                        "device": str(device),
                        "build_seconds": seconds,
                        "first_param_sum": checksum,
                    }
                )
                line = f"{model_name:<12} {variant:<14} round {r}: {seconds:7.2f} s"
                print(line, flush=True)
                log.append(line)
    # the least disturbed round: on a shared machine a build is only ever slowed down by the others
    md = ["| model | parameters | variant | build time (s, fastest round) |", "|---|---|---|---|"]
    for model_name in args.models.split(","):
        for variant in VARIANTS:
            xs = sorted(r["build_seconds"] for r in rows if r["model"] == model_name and r["variant"] == variant)
            params = next(r["params"] for r in rows if r["model"] == model_name)
            md.append(f"| {model_name} | {params:,} | {variant} | {xs[0]:.2f} |")
    save(args.name, rows, "\n".join(md), log, device=device, out=args.out)


if __name__ == "__main__":
    main()
