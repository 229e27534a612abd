"""LeNet-5 training: the loop (train.loop), its parts (train.setup), evaluation and checkpoints."""
