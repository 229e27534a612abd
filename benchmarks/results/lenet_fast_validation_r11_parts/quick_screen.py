"""Issue 40, round 7: the quick screen that picked what round 7 ran on every seed (kept as it ran).

One line per candidate: `--preset fast` as it stood (at 68433e1, batch 128 with max-pooling, for the first
block of quick_screen.txt; batch 192 with average pooling for the second) with the candidate's fields set over
it, trained on the first 50,000 training images and scored on the last 10,000 (the validation split, as
benchmarks/lenet_accuracy.py --holdout 10000), fp32 on one CPU thread, over the weakest seeds of the preset
then, stopping at the first below 99 %. Run from the repository root, two at a time:

    PYTHONPATH=src python benchmarks/results/lenet_fast_validation_r11_parts/quick_screen.py LABEL JSON SEEDS
"""

import json
import sys
import tempfile

import torch

from trainlab.lenet.config import TrainConfig, apply_preset
from trainlab.lenet.loop import train

torch.set_num_threads(1)
label, over, seeds = sys.argv[1], json.loads(sys.argv[2]), [int(s) for s in sys.argv[3].split(",")]
accs = []
for seed in seeds:
    explicit = {**over, "holdout": 10000}
    cfg = apply_preset(
        TrainConfig(device="cpu", seed=seed, progress=False, tensorboard=False, **explicit),
        "fast",
        explicit=set(explicit),
    )
    cfg.validate()
    with tempfile.TemporaryDirectory() as d:
        cfg.out = d
        s = train(cfg, log=lambda line: None)
    accs.append(s["test_accuracy"])
    if s["test_accuracy"] < 99:
        break
print(f"{label:40s} {json.dumps(over)}  " + " ".join(f"{seed}:{a:.2f}" for seed, a in zip(seeds, accs)), flush=True)
