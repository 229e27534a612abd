"""Generic distributed machinery, used by both workloads (LeNet data parallel, GPT strategies).

launch (JSON spec → `trainlab worker` under torchrun, process groups with timeouts, teardown) ·
failure (a failed collective → one line) · wrappers (the one `unwrap`, DDP, gradient-sync control) ·
spawn (N CPU processes for the tests).
"""
