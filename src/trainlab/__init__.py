"""trainlab: train neural networks fast and measure what each acceleration technique buys."""

__version__ = "0.1.0"
