"""LeNet-5 on MNIST: `trainlab train|eval|dp`.

config (TrainConfig, presets) · model (LeNet5) · models (`--model`: linear … resnet18, FLOPs) · activations (registry, incl. our GELU ops) · setup
(optimizer, schedule, precision) · batches · loop (the training loop, top to bottom) · evaluate ·
checkpoint · data_parallel (how the loop runs under nn.DataParallel, DDP or the hand-written
all-reduce and ring: allreduce, ring) · shard_weights (`--shard-weights`: uneven devices) · compare (`trainlab dp compare`) · cli.
"""
