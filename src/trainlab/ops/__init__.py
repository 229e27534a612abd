"""Our operators, one folder each (ops/registry.py lists them): gelu, conv2d, max_pool2d, linear,
relu, conv_relu_pool2d. Each is a ladder of five rungs (ops/ladder.py: aten, python, cpp, triton,
cuda) checked by one harness (check.py), timed by one benchmark (bench.py) and built by one
extension builder (build.py).

    from trainlab.ops import gelu, GELU, IMPLS
    y = gelu(x, impl="cpp", approximate="none")

The C++ extensions and Triton are built or imported only when their rung is used.
"""

from trainlab.ops.gelu import APPROXIMATIONS, GELU, IMPLS, GeluFunction, gelu

__all__ = ["gelu", "GELU", "IMPLS", "APPROXIMATIONS", "GeluFunction"]
