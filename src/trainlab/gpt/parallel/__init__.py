"""GPT parallel strategies, one module each (picotron-style), applied by `gpt.engine.GPTEngine`.

zero1 (ZeroRedundancyOptimizer) · fsdp (zero2/zero3/offload with FSDP2) · tensor (DTensor TP) ·
pipeline (GPipe/1F1B) · amp (bf16/fp16) · nvme (DeepSpeed ZeRO-Infinity, optional). Plain DDP is the
generic `distributed.wrappers.wrap_ddp`; names and checks live in `gpt.strategy`.
"""
