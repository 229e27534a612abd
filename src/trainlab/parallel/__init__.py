"""Parallel training strategies, one module each (picotron-style), behind one engine.

launch (process groups, torchrun relaunch, test spawner) · strategy (names, '+' composition,
validation before launch) · engine (GPTEngine: one train step for every strategy) · ddp · zero1 ·
fsdp (zero2/zero3/offload with FSDP2) · tensor (DTensor TP) · pipeline (GPipe/1F1B) · amp · nvme
(DeepSpeed ZeRO-Infinity, optional). The LeNet comparison (`trainlab dp`) reuses launch and ddp.
"""
