"""Telemetry: environment capture, TensorBoard, GPU sampler, progress, run directory."""
