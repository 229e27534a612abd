"""Our operators, each a ladder of five rungs (ops/ladder.py: aten, python, cpp, triton, cuda):
gelu (gelu.py), conv2d (conv.py), max_pool2d (pool.py), linear (linear.py), relu (relu.py); one
check (check.py), one benchmark (bench.py), one build for the C++/CUDA extensions (build.py).

    from trainlab.ops import gelu, GELU, IMPLS
    y = gelu(x, impl="cpp", approximate="none")

The C++ extensions and Triton are built or imported only when their rung is used.
"""

from trainlab.ops.gelu import APPROXIMATIONS, GELU, IMPLS, GeluFunction, gelu

__all__ = ["gelu", "GELU", "IMPLS", "APPROXIMATIONS", "GeluFunction"]
