"""Custom operators. GELU in five implementations behind one entry point:

    from trainlab.ops import gelu, GELU, IMPLS
    y = gelu(x, impl="cpp", approximate="none")

The C++ extension and Triton are imported only when their impl is used.
"""

from trainlab.ops.gelu import APPROXIMATIONS, GELU, IMPLS, GeluFunction, gelu

__all__ = ["gelu", "GELU", "IMPLS", "APPROXIMATIONS", "GeluFunction"]
