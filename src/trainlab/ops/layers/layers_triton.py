"""LeNet-5's layers as Triton kernels — conv2d, max_pool2d, linear, relu, forward and backward —
registered as torch.library custom ops `trainlab::triton_*` (fakes + autograd from layer_args.register).

What the Triton rung teaches that the C++ one does not:
  * implicit GEMM: the convolution never writes its im2col matrix. Each program computes a
    BM x BN tile of outputs (pixels x channels) and, for every BK slice of the C*KH*KW reduction,
    gathers the patch entries it needs straight from x into registers (masked loads produce the
    zero padding) and feeds them to `tl.dot`. The two backward convolutions are implicit GEMMs too:
    dx gathers dy with the kernel flipped; dW contracts over the N*OH*OW axis, split into SPLIT
    slices across programs (split-K) so that a 16 x 150 result still fills a GPU.
  * epilogue fusion: the bias is added in the GEMM's epilogue, and so is the ReLU where one follows
    (`conv2d_relu`, `linear_relu`: y is written once, already rectified). Their backward masks dy
    once (relu's backward kernel) and runs the layer's backward GEMMs on it: a GEMM reading y through
    the mask would read it once per use of dy (`_register_fused_relu` gives the measurement). The
    bias gradient is one more column of the weight-gradient GEMM (a column of ones appended to its
    right operand, in registers) — no extra pass over dy, no separate reduction.
  * autotuning: every kernel runs under `triton.autotune` over a small config set (TUNING), the
    fastest cached per shape — a handful of configs measured once, not block sizes reasoned out.
  * the pool backward as a gather: one program lane per *input* element visits the (at most
    ceil(K/S)^2) windows that contain it and adds the gradient of those that chose it; no atomics,
    deterministic even when windows overlap.

Where the kernels run (as in gelu_triton.py): CUDA tensors → compiled with triton.jit; CPU tensors →
Triton's interpreter when TRITON_INTERPRET=1 (slow; for tests); otherwise a HardwareError.

Precision: float32 products are TF32 where torch lets ATen's op for the layer use TF32 (cuDNN's switch
for the convolutions, on by default; cuBLAS's for the linear layers, off by default: `_precision`), else
`input_precision="ieee"`; `ops check` turns both off, since it compares with float64 at float32
tolerances. bfloat16/float16 products accumulate in float32 and round once; float64 is
float64 throughout. Pooling and relu only select values: exact in any dtype. Triton's interpreter
does not handle bfloat16 inside kernels faithfully (see _kernel_inputs), so interpreted runs widen
bf16/fp16 to float32 first: the CPU tests check the kernels' logic and float32/float64 numerics,
the bf16 loads and stores are checked by compiling the kernels (tests/test_ops_layers_triton.py).
Offsets into the batch dimension are computed in int64 (batch 4096 x 6 x 28 x 28 already passes
2^24 elements; a larger image would pass 2^31).
"""

# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations as objects.

import torch

from trainlab.ops.gelu.gelu_triton import run_launch, run_mode, tuned_object
from trainlab.ops.ladder import widen
from trainlab.ops.layers.layer_args import conv2d_output_hw, pool_index_dtype, pool_output_hw, register

try:  # optional dependency: without it impl="triton" raises a HardwareError naming the fix
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where triton is absent (gelu_triton.run_mode says so)
    triton = tl = None

if tl is not None:
    # Plain functions, wrapped per mode (JITFunction or InterpretedFunction) and autotuned by
    # gelu_triton.tuned_object (TUNING below).

    def _conv2d_fwd_kernel(
        x_ptr,
        w_ptr,
        b_ptr,
        y_ptr,
        N,
        C,
        H,
        W,
        OC,
        OH,
        OW,
        sxn,
        sxc,
        sxh,
        sxw,
        KH: tl.constexpr,
        KW: tl.constexpr,
        PH: tl.constexpr,
        PW: tl.constexpr,
        HAS_BIAS: tl.constexpr,
        RELU: tl.constexpr,
        F64: tl.constexpr,
        IEEE: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
    ):
        # y[n, o, i, j] = b[o] + sum_k x[n, c, i+p-PH, j+q-PW] * w[o, k],  k = (c, p, q).
        # GEMM rows m = (n, i, j) (output pixels), columns o, reduction k; w is contiguous [OC, K].
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = tl.program_id(1) * BN + tl.arange(0, BN)
        K = C * KH * KW
        m_ok = rm < N * OH * OW
        n_ok = rn < OC
        img = rm // (OH * OW)
        oh = (rm // OW) % OH
        ow = rm % OW
        x_base = img.to(tl.int64) * sxn
        if F64:
            acc = tl.full((BM, BN), 0.0, tl.float64)
        else:
            acc = tl.full((BM, BN), 0.0, tl.float32)
        for k0 in range(0, K, BK):
            rk = k0 + tl.arange(0, BK)
            k_ok = rk < K
            c = rk // (KH * KW)
            p = (rk // KW) % KH
            q = rk % KW
            ih = oh[:, None] + p[None, :] - PH
            iw = ow[:, None] + q[None, :] - PW
            a_ok = m_ok[:, None] & k_ok[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            a_off = x_base[:, None] + c[None, :] * sxc + ih * sxh + iw * sxw
            a = tl.load(x_ptr + a_off, mask=a_ok, other=0.0)
            b = tl.load(w_ptr + rn[None, :] * K + rk[:, None], mask=k_ok[:, None] & n_ok[None, :], other=0.0)
            if IEEE:
                acc = tl.dot(a, b, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc, out_dtype=acc.dtype)  # float64 for gradcheck (triton 3.7 wants it named)
        if HAS_BIAS:  # epilogue: the bias is added while the tile is still in registers
            acc += tl.load(b_ptr + rn, mask=n_ok, other=0.0).to(acc.dtype)[None, :]
        if RELU:  # and the ReLU: no second pass over y (NaN kept, as torch.relu keeps it)
            acc = tl.where((acc > 0) | (acc != acc), acc, 0.0)
        y_off = img.to(tl.int64)[:, None] * (OC * OH * OW) + rn[None, :] * (OH * OW) + (oh * OW + ow)[:, None]
        tl.store(y_ptr + y_off, acc.to(y_ptr.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])

    def _conv2d_bwd_weight_kernel(
        g_ptr,
        x_ptr,
        dw_ptr,
        N,
        C,
        H,
        W,
        OC,
        OH,
        OW,
        sgn,
        sgc,
        sgh,
        sgw,
        sxn,
        sxc,
        sxh,
        sxw,
        K_PER_SPLIT,
        KH: tl.constexpr,
        KW: tl.constexpr,
        PH: tl.constexpr,
        PW: tl.constexpr,
        BIAS_COL: tl.constexpr,
        F64: tl.constexpr,
        IEEE: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
    ):
        # dw[o, (c, p, q)] = sum_r dy[n, o, i, j] * x[n, c, i+p-PH, j+q-PW],  r = (n, i, j).
        # Rows o, columns (c, p, q), reduction r split into slices of K_PER_SPLIT (program axis 2):
        # each program writes its partial sum to dw_ptr[split]; torch adds the slices in order.
        # BIAS_COL: one more column, (c, p, q) = C*KH*KW, whose "input" is 1 — its result is
        # sum_r dy[n, o, i, j], the bias gradient, computed by the same tl.dot (as in the C++ rung).
        pid_n = tl.program_id(1)
        split = tl.program_id(2)
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        CKK = C * KH * KW
        NCOL = CKK + BIAS_COL
        R = N * OH * OW
        m_ok = rm < OC
        n_ok = rn < CKK
        c = rn // (KH * KW)
        p = (rn // KW) % KH
        q = rn % KW
        if F64:
            acc = tl.full((BM, BN), 0.0, tl.float64)
        else:
            acc = tl.full((BM, BN), 0.0, tl.float32)
        r_begin = split * K_PER_SPLIT
        for r0 in range(r_begin, r_begin + K_PER_SPLIT, BK):
            rk = r0 + tl.arange(0, BK)
            k_ok = (rk < R) & (rk < r_begin + K_PER_SPLIT)
            img = rk // (OH * OW)
            oh = (rk // OW) % OH
            ow = rk % OW
            a_off = img.to(tl.int64)[None, :] * sgn + rm[:, None] * sgc + (oh * sgh + ow * sgw)[None, :]
            a = tl.load(g_ptr + a_off, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            ih = oh[:, None] + p[None, :] - PH
            iw = ow[:, None] + q[None, :] - PW
            b_ok = k_ok[:, None] & n_ok[None, :] & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            b = tl.load(
                x_ptr + img.to(tl.int64)[:, None] * sxn + c[None, :] * sxc + ih * sxh + iw * sxw, mask=b_ok, other=0.0
            )
            if BIAS_COL:
                ones = tl.full((BK, BN), 1.0, b.dtype)
                b = tl.where(k_ok[:, None] & (rn == CKK)[None, :], ones, b)
            if IEEE:
                acc = tl.dot(a, b, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc, out_dtype=acc.dtype)  # float64 for gradcheck (triton 3.7 wants it named)
        out = split.to(tl.int64) * OC * NCOL + rm[:, None] * NCOL + rn[None, :]
        tl.store(dw_ptr + out, acc, mask=m_ok[:, None] & (rn < NCOL)[None, :])

    def _matmul_kernel(
        a_ptr,
        b_ptr,
        c_ptr,
        bias_ptr,
        M,
        N,
        K,
        sam,
        sak,
        sbk,
        sbn,
        K_PER_SPLIT,
        HAS_BIAS: tl.constexpr,
        BIAS_COL: tl.constexpr,
        RELU: tl.constexpr,
        F64: tl.constexpr,
        IEEE: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
    ):
        # c[split, m, n] = sum over this split's k of a[m, k] b[k, n] (+ bias[n]); a and b by strides,
        # so transposed operands cost nothing. BIAS_COL appends a column of ones to b: c[:, N] is then
        # sum_k a[m, k] — the linear layer's bias gradient when a = dy^T — from the same tl.dot.
        pid_n = tl.program_id(1)
        split = tl.program_id(2)
        rm = tl.program_id(0) * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        NCOL = N + BIAS_COL
        m_ok = rm < M
        n_ok = rn < N
        if F64:
            acc = tl.full((BM, BN), 0.0, tl.float64)
        else:
            acc = tl.full((BM, BN), 0.0, tl.float32)
        k_begin = split * K_PER_SPLIT
        for k0 in range(k_begin, k_begin + K_PER_SPLIT, BK):
            rk = k0 + tl.arange(0, BK)
            k_ok = (rk < K) & (rk < k_begin + K_PER_SPLIT)
            a_off = rm.to(tl.int64)[:, None] * sam + rk[None, :] * sak
            a = tl.load(a_ptr + a_off, mask=m_ok[:, None] & k_ok[None, :], other=0.0)
            b = tl.load(
                b_ptr + rk.to(tl.int64)[:, None] * sbk + rn[None, :] * sbn,
                mask=k_ok[:, None] & n_ok[None, :],
                other=0.0,
            )
            if BIAS_COL:
                ones = tl.full((BK, BN), 1.0, b.dtype)
                b = tl.where(k_ok[:, None] & (rn == N)[None, :], ones, b)
            if IEEE:
                acc = tl.dot(a, b, acc, input_precision="ieee")
            else:
                acc = tl.dot(a, b, acc, out_dtype=acc.dtype)  # float64 for gradcheck (triton 3.7 wants it named)
        if HAS_BIAS:
            acc += tl.load(bias_ptr + rn, mask=n_ok, other=0.0).to(acc.dtype)[None, :]
        if RELU:  # epilogue ReLU (one split only: a partial sum's sign means nothing)
            acc = tl.where((acc > 0) | (acc != acc), acc, 0.0)
        out = split.to(tl.int64) * M * NCOL + rm.to(tl.int64)[:, None] * NCOL + rn[None, :]
        tl.store(c_ptr + out, acc.to(c_ptr.dtype.element_ty), mask=m_ok[:, None] & (rn < NCOL)[None, :])

    def _max_pool2d_fwd_kernel(
        x_ptr,
        y_ptr,
        idx_ptr,
        TOTAL,
        C,
        H,
        W,
        OH,
        OW,
        sxn,
        sxc,
        sxh,
        sxw,
        KH: tl.constexpr,
        KW: tl.constexpr,
        SH: tl.constexpr,
        SW: tl.constexpr,
        PH: tl.constexpr,
        PW: tl.constexpr,
        F64: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # One lane per output (n, c, i, j): the window's maximum and its window-local index p*KW + q.
        # ATen's rules: scan p then q, take v when v > best or v is NaN; a window with no taker
        # (all -inf) reports its first element inside the image.
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < TOTAL
        j = offs % OW
        i = (offs // OW) % OH
        c = (offs // (OW * OH)) % C
        n = offs // (OW * OH * C)
        h0 = i * SH - PH
        w0 = j * SW - PW
        base = n * sxn + c * sxc
        if F64:
            best = tl.full((BLOCK,), float("-inf"), tl.float64)
        else:
            best = tl.full((BLOCK,), float("-inf"), tl.float32)
        first = tl.maximum(-h0, 0) * KW + tl.maximum(-w0, 0)
        k_best = first.to(tl.int32)
        for p in tl.static_range(KH):
            for q in tl.static_range(KW):
                ih = h0 + p
                iw = w0 + q
                inside = ok & (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
                v = tl.load(x_ptr + base + ih * sxh + iw * sxw, mask=inside, other=float("-inf")).to(best.dtype)
                take = inside & ((v > best) | (v != v))
                best = tl.where(take, v, best)
                k_best = tl.where(take, p * KW + q, k_best)
        tl.store(y_ptr + offs, best.to(y_ptr.dtype.element_ty), mask=ok)  # exact: best is one of the inputs
        tl.store(idx_ptr + offs, k_best.to(idx_ptr.dtype.element_ty), mask=ok)

    def _max_pool2d_bwd_kernel(
        g_ptr,
        idx_ptr,
        dx_ptr,
        TOTAL,
        C,
        H,
        W,
        OH,
        OW,
        sgn,
        sgc,
        sgh,
        sgw,
        KH: tl.constexpr,
        KW: tl.constexpr,
        SH: tl.constexpr,
        SW: tl.constexpr,
        PH: tl.constexpr,
        PW: tl.constexpr,
        NWH: tl.constexpr,
        NWW: tl.constexpr,
        F64: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        # One lane per input element (n, c, h, w): the windows containing row h are i = i_hi - d for
        # d < NWH = ceil(KH/SH), i_hi = (h + PH) // SH (likewise for columns); add dy[n, c, i, j] for
        # each window whose saved winner is (h, w). A gather: no two lanes write the same element.
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < TOTAL
        w = offs % W
        h = (offs // W) % H
        c = (offs // (W * H)) % C
        n = offs // (W * H * C)
        i_hi = (h + PH) // SH
        j_hi = (w + PW) // SW
        if F64:
            acc = tl.full((BLOCK,), 0.0, tl.float64)
        else:
            acc = tl.full((BLOCK,), 0.0, tl.float32)
        plane = (n * C + c) * (OH * OW)
        for di in tl.static_range(NWH):
            for dj in tl.static_range(NWW):
                i = i_hi - di
                j = j_hi - dj
                p = h + PH - i * SH
                q = w + PW - j * SW
                valid = ok & (i >= 0) & (i < OH) & (p < KH) & (j >= 0) & (j < OW) & (q < KW)
                k = tl.load(idx_ptr + plane + i * OW + j, mask=valid, other=0).to(tl.int32)
                chosen = valid & (k == (p * KW + q).to(tl.int32))
                g = tl.load(g_ptr + n * sgn + c * sgc + i * sgh + j * sgw, mask=chosen, other=0.0)
                acc += g.to(acc.dtype)
        tl.store(dx_ptr + offs, acc.to(dx_ptr.dtype.element_ty), mask=ok)

    # relu compares in float32 (float64 for float64); the result is selected from the input itself.
    def _relu_fwd_kernel(x_ptr, y_ptr, TOTAL, F64: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < TOTAL
        x = tl.load(x_ptr + offs, mask=ok, other=0.0)
        if F64:
            v = x
        else:
            v = x.to(tl.float32)
        keep = (v > 0) | (v != v)  # NaN kept
        tl.store(y_ptr + offs, tl.where(keep, x, tl.full((BLOCK,), 0.0, x.dtype)), mask=ok)

    def _relu_bwd_kernel(g_ptr, y_ptr, dx_ptr, TOTAL, F64: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < TOTAL
        g = tl.load(g_ptr + offs, mask=ok, other=0.0)
        y = tl.load(y_ptr + offs, mask=ok, other=0.0)
        if F64:
            v = y
        else:
            v = y.to(tl.float32)
        tl.store(dx_ptr + offs, tl.where(v <= 0, tl.full((BLOCK,), 0.0, g.dtype), g), mask=ok)  # NaN passes


KERNELS = (
    "_conv2d_fwd_kernel",
    "_conv2d_bwd_weight_kernel",
    "_matmul_kernel",
    "_max_pool2d_fwd_kernel",
    "_max_pool2d_bwd_kernel",
    "_relu_fwd_kernel",
    "_relu_bwd_kernel",
)


def aot_specs(dtype: str = "fp32") -> dict:
    """{kernel name: (signature, constexprs)} for compiling every kernel ahead of time with
    `kernel_check.triton_ptx` (no GPU needed), with the launch parameters used on a GPU for
    LeNet-like shapes. `dtype` is the tensors' Triton type: fp32, bf16 or fp64."""
    ptr, acc = f"*{dtype}", "*fp64" if dtype == "fp64" else "*fp32"
    prec = {"F64": dtype == "fp64", "IEEE": dtype == "fp32"}
    tiles = {"BM": 64, "BN": 16, "BK": 32}
    conv = {"KH": 5, "KW": 5, "PH": 2, "PW": 2}
    pool = {"KH": 2, "KW": 2, "SH": 2, "SW": 2, "PH": 0, "PW": 0}

    def sig(names, types):
        return dict(zip(names, types))

    shape7 = ["N", "C", "H", "W", "OC", "OH", "OW"]
    return {
        "_conv2d_fwd_kernel": (
            sig(
                ["x_ptr", "w_ptr", "b_ptr", "y_ptr", *shape7, "sxn", "sxc", "sxh", "sxw"],
                [ptr] * 4 + ["i32"] * 11,
            )
            | dict.fromkeys([*conv, "HAS_BIAS", "RELU", "F64", "IEEE", *tiles], "constexpr"),
            {**conv, "HAS_BIAS": True, "RELU": True, **prec, **tiles},
        ),
        "_conv2d_bwd_weight_kernel": (
            sig(
                [
                    "g_ptr",
                    "x_ptr",
                    "dw_ptr",
                    *shape7,
                    "sgn",
                    "sgc",
                    "sgh",
                    "sgw",
                    "sxn",
                    "sxc",
                    "sxh",
                    "sxw",
                    "K_PER_SPLIT",
                ],
                [ptr, ptr, acc] + ["i32"] * 16,
            )
            | dict.fromkeys([*conv, "BIAS_COL", "F64", "IEEE", *tiles], "constexpr"),
            {**conv, "BIAS_COL": True, **prec, **tiles, "BM": 16},
        ),
        "_matmul_kernel": (
            sig(
                [
                    "a_ptr",
                    "b_ptr",
                    "c_ptr",
                    "bias_ptr",
                    "M",
                    "N",
                    "K",
                    "sam",
                    "sak",
                    "sbk",
                    "sbn",
                    "K_PER_SPLIT",
                ],
                [ptr] * 4 + ["i32"] * 8,
            )
            | dict.fromkeys(["HAS_BIAS", "BIAS_COL", "RELU", "F64", "IEEE", *tiles], "constexpr"),
            {"HAS_BIAS": True, "BIAS_COL": True, "RELU": False, **prec, **tiles},
        ),
        "_max_pool2d_fwd_kernel": (
            sig(
                ["x_ptr", "y_ptr", "idx_ptr", "TOTAL", "C", "H", "W", "OH", "OW", "sxn", "sxc", "sxh", "sxw"],
                [ptr, ptr, "*u8"] + ["i32"] * 10,
            )
            | dict.fromkeys([*pool, "F64", "BLOCK"], "constexpr"),
            {**pool, "F64": dtype == "fp64", "BLOCK": 256},
        ),
        "_max_pool2d_bwd_kernel": (
            sig(
                ["g_ptr", "idx_ptr", "dx_ptr", "TOTAL", "C", "H", "W", "OH", "OW", "sgn", "sgc", "sgh", "sgw"],
                [ptr, "*u8", ptr] + ["i32"] * 10,
            )
            | dict.fromkeys([*pool, "NWH", "NWW", "F64", "BLOCK"], "constexpr"),
            {**pool, "NWH": 1, "NWW": 1, "F64": dtype == "fp64", "BLOCK": 256},
        ),
        "_relu_fwd_kernel": (
            {"x_ptr": ptr, "y_ptr": ptr, "TOTAL": "i32", "F64": "constexpr", "BLOCK": "constexpr"},
            {"F64": dtype == "fp64", "BLOCK": 1024},
        ),
        "_relu_bwd_kernel": (
            {"g_ptr": ptr, "y_ptr": ptr, "dx_ptr": ptr, "TOTAL": "i32", "F64": "constexpr", "BLOCK": "constexpr"},
            {"F64": dtype == "fp64", "BLOCK": 1024},
        ),
    }


# ---- launch geometry: triton.autotune over a small config set per kernel ---------------------------------
#
# Compiled, every kernel is tuned over the few configs below — tile sizes, warps, pipeline depth — and
# the fastest is cached per key (the shape arguments; Triton adds the tensors' dtypes), in memory and on
# disk where Triton offers it: LeNet's layers at one batch size are tuned once, at their first call
# (`ops bench` runs every rung once before timing it, so tuning is never timed). Each set holds the
# config the kernel used before it was tuned, so tuning can only pick something at least as fast.
# Interpreted: one config, never benchmarked (gelu_triton.tuned_object), so tests pay nothing for it.
# The forward GEMMs' keys name their ReLU epilogue too, so it is tuned on its own.
# The GEMMs' column tile BN follows the layer (6 … 120 channels or features, rounded up to tl.dot's 16),
# so it is an argument; the weight-gradient GEMM's rows are output channels (6, 16): BM = 16.

# (meta, num_warps, num_stages) per kernel.
_CONV_FWD = [
    ({"BM": 64, "BK": 32}, 4, 2),  # the untuned choice
    ({"BM": 128, "BK": 32}, 4, 3),
    ({"BM": 128, "BK": 32}, 8, 3),
    ({"BM": 256, "BK": 32}, 8, 3),
    ({"BM": 128, "BK": 16}, 4, 4),
    ({"BM": 64, "BK": 16}, 2, 4),
]
_CONV_BWD_WEIGHT = [
    ({"BN": 32, "BK": 32}, 4, 2),  # ~ the untuned choice for conv1 (26 columns)
    ({"BN": 64, "BK": 32}, 4, 2),  # … and for conv2 (151)
    ({"BN": 32, "BK": 64}, 4, 3),
    ({"BN": 64, "BK": 64}, 4, 3),
    ({"BN": 32, "BK": 128}, 4, 3),
    ({"BN": 64, "BK": 128}, 8, 3),
]
_MATMUL = [
    ({"BM": 64, "BK": 32}, 4, 2),  # the untuned choice
    ({"BM": 32, "BK": 32}, 2, 3),
    ({"BM": 128, "BK": 32}, 4, 3),
    ({"BM": 64, "BK": 64}, 4, 3),
    ({"BM": 128, "BK": 64}, 8, 3),
    ({"BM": 32, "BK": 128}, 4, 3),
]
_POOL = [({"BLOCK": 256}, 4, 1), ({"BLOCK": 512}, 4, 1), ({"BLOCK": 1024}, 4, 1), ({"BLOCK": 1024}, 8, 1)]
_ELEMENTWISE = [({"BLOCK": 1024}, 4, 1), ({"BLOCK": 2048}, 4, 1), ({"BLOCK": 4096}, 8, 1), ({"BLOCK": 8192}, 8, 1)]
_SPLIT_MULTIPLE = 128  # split-K slices are a multiple of every BK above (whole tiles in every slice)

# kernel: (compiled configs, autotune key, the one interpreted config: big tiles, since the interpreter's
# cost is per program and per loop iteration, not per element)
TUNING = {
    "_conv2d_fwd_kernel": (
        _CONV_FWD,
        ["N", "C", "H", "W", "OC", "OH", "OW", "RELU"],
        {"BM": 128, "BK": 64},
    ),
    "_conv2d_bwd_weight_kernel": (
        _CONV_BWD_WEIGHT,
        ["N", "C", "H", "W", "OC", "OH", "OW", "K_PER_SPLIT"],
        {"BN": 64, "BK": 64},
    ),
    "_matmul_kernel": (
        _MATMUL,
        ["M", "N", "K", "sam", "sak", "sbk", "sbn", "K_PER_SPLIT", "RELU"],
        {"BM": 128, "BK": 64},
    ),
    "_max_pool2d_fwd_kernel": (_POOL, ["TOTAL", "C", "H", "W", "OH", "OW"], {"BLOCK": 4096}),
    "_max_pool2d_bwd_kernel": (_POOL, ["TOTAL", "C", "H", "W", "OH", "OW"], {"BLOCK": 4096}),
    "_relu_fwd_kernel": (_ELEMENTWISE, ["TOTAL"], {"BLOCK": 8192}),
    "_relu_bwd_kernel": (_ELEMENTWISE, ["TOTAL"], {"BLOCK": 8192}),
}


def tuned_kernel(name: str, interpreted: bool):
    configs, key, interpreted_meta = TUNING[name]
    return tuned_object(globals()[name], interpreted, configs, key, interpreted_meta)


def _launch(name: str, interpreted: bool, grid, *args, **meta) -> None:
    """kernel[grid](*args, **meta) through its autotuner; `grid` is a function of the chosen config."""
    run_launch(tuned_kernel(name, interpreted), interpreted, grid, *args, **meta)


def _precision(dtype: torch.dtype, interpreted: bool, tf32: bool) -> dict:
    """The GEMM kernels' F64 and IEEE constexprs. float32 products are TF32 where torch lets ATen's op for
    the same layer use TF32 (`tf32`: cuDNN's switch for a convolution, cuBLAS's for a linear layer; torch's
    defaults: on and off), so the rung computes, and is timed, at the precision ATen runs that layer at;
    IEEE float32 otherwise, and always in the interpreter (a CPU has no TF32). `ops check` holds float32 to
    float32 tolerances with both switches off (device.ieee_float32)."""
    return {"F64": dtype == torch.float64, "IEEE": dtype == torch.float32 and (interpreted or not tf32)}


def _kernel_inputs(interpreted: bool, *tensors):
    """The tensors the kernels see. Interpreted, bfloat16/float16 are widened to float32 by torch
    (exact): the interpreter stores them as raw 16-bit words, compares those bits, flushes
    subnormals and narrows by truncation. The caller rounds the results back once with torch
    (round-to-nearest-even) — the single rounding the compiled bf16 kernels do in registers."""
    if not interpreted:
        return tensors
    return tuple(widen(t) for t in tensors)


def _acc_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _cols(n_cols: int) -> int:
    """A GEMM's column tile: the layer's channels/features rounded up to tl.dot's minimum of 16, at most 64."""
    return max(16, min(64, triton.next_power_of_2(max(1, n_cols))))


def _splits(reduction: int, multiple: int, other_programs: int, interpreted: bool) -> tuple[int, int]:
    """(split count, reduction length per split) for split-K: enough programs to fill a GPU (~4 per
    SM of an H100) without slices shorter than 8 tiles; one split when interpreted."""
    if interpreted:
        return 1, max(1, reduction)
    want = max(1, min(-(-reduction // (8 * multiple)), -(-528 // max(1, other_programs))))
    per = -(-reduction // want)
    per = -(-per // multiple) * multiple
    return -(-reduction // per), per


def _grid_1d(total: int):
    return lambda meta: (max(1, -(-total // meta["BLOCK"])),)


# ---- the ops: eager launchers registered as torch.library custom ops ----------------------------------


def _conv2d(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    padding,
    relu: bool,
) -> torch.Tensor:
    """relu=True: the ReLU in the epilogue."""
    interpreted, dtype = run_mode(x), x.dtype
    x, weight, bias = _kernel_inputs(interpreted, x, weight, bias)
    n, c, h, w = x.shape
    oc, _, kh, kw = weight.shape
    oh, ow = conv2d_output_hw(h, w, kh, kw, padding)
    y = torch.empty((n, oc, oh, ow), dtype=x.dtype, device=x.device)
    if y.numel():
        bn = _cols(oc)
        _launch(
            "_conv2d_fwd_kernel",
            interpreted,
            lambda meta: (-(-n * oh * ow // meta["BM"]), -(-oc // bn)),
            x,
            weight.contiguous(),
            bias if bias is not None else y,
            y,
            n,
            c,
            h,
            w,
            oc,
            oh,
            ow,
            *x.stride(),
            KH=kh,
            KW=kw,
            PH=padding[0],
            PW=padding[1],
            HAS_BIAS=bias is not None,
            RELU=relu,
            **_precision(x.dtype, interpreted, torch.backends.cudnn.allow_tf32),
            BN=bn,
        )
    return y.to(dtype)


@torch.library.custom_op("trainlab::triton_conv2d_fwd", mutates_args=())
def conv2d_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, padding: list[int]) -> torch.Tensor:
    return _conv2d(x, weight, bias, padding, relu=False)


@torch.library.custom_op("trainlab::triton_conv2d_relu_fwd", mutates_args=())
def conv2d_relu_fwd(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, padding: list[int]
) -> torch.Tensor:
    """relu(conv2d(x, weight, bias)): the ReLU in the GEMM's epilogue, y written once."""
    return _conv2d(x, weight, bias, padding, relu=True)


@torch.library.custom_op("trainlab::triton_conv2d_bwd_input", mutates_args=())
def conv2d_bwd_input(grad: torch.Tensor, weight: torch.Tensor, padding: list[int]) -> torch.Tensor:
    # For stride 1, dx[n, c, h, w] = sum_{o,p,q} dy[n, o, h+PH-p, w+PW-q] w[o, c, p, q] is itself a
    # convolution: of dy with the kernel flipped in space and transposed in channels, padded by
    # K-1-P. So the forward's implicit-GEMM kernel computes it, with no kernel of its own.
    kh, kw = weight.shape[2], weight.shape[3]
    flipped = weight.flip(2, 3).transpose(0, 1).contiguous()  # [C, OC, KH, KW]: 2.4k numbers for LeNet's conv2
    return _conv2d(grad, flipped, None, [kh - 1 - padding[0], kw - 1 - padding[1]], relu=False)


@torch.library.custom_op("trainlab::triton_conv2d_bwd_weight", mutates_args=())
def conv2d_bwd_weight(
    grad: torch.Tensor,
    x: torch.Tensor,
    weight: torch.Tensor,
    padding: list[int],
    bias: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    interpreted = run_mode(x)
    grad, x = _kernel_inputs(interpreted, grad, x)
    n, c, h, w = x.shape
    oc, _, kh, kw = weight.shape
    oh, ow = grad.shape[2], grad.shape[3]
    ckk, r = c * kh * kw, n * oh * ow
    ncol = ckk + int(bias)
    bm = 128 if interpreted else 16  # rows are output channels: 6 or 16 in LeNet
    splits, per = _splits(r, _SPLIT_MULTIPLE, -(-oc // bm) * -(-ncol // 32), interpreted)
    # every (split, channel, column) is stored by the one program whose tile holds it, so no fill (a memset
    # launch per call on a GPU); with no rows there is no launch and the gradient is zero
    parts = (torch.empty if r else torch.zeros)((splits, oc, ncol), dtype=_acc_dtype(x.dtype), device=x.device)
    if r:
        _launch(
            "_conv2d_bwd_weight_kernel",
            interpreted,
            lambda meta: (-(-oc // bm), -(-ncol // meta["BN"]), splits),
            grad,
            x,
            parts,
            n,
            c,
            h,
            w,
            oc,
            oh,
            ow,
            *grad.stride(),
            *x.stride(),
            per,
            KH=kh,
            KW=kw,
            PH=padding[0],
            PW=padding[1],
            BIAS_COL=bool(bias),
            **_precision(x.dtype, interpreted, torch.backends.cudnn.allow_tf32),
            BM=bm,
        )
    total = parts.sum(0)  # the split-K slices, added in order
    dw = total[:, :ckk].reshape(weight.shape).to(weight.dtype)
    db = total[:, ckk].to(weight.dtype).contiguous() if bias else weight.new_empty((0,))
    return dw, db


def _matmul(
    a: torch.Tensor,
    b: torch.Tensor,
    bias: torch.Tensor | None,
    bias_col: bool,
    interpreted: bool,
    split: bool,
    relu: bool = False,
) -> torch.Tensor:
    """a [M, K] @ b [K, N] (+ bias) (then ReLU), operands by strides; with `bias_col` the result has
    one more column, sum_k a[m, k]. With `split`, the K axis is split across programs and the partial
    products are added by torch (in the accumulation dtype)."""
    m, k = a.shape
    n = b.shape[1]
    ncol = n + int(bias_col)
    bn = _cols(ncol)
    splits, per = _splits(k, _SPLIT_MULTIPLE, -(-m // 64) * -(-ncol // bn), interpreted) if split else (1, max(1, k))
    assert not (relu and splits > 1), "a ReLU epilogue needs the whole sum in one program"
    out_dtype = _acc_dtype(a.dtype) if splits > 1 else a.dtype
    c = torch.empty((splits, m, ncol), dtype=out_dtype, device=a.device)  # each split's slice stored whole: no fill
    if m and ncol:
        _launch(
            "_matmul_kernel",
            interpreted,
            lambda meta: (-(-m // meta["BM"]), -(-ncol // bn), splits),
            a,
            b,
            c,
            bias if bias is not None else c,
            m,
            n,
            k,
            a.stride(0),
            a.stride(1),
            b.stride(0),
            b.stride(1),
            per,
            HAS_BIAS=bias is not None,
            BIAS_COL=bias_col,
            RELU=relu,
            **_precision(a.dtype, interpreted, torch.backends.cuda.matmul.allow_tf32),
            BN=bn,
        )
    return c.sum(0) if splits > 1 else c[0]


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, relu: bool) -> torch.Tensor:
    interpreted, dtype = run_mode(x), x.dtype
    x, weight, bias = _kernel_inputs(interpreted, x, weight, bias)
    y = _matmul(x, weight.t(), bias, False, interpreted, split=False, relu=relu)  # W^T by strides: no copy
    return y.to(dtype).contiguous()


@torch.library.custom_op("trainlab::triton_linear_fwd", mutates_args=())
def linear_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return _linear(x, weight, bias, relu=False)


@torch.library.custom_op("trainlab::triton_linear_relu_fwd", mutates_args=())
def linear_relu_fwd(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """relu(x W^T + b): the ReLU in the GEMM's epilogue."""
    return _linear(x, weight, bias, relu=True)


@torch.library.custom_op("trainlab::triton_linear_bwd", mutates_args=())
def linear_bwd(
    grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    interpreted, dtype = run_mode(x), x.dtype
    grad, x, weight = _kernel_inputs(interpreted, grad, x, weight)
    fin = x.shape[1]
    dx = _matmul(grad, weight, None, False, interpreted, split=False)  # dy W
    dwb = _matmul(grad.t(), x, None, bias, interpreted, split=True)  # [dy^T x | dy^T 1]
    db = dwb[:, fin].to(dtype).contiguous() if bias else torch.empty((0,), dtype=dtype, device=x.device)
    return dx.to(dtype).contiguous(), dwb[:, :fin].to(dtype).contiguous(), db


@torch.library.custom_op("trainlab::triton_max_pool2d_fwd", mutates_args=())
def max_pool2d_fwd(
    x: torch.Tensor, kernel: list[int], stride: list[int], padding: list[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    interpreted, dtype = run_mode(x), x.dtype
    (x,) = _kernel_inputs(interpreted, x)
    n, c, h, w = x.shape
    oh, ow = pool_output_hw(h, w, kernel, stride, padding)
    y = torch.empty((n, c, oh, ow), dtype=x.dtype, device=x.device)
    idx = torch.empty((n, c, oh, ow), dtype=pool_index_dtype(kernel), device=x.device)
    if y.numel():
        _launch(
            "_max_pool2d_fwd_kernel",
            interpreted,
            _grid_1d(y.numel()),
            x,
            y,
            idx,
            y.numel(),
            c,
            h,
            w,
            oh,
            ow,
            *x.stride(),
            KH=kernel[0],
            KW=kernel[1],
            SH=stride[0],
            SW=stride[1],
            PH=padding[0],
            PW=padding[1],
            F64=x.dtype == torch.float64,
        )
    return y.to(dtype), idx


@torch.library.custom_op("trainlab::triton_max_pool2d_bwd", mutates_args=())
def max_pool2d_bwd(
    grad: torch.Tensor,
    indices: torch.Tensor,
    input_hw: list[int],
    kernel: list[int],
    stride: list[int],
    padding: list[int],
) -> torch.Tensor:
    interpreted, dtype = run_mode(grad), grad.dtype
    (grad,) = _kernel_inputs(interpreted, grad)
    n, c, oh, ow = grad.shape
    h, w = input_hw
    dx = torch.empty((n, c, h, w), dtype=grad.dtype, device=grad.device)
    if dx.numel():
        _launch(
            "_max_pool2d_bwd_kernel",
            interpreted,
            _grid_1d(dx.numel()),
            grad,
            indices.contiguous(),
            dx,
            dx.numel(),
            c,
            h,
            w,
            oh,
            ow,
            *grad.stride(),
            KH=kernel[0],
            KW=kernel[1],
            SH=stride[0],
            SW=stride[1],
            PH=padding[0],
            PW=padding[1],
            NWH=-(-kernel[0] // stride[0]),
            NWW=-(-kernel[1] // stride[1]),
            F64=grad.dtype == torch.float64,
        )
    return dx.to(dtype)


@torch.library.custom_op("trainlab::triton_relu_fwd", mutates_args=())
def relu_fwd(x: torch.Tensor) -> torch.Tensor:
    interpreted, dtype = run_mode(x), x.dtype
    (xc,) = _kernel_inputs(interpreted, x.contiguous())
    y = torch.empty_like(xc)
    if y.numel():
        _launch("_relu_fwd_kernel", interpreted, _grid_1d(y.numel()), xc, y, y.numel(), F64=x.dtype == torch.float64)
    return y.to(dtype)


@torch.library.custom_op("trainlab::triton_relu_bwd", mutates_args=())
def relu_bwd(grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    interpreted, dtype = run_mode(grad), grad.dtype
    gc, yc = _kernel_inputs(interpreted, grad.contiguous(), out.contiguous())
    dx = torch.empty_like(gc)
    if dx.numel():
        _launch(
            "_relu_bwd_kernel",
            interpreted,
            _grid_1d(dx.numel()),
            gc,
            yc,
            dx,
            dx.numel(),
            F64=grad.dtype == torch.float64,
        )
    return dx.to(dtype)


register("triton_")


def _register_fused_relu() -> None:
    """Fakes and autograd of the two ops with a ReLU epilogue. Their backward is relu's backward kernel
    (dy where y > 0, one pass) and then the layer's own backward ops on that masked dy. Reading y inside
    the backward GEMMs instead (as this rung did until 2026-11-28) loads it once per use of dy — 25 times
    per element in conv2's input gradient, where the H200 took 7.0 ms against 1.6 ms for the same kernel
    without the mask (benchmarks/results/gpu/h200/2026-11-28/issue40-b128/layer_profile/)."""
    ns = torch.ops.trainlab

    def conv_fake(x, weight, bias, padding):
        oh, ow = conv2d_output_hw(x.shape[2], x.shape[3], weight.shape[2], weight.shape[3], padding)
        return x.new_empty((x.shape[0], weight.shape[0], oh, ow))

    def linear_fake(x, weight, bias):
        return x.new_empty((x.shape[0], weight.shape[0]))

    def setup(ctx, inputs, output):
        x, weight, bias = inputs[:3]
        ctx.save_for_backward(x, weight, output)
        ctx.padding, ctx.has_bias = (inputs[3] if len(inputs) > 3 else None), bias is not None

    def conv_backward(ctx, grad):
        x, weight, y = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad = ns.triton_relu_bwd(grad, y)
        dx = ns.triton_conv2d_bwd_input(grad, weight, ctx.padding) if need_x else None
        dw = db = None
        if need_w or need_b:
            dw, db = ns.triton_conv2d_bwd_weight(grad, x, weight, ctx.padding, ctx.has_bias)
        return dx, dw if need_w else None, db if (need_b and ctx.has_bias) else None, None

    def linear_backward(ctx, grad):
        x, weight, y = ctx.saved_tensors
        dx, dw, db = ns.triton_linear_bwd(ns.triton_relu_bwd(grad, y), x, weight, ctx.has_bias)
        return dx, dw, db if ctx.has_bias else None

    for op_name, fake, backward in (
        ("triton_conv2d_relu_fwd", conv_fake, conv_backward),
        ("triton_linear_relu_fwd", linear_fake, linear_backward),
    ):
        torch.library.register_fake(f"trainlab::{op_name}", fake)
        torch.library.register_autograd(f"trainlab::{op_name}", backward, setup_context=setup)


_register_fused_relu()


# ---- entry points used by the triton rung (arguments already validated by layer_args) ----------------


def conv2d(x, weight, bias, padding) -> torch.Tensor:
    run_mode(x)  # fail before autograd records anything
    return torch.ops.trainlab.triton_conv2d_fwd(x, weight, bias, list(padding))


def max_pool2d(x, kernel, stride, padding) -> torch.Tensor:
    run_mode(x)
    return torch.ops.trainlab.triton_max_pool2d_fwd(x, list(kernel), list(stride), list(padding))[0]


def linear(x, weight, bias) -> torch.Tensor:
    run_mode(x)
    return torch.ops.trainlab.triton_linear_fwd(x, weight, bias)


def relu(x) -> torch.Tensor:
    run_mode(x)
    return torch.ops.trainlab.triton_relu_fwd(x)


def conv2d_relu(x, weight, bias, padding) -> torch.Tensor:
    """relu(conv2d(...)) in one kernel (the ReLU in the epilogue); the rung's conv_relu_pool2d uses it."""
    run_mode(x)
    return torch.ops.trainlab.triton_conv2d_relu_fwd(x, weight, bias, list(padding))


def linear_relu(x, weight, bias) -> torch.Tensor:
    """relu(linear(...)) in one kernel (the ReLU in the epilogue)."""
    run_mode(x)
    return torch.ops.trainlab.triton_linear_relu_fwd(x, weight, bias)
