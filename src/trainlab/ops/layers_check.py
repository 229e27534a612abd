"""`trainlab ops check`: every rung of conv2d, max_pool2d, linear and relu against ATen, as one table.

Each row is one operator x shape case x implementation x dtype. The cases are LeNet-5's own layer
shapes (conv1, conv2, pool1, pool2, fc1-fc3, the activations) and odd ones: batch 1, non-square
kernels/strides/padding, overlapping pooling windows, non-contiguous (strided) inputs, and for pool
and relu the edge values (NaN, +-inf, ties). A row records, for the forward output and every input
gradient:

  * the max abs error against ATen evaluated in float64 on the *same* (already rounded) inputs —
    so it measures the kernel, not the rounding of the inputs — and its ratio to the tolerance;
  * the max abs difference to ATen run in the row's own dtype (informative: both round);
  * for pool/relu edge cases, whether NaN and +-inf come out where ATen's do.

A second table has, per operator and implementation, `torch.autograd.gradcheck` in float64 (small
shapes; fast mode for interpreted Triton) and `torch.library.opcheck` of the registered forward op
(cpp, triton, cuda: schema, autograd registration, fake tensor, AOT dispatch).

Tolerances. Each output element is a sum of products (conv, linear) or a selection (pool, relu). Let
S be the same computation on absolute values — conv(|x|, |W|) + |b| for a convolution, the backward
applied to |dy| for a gradient; a floating-point sum of k terms is within k * u * S of the exact
one (u = 2^-53, 2^-24), and blocked/pairwise sums are far inside that. Element-wise:

    float64    |err| <= 1e-12 * S            (k <= ~10^4 terms, ~100x margin on the typical error)
    float32    |err| <= 2e-5 * S             (u * sqrt(k) * S is ~1e-5 S for k ~ 10^4: dW of conv1)
    bfloat16   |err| <= 2^-8 * |ref| + 2e-5 * S   (float32 math, one rounding: half a bf16 ulp)

Max-pooling and relu select inputs, so S = |ref| forward and their errors are 0 unless windows
overlap (then a gradient is a sum of a few terms).
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from dataclasses import dataclass
from typing import Callable

import torch

from trainlab.errors import ConfigError, UserError
from trainlab.ops.conv import conv2d
from trainlab.ops.layer_args import IMPLS
from trainlab.ops.linear import linear
from trainlab.ops.pool import max_pool2d
from trainlab.ops.relu import relu

OPS = ("conv2d", "max_pool2d", "linear", "relu")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
TOLERANCES = {  # (coefficient of S, coefficient of |ref|)
    torch.float64: (1e-12, 0.0),
    torch.float32: (2e-5, 0.0),
    torch.bfloat16: (2e-5, 2.0 ** -8),
}


@dataclass(frozen=True)
class Case:
    """One shape case: `make(batch, gen)` returns float64 inputs (name -> tensor, or a non-tensor
    argument), `view` turns the cast inputs into the layouts under test, `call(inputs, impl)` runs
    the operator. `bilinear` ops get S from |inputs|; selections from the reference's own routing."""

    op: str
    name: str
    make: Callable
    call: Callable
    bilinear: bool
    view: Callable | None = None
    edge: bool = False   # contains NaN/inf: compare the non-finite pattern too


def _randn(gen, *shape):
    return torch.randn(*shape, dtype=torch.float64, generator=gen)


def _conv_case(name, x, w, padding, bias=True, view=None):
    def make(batch, gen):
        n = batch if x[0] is None else x[0]
        return {"x": _randn(gen, n, *x[1:]), "weight": _randn(gen, *w) / math.sqrt(w[1] * w[2] * w[3]),
                "bias": _randn(gen, w[0]) if bias else None}
    return Case("conv2d", name, make, lambda t, impl: conv2d(t["x"], t["weight"], t["bias"], padding, impl=impl),
                True, view)


def _pool_case(name, x, kernel, stride, padding, view=None, make=None, edge=False):
    def default_make(batch, gen):
        return {"x": _randn(gen, batch if x[0] is None else x[0], *x[1:])}
    return Case("max_pool2d", name, make or default_make,
                lambda t, impl: max_pool2d(t["x"], kernel, stride, padding, impl=impl), False, view, edge)


def _linear_case(name, n, fin, fout, bias=True, transposed=False):
    def make(batch, gen):
        rows = batch if n is None else n
        x = _randn(gen, fin, rows) if transposed else _randn(gen, rows, fin)
        return {"x": x, "weight": _randn(gen, fout, fin) / math.sqrt(fin), "bias": _randn(gen, fout) if bias else None}
    return Case("linear", name, make, lambda t, impl: linear(t["x"], t["weight"], t["bias"], impl=impl), True,
                _transposed if transposed else None)


def _relu_case(name, shape, view=None, make=None, edge=False):
    def default_make(batch, gen):
        return {"x": _randn(gen, batch if shape[0] is None else shape[0], *shape[1:])}
    return Case("relu", name, make or default_make, lambda t, impl: relu(t["x"], impl=impl), False, view, edge)


def _every_other_column(t):
    return {**t, "x": t["x"][..., ::2]}   # a strided, non-contiguous view


def _transposed(t):
    return {**t, "x": t["x"].t()}


def _pool_edge_values(batch, gen):
    """NaN, +-inf, all--inf windows and exact ties (also across dtypes: small integers)."""
    x = torch.randint(-3, 4, (1, 2, 6, 6), generator=gen).double()
    x[0, 0, 0, 0], x[0, 0, 1, 3], x[0, 1, 2, 2] = math.nan, math.inf, -math.inf
    x[0, 1, 4:6, 0:2] = -math.inf
    return {"x": x}


def _relu_edge_values(batch, gen):
    vals = [0.0, -0.0, 1.0, -1.0, math.inf, -math.inf, math.nan, 1e-40, -1e-40, 3.5, -2.25, 1e30]
    return {"x": torch.tensor(vals, dtype=torch.float64).view(3, 4)}


CASES: dict[str, list[Case]] = {
    "conv2d": [
        _conv_case("lenet-conv1", (None, 1, 28, 28), (6, 1, 5, 5), (2, 2)),
        _conv_case("lenet-conv2", (None, 6, 14, 14), (16, 6, 5, 5), (0, 0)),
        _conv_case("batch1", (1, 3, 9, 9), (4, 3, 3, 3), (1, 1)),
        _conv_case("non-square", (2, 2, 7, 12), (3, 2, 3, 5), (1, 2)),
        _conv_case("strided-input", (2, 3, 10, 22), (4, 3, 3, 3), (0, 0), bias=False, view=_every_other_column),
    ],
    "max_pool2d": [
        _pool_case("lenet-pool1", (None, 6, 28, 28), (2, 2), (2, 2), (0, 0)),
        _pool_case("lenet-pool2", (None, 16, 10, 10), (2, 2), (2, 2), (0, 0)),
        _pool_case("batch1-overlap", (1, 3, 9, 9), (3, 3), (2, 2), (1, 1)),
        _pool_case("non-square", (2, 3, 9, 7), (3, 2), (2, 1), (1, 0)),
        _pool_case("stride1-overlap", (2, 2, 6, 5), (3, 3), (1, 1), (1, 1)),
        _pool_case("strided-input", (2, 4, 12, 20), (2, 2), (2, 2), (0, 0), view=_every_other_column),
        _pool_case("nan-inf-ties", None, (2, 2), (2, 2), (0, 0), make=_pool_edge_values, edge=True),
    ],
    "linear": [
        _linear_case("lenet-fc1", None, 400, 120),
        _linear_case("lenet-fc2", None, 120, 84),
        _linear_case("lenet-fc3", None, 84, 10),
        _linear_case("batch1", 1, 30, 7),
        _linear_case("transposed-input", 9, 25, 6, bias=False, transposed=True),   # x: a [25, 9] tensor's .t()
    ],
    "relu": [
        _relu_case("lenet-act1", (None, 6, 28, 28)),
        _relu_case("strided-input", (3, 4, 5, 8), view=_every_other_column),
        _relu_case("nan-inf-zero", None, make=_relu_edge_values, edge=True),
    ],
}


# ---- running a row --------------------------------------------------------------------------------

def _availability(impl: str) -> tuple[str | None, torch.device]:
    """(reason to skip or None, device to run on)."""
    if impl == "cuda" and not torch.cuda.is_available():
        return "no CUDA GPU on this machine", torch.device("cpu")
    if impl == "triton":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "triton is not installed", torch.device("cpu")
    gpu = impl == "cuda" or (impl == "triton" and torch.cuda.is_available())
    return None, torch.device("cuda" if gpu else "cpu")


@contextlib.contextmanager
def triton_interpreter_if_cpu(impl: str):
    """Interpreted Triton for CPU rows: TRITON_INTERPRET=1 for the duration (restored after)."""
    if impl != "triton" or torch.cuda.is_available():
        yield
        return
    old = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = old


def _mode(impl: str, device: torch.device) -> str:
    if impl == "triton":
        return "compiled" if device.type == "cuda" else "interpreted"
    return {"aten": "eager", "python": "eager"}.get(impl, "compiled")


def _tensors(d: dict) -> dict:
    return {k: v for k, v in d.items() if isinstance(v, torch.Tensor)}


def _run(case: Case, inputs: dict, impl: str, dy: torch.Tensor | None):
    """(output, {name: grad}, dy) with the grads of every tensor input, taken with `dy` — if None, a
    random one already rounded to the output's dtype, so the float64 reference sees the same dy."""
    leaves = {k: v.detach().requires_grad_() for k, v in _tensors(inputs).items()}
    out = case.call({**inputs, **leaves}, impl)
    if dy is None:
        gen = torch.Generator().manual_seed(7)
        dy = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.dtype).double()
    grads = torch.autograd.grad(out, list(leaves.values()), dy.to(out.dtype).to(out.device))
    return out.detach(), dict(zip(leaves, grads)), dy


def _bounds(case: Case, inputs64: dict, ref_out, dy64) -> tuple[torch.Tensor, dict]:
    """S for the output and for each gradient (see the module docstring), in float64."""
    if case.bilinear:
        abs_inputs = {k: (v.abs() if isinstance(v, torch.Tensor) else v) for k, v in inputs64.items()}
        s_out, s_grads, _ = _run(case, abs_inputs, "aten", dy64.abs())
        return s_out, s_grads
    _, s_grads, _ = _run(case, inputs64, "aten", dy64.abs())   # the reference's routing, |dy|
    return ref_out.abs(), s_grads


def _compare(value, ref, bound_s, dtype) -> dict:
    """max abs error on finite reference entries, its worst ratio to the tolerance, non-finite match."""
    v, r = value.double().cpu(), ref.double().cpu()
    a_s, a_ref = TOLERANCES[dtype]
    finite = torch.isfinite(r)
    nonfinite_ok = bool(torch.equal(torch.isnan(v), torch.isnan(r)) and torch.equal(v[torch.isinf(r)], r[torch.isinf(r)]))
    if not finite.any():
        return {"err": 0.0, "ratio": 0.0, "nonfinite_ok": nonfinite_ok}
    err = (v[finite] - r[finite]).abs()
    tol = a_s * bound_s.double().cpu()[finite] + a_ref * r[finite].abs()
    ratio = torch.where(err == 0, torch.zeros_like(err), err / tol.clamp_min(1e-300))
    return {"err": float(err.max()), "ratio": float(ratio.max()), "nonfinite_ok": nonfinite_ok}


def check_row(case: Case, impl: str, dtype: torch.dtype, batch: int = 8, seed: int = 0) -> dict:
    """One row of the table; a kernel failure is recorded in the row, never raised."""
    dname = {v: k for k, v in DTYPES.items()}[dtype]
    row = {"op": case.op, "case": case.name, "impl": impl, "dtype": dname, "device": None, "mode": None,
           "shapes": None, "fwd_max_abs_err": None, "grad_max_abs_err": None, "fwd_vs_aten": None,
           "grad_vs_aten": None, "worst_ratio_to_tol": None, "nonfinite_ok": None,
           "ok": False, "skipped": False, "reason": None, "note": None, "seconds": None}
    skip, device = _availability(impl)
    if skip:
        row.update(skipped=True, ok=True, reason=skip)
        return row
    row.update(device=str(device), mode=_mode(impl, device))
    t0 = time.perf_counter()
    try:
        base = case.make(batch, torch.Generator().manual_seed(seed))
        cast = {k: (v.to(dtype).to(device) if isinstance(v, torch.Tensor) else v) for k, v in base.items()}
        inputs = case.view(cast) if case.view else cast
        inputs64 = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
        row["shapes"] = {k: list(v.shape) for k, v in _tensors(inputs).items()}
        with triton_interpreter_if_cpu(impl):
            out, grads, dy64 = _run(case, inputs, impl, None)
        ref, ref_grads, _ = _run(case, inputs64, "aten", dy64)
        same, same_grads, _ = _run(case, inputs, "aten", dy64)
        s_out, s_grads = _bounds(case, inputs64, ref, dy64)
        fwd = _compare(out, ref, s_out, dtype)
        grad_cmp = [_compare(grads[k], ref_grads[k], s_grads[k], dtype) for k in grads]
        row.update(
            fwd_max_abs_err=fwd["err"], grad_max_abs_err=max(g["err"] for g in grad_cmp),
            fwd_vs_aten=_max_diff(out, same), grad_vs_aten=max(_max_diff(grads[k], same_grads[k]) for k in grads),
            worst_ratio_to_tol=max([fwd["ratio"]] + [g["ratio"] for g in grad_cmp]),
            nonfinite_ok=all([fwd["nonfinite_ok"]] + [g["nonfinite_ok"] for g in grad_cmp]) if case.edge else None)
        shape_ok = out.shape == ref.shape and out.dtype == dtype and all(grads[k].shape == inputs[k].shape for k in grads)
        row["ok"] = bool(shape_ok and row["worst_ratio_to_tol"] <= 1.0 and row["nonfinite_ok"] is not False)
        if impl == "aten" and not row["ok"] and shape_ok:
            # ATen is the reference being measured, not a candidate: record how far it is from
            # float64, do not fail the check for it (e.g. its bf16 pool backward sums in bf16).
            row["note"] = f"ATen itself is {row['worst_ratio_to_tol']:.1f}x the tolerance here (recorded, not failed)"
            row["ok"] = True
        if not row["ok"]:
            row["reason"] = ("wrong shape or dtype" if not shape_ok else
                             "NaN/inf pattern differs from ATen" if row["nonfinite_ok"] is False else
                             f"error {row['worst_ratio_to_tol']:.2f}x the tolerance")
    except UserError as e:   # the impl cannot run here although it should (toolchain): a failure
        row.update(ok=False, reason=str(e))
    except Exception as e:   # a crashing kernel is a failed row, not a crashed check
        row.update(ok=False, reason=f"{type(e).__name__}: {e}")
    row["seconds"] = round(time.perf_counter() - t0, 3)
    return row


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    finite = torch.isfinite(a) & torch.isfinite(b)
    return float((a[finite] - b[finite]).abs().max()) if finite.any() else 0.0


# ---- gradcheck and opcheck (one row per operator x impl) -----------------------------------------------

_SMALL = {   # float64 shapes small enough for gradcheck's numerical Jacobian
    "conv2d": lambda g: ((torch.randn(1, 2, 5, 4, dtype=torch.float64, generator=g),
                          torch.randn(3, 2, 3, 2, dtype=torch.float64, generator=g),
                          torch.randn(3, dtype=torch.float64, generator=g)), lambda x, w, b, impl: conv2d(x, w, b, (1, 0), impl=impl)),
    "max_pool2d": lambda g: ((torch.randn(1, 2, 5, 6, dtype=torch.float64, generator=g),),
                             lambda x, impl: max_pool2d(x, (3, 2), (2, 1), (1, 1), impl=impl)),
    "linear": lambda g: ((torch.randn(3, 5, dtype=torch.float64, generator=g), torch.randn(4, 5, dtype=torch.float64, generator=g),
                          torch.randn(4, dtype=torch.float64, generator=g)), lambda x, w, b, impl: linear(x, w, b, impl=impl)),
    "relu": lambda g: ((torch.randn(4, 6, dtype=torch.float64, generator=g),), lambda x, impl: relu(x, impl=impl)),
}

_REGISTERED = {"cpp": "", "cuda": "", "triton": "triton_"}   # op-name prefix of each registered family


def _opcheck(op: str, impl: str, device: torch.device) -> bool:
    g = torch.Generator().manual_seed(3)
    inputs, _ = _SMALL[op](g)
    args = [t.float().to(device).requires_grad_() for t in inputs]
    extra = {"conv2d": ([1, 0],), "max_pool2d": ([3, 2], [2, 1], [1, 1]), "linear": (), "relu": ()}[op]
    fwd = getattr(torch.ops.trainlab, f"{_REGISTERED[impl]}{op}_fwd").default
    result = torch.library.opcheck(fwd, (*args, *extra))
    return all(v == "SUCCESS" for v in result.values())


def autograd_row(op: str, impl: str) -> dict:
    row = {"op": op, "impl": impl, "gradcheck": None, "opcheck": None, "ok": False, "skipped": False, "reason": None}
    skip, device = _availability(impl)
    if skip:
        row.update(skipped=True, ok=True, reason=skip)
        return row
    try:
        with triton_interpreter_if_cpu(impl):
            inputs, fn = _SMALL[op](torch.Generator().manual_seed(2))
            leaves = tuple(t.to(device).requires_grad_() for t in inputs)
            row["gradcheck"] = bool(torch.autograd.gradcheck(lambda *a: fn(*a, impl=impl), leaves, eps=1e-6, atol=1e-6,
                                                             rtol=1e-5, raise_exception=False,
                                                             fast_mode=impl == "triton" and device.type == "cpu"))
            if impl in _REGISTERED:
                row["opcheck"] = _opcheck(op, impl, device)
        row["ok"] = row["gradcheck"] is True and row["opcheck"] is not False
        if not row["ok"]:
            row["reason"] = "gradcheck failed" if not row["gradcheck"] else "opcheck failed"
    except UserError as e:
        row["reason"] = str(e)
    except Exception as e:
        row["reason"] = f"{type(e).__name__}: {e}"
    return row


# ---- the whole check ---------------------------------------------------------------------------------------

def run_layer_check(ops=OPS, impls=IMPLS, dtypes=tuple(DTYPES), cases=None, batch: int = 8, progress=None) -> dict:
    """All rows; `ok` is False if any row failed. `cases` filters case names (None: all)."""
    for name, allowed, what in ((ops, OPS, "--op"), (impls, IMPLS, "--impl"), (dtypes, tuple(DTYPES), "--dtype")):
        bad = [v for v in name if v not in allowed]
        if bad:
            raise ConfigError(f"{what} {bad[0]!r}: choose from {', '.join(allowed)}")
    if batch < 1:
        raise ConfigError(f"--batch {batch}: expected a positive number of samples")
    rows, grad_rows = [], []
    for op in ops:
        for case in CASES[op]:
            if cases and case.name not in cases:
                continue
            for impl in impls:
                for dname in dtypes:
                    row = check_row(case, impl, DTYPES[dname], batch=batch)
                    rows.append(row)
                    if progress:
                        progress(row)
        grad_rows += [autograd_row(op, impl) for impl in impls]
    tol = {str(k).replace("torch.", ""): {"abs_sum": v[0], "rel": v[1]} for k, v in TOLERANCES.items()}
    return {"torch": torch.__version__, "batch": batch, "tolerances": tol,
            "reference": "ATen in float64 on the same (rounded) inputs; tolerance |err| <= a*S + r*|ref| (S: the op on |inputs|)",
            "rows": rows, "autograd_rows": grad_rows,
            "ok": all(r["ok"] for r in rows + grad_rows)}


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return "0" if v == 0 else f"{v:.1e}"
    return str(v)


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def format_table(result: dict) -> str:
    cols = [("op", "op"), ("case", "case"), ("impl", "impl"), ("dtype", "dtype"), ("mode", "mode"),
            ("fwd_max_abs_err", "fwd err"), ("grad_max_abs_err", "grad err"), ("worst_ratio_to_tol", "err/tol"),
            ("fwd_vs_aten", "fwd Δaten"), ("grad_vs_aten", "grad Δaten"), ("nonfinite_ok", "nan/inf"), ("ok", "ok")]
    table = [[h for _, h in cols]]
    skipped = {}
    for r in result["rows"]:
        if r["skipped"]:
            skipped.setdefault((r["impl"], r["reason"]), 0)
            skipped[(r["impl"], r["reason"])] += 1
            continue
        table.append([_fmt(r[k]) for k, _ in cols])
    lines = _columns(table)
    lines.append("")
    gtable = [["op", "impl", "gradcheck (float64)", "opcheck", "ok"]]
    gtable += [[r["op"], r["impl"], _fmt(r["gradcheck"]), _fmt(r["opcheck"]), _fmt(r["ok"])]
               for r in result["autograd_rows"] if not r["skipped"]]
    lines += _columns(gtable)
    lines.append("")
    for (impl, reason), n in skipped.items():
        lines.append(f"skipped {impl}: {reason} ({n} rows)")
    tol = "; ".join(f"{k}: {v['abs_sum']:g}*S + {v['rel']:g}*|ref|" for k, v in result["tolerances"].items())
    lines.append(f"batch {result['batch']}; reference: {result['reference']}")
    lines.append(f"tolerances: {tol}")
    for r in result["rows"]:
        if r.get("note"):
            lines.append(f"note {r['op']}/{r['case']}/{r['impl']}/{r['dtype']}: {r['note']}")
    failed = [r for r in result["rows"] + result["autograd_rows"] if not r["ok"]]
    for r in failed:
        lines.append(f"FAILED {r['op']}/{r.get('case', '-')}/{r['impl']}/{r.get('dtype', 'float64')}: {r['reason']}")
    lines.append("all ok" if result["ok"] else f"{len(failed)} row(s) failed")
    return "\n".join(lines)
