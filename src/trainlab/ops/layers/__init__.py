"""The library that conv2d, max_pool2d, linear and relu share (each operator's own folder holds its
entry point, Python reference, cases and LeNet layers; this folder holds what their compiled rungs
have in common):

    layer_args.py      their one argument check, output sizes, and the fakes + autograd formulas of
                       both compiled families (trainlab::<op>_fwd, trainlab::triton_<op>_fwd)
    layers_cpp.py      the C++/CUDA extension (one build: layers_cpu.cpp, layers_cuda.cu + glue;
                       conv_relu_pool2d's C++ file is compiled into it) and `compiled_rung`
    layers_triton.py   the Triton kernels of all four
    *.cpp, *.cu, *.h   the kernels: shape arithmetic and blocking helpers shared by the four
                       (layers_shapes.h, layers_algo.h), which is why they are one library

Why shared rather than split per operator: one ~30 s build instead of four, and the headers the
kernels share would otherwise be copied.
"""
