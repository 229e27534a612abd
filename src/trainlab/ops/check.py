"""`trainlab ops check` (and its alias `trainlab gelu check`): every rung of every operator against a
float64 reference, a row per case, each row `ok`, `skipped (why)` or `FAIL`.

The reference is the aten rung evaluated in float64 on the *same* (already rounded) inputs, so an
error measures the kernel, not the rounding of the inputs. Tolerances (ops/ladder.py) are
elementwise, on finite reference values:  |err| <= atol * S + rtol * |ref|.

GELU (element-wise; a row per rung x approximation x dtype, ~4K random values plus the edge values
+-0, +-10, +-1e4, +-inf, NaN and denormals). S = 1 for the output and max|grad_out| for the
gradient. A row also records whether the NaN/inf pattern matches the reference; an empty tensor, a
0-dim tensor and a non-contiguous view; `gradcheck` and `gradgradcheck` (the double backward) in
float64; `torch.library.opcheck` of the registered C++ ops; and the handout's recipe — the same MSE
loss through F.gelu and through the rung, |loss1 - loss2| and the MSE between the input gradients.

conv2d, max_pool2d, linear, relu (a row per shape case x rung x dtype; the cases — LeNet-5's own
layer shapes, batch 1, non-square kernels, overlapping windows, strided inputs, NaN/inf/ties — live
in each operator's file). Each output element is a sum of products (conv, linear) or a selection
(pool, relu). S is the same computation on absolute values — conv(|x|, |W|) + |b| for a
convolution, the backward applied to |dy| for a gradient; a floating-point sum of k terms is within
k u S of the exact one (u = 2^-53, 2^-24). Max-pooling and relu select inputs, so S = |ref|
forward and their errors are 0 unless windows overlap. A row also has the max difference to ATen run in the row's own dtype (informative: both
round). A second table has, per operator and rung, `gradcheck` in float64 (small shapes; fast mode
for interpreted Triton) and `opcheck` of the registered forward op (cpp, triton, cuda).

Rows that cannot run here (no GPU for `cuda`, Triton not installed) are `skipped` with the reason,
`ok` null: never reported as passing. A check in which no row ran checked nothing and fails.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from trainlab.errors import ConfigError, UserError
from trainlab.ops import conv, conv_relu_pool, gelu_math, linear, pool, relu
from trainlab.ops.gelu import APPROXIMATIONS, EXTENSION as GELU_EXTENSION, gelu
from trainlab.ops.ladder import (DTYPES, IMPLS, REDUCED, TOLERANCES, Case, Tolerance, availability, dtype_name, mode,
                                 triton_interpreter_if_cpu)

LAYER_OPS = {"conv2d": conv, "max_pool2d": pool, "linear": linear, "relu": relu, "conv_relu_pool2d": conv_relu_pool}
OPS = ("gelu", *LAYER_OPS)
CASES: dict[str, list[Case]] = {op: module.CASES for op, module in LAYER_OPS.items()}
GELU_CASE = "elementwise"   # GELU's one case: random values and the edge values, every element checked
DEFAULT_DTYPES = {"gelu": ("float32", "float64", "bfloat16"), "layers": ("float32", "bfloat16")}


# ---- shared by every row ------------------------------------------------------------------------------

def compare(value: torch.Tensor, ref: torch.Tensor, tol: Tolerance, bound) -> dict:
    """Max abs error on the finite reference entries, max rel error where |ref| >= 1e-3, the worst
    ratio to the tolerance atol * bound + rtol * |ref| (bound: a tensor like ref, or a number),
    whether every entry is within it, and whether NaN/+-inf come out where the reference has them."""
    v, r = value.double().cpu(), ref.double().cpu()
    finite = torch.isfinite(r)
    nonfinite_ok = bool(torch.equal(torch.isnan(v), torch.isnan(r)) and torch.equal(v[torch.isinf(r)], r[torch.isinf(r)]))
    if not finite.any():
        return {"max_abs": 0.0, "max_rel": 0.0, "ratio": 0.0, "within": True, "nonfinite_ok": nonfinite_ok}
    d, ra = (v[finite] - r[finite]).abs(), r[finite].abs()
    s = bound.double().cpu()[finite] if isinstance(bound, torch.Tensor) else bound
    limit = tol.atol * s + tol.rtol * ra
    ratio = torch.where(d == 0, torch.zeros_like(d), d / limit.clamp_min(1e-300))
    # Relative error only where |ref| >= 1e-3: near a zero, outputs like 1e-23 are legitimately
    # flushed to 0 by float32/bf16 math, and "100 % relative error" there says nothing.
    big = ra >= 1e-3
    return {"max_abs": float(d.max()), "max_rel": float((d[big] / ra[big]).max()) if big.any() else 0.0,
            "ratio": float(ratio.max()), "within": bool((d <= limit).all()), "nonfinite_ok": nonfinite_ok}


def _guarded(row: dict, impl: str, body) -> dict:
    """Fill `row` by body(row, device) unless the rung cannot run here (then `skipped` with why);
    a kernel failure is recorded in the row, never raised."""
    skip, device = availability(impl)
    if skip:   # could not run here: neither a pass nor a failure
        row.update(ok=None, status="skipped", skipped=True, reason=skip)
        return row
    row.update(device=str(device), mode=mode(impl, device))
    t0 = time.perf_counter()
    try:
        with triton_interpreter_if_cpu(impl):
            body(row, device)
    except UserError as e:   # the rung cannot run here although the machine claims it can (toolchain)
        row.update(ok=False, reason=str(e))
    except Exception as e:   # a crashing kernel is a failed row, not a crashed check
        row.update(ok=False, reason=f"{type(e).__name__}: {e}")
    row["ok"] = bool(row["ok"])
    row["status"] = "ok" if row["ok"] else "FAIL"
    row["seconds"] = round(time.perf_counter() - t0, 3)
    return row


def _new_row(**fields) -> dict:
    return {**fields, "device": None, "mode": None, "ok": False, "status": "FAIL", "skipped": False, "reason": None,
            "note": None, "seconds": None}


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu(), b.double().cpu()
    finite = torch.isfinite(a) & torch.isfinite(b)
    return float((a[finite] - b[finite]).abs().max()) if finite.any() else 0.0


def verdict(rows: list[dict]) -> tuple[bool, str]:
    """(ok, the last line of a table). A check in which no row ran checked nothing: not ok."""
    ran = [r for r in rows if not r["skipped"]]
    failed = [r for r in ran if not r["ok"]]
    by_design = sum(1 for r in rows if r["skipped"] and r.get("by_design"))
    cannot = len(rows) - len(ran) - by_design
    tail = (f", {cannot} skipped (could not run here)" if cannot else "") + \
           (f", {by_design} not checked in reduced precision (unfused rungs of a fused op)" if by_design else "")
    if not ran:
        why = sorted({r["reason"] for r in rows if r["reason"]})
        return False, (f"nothing checked: 0 rows that ran{tail}" + (f" — {'; '.join(why)}" if why else
                                                                      " — no case matched the selection"))
    if failed:
        return False, f"{len(failed)} of {len(ran)} row(s) failed{tail}"
    return True, f"all ok ({len(ran)} rows that ran{tail})"


# ---- GELU: element-wise, a row per rung x approximation x dtype -----------------------------------------

def edge_values(dtype: torch.dtype) -> torch.Tensor:
    """+-0, large |x|, +-inf, NaN, denormals (the smallest subnormal and one just below normal)."""
    fi = torch.finfo(dtype)
    tiny = fi.smallest_normal
    vals = [0.0, -0.0, 10.0, -10.0, 1e4, -1e4, math.inf, -math.inf, math.nan,
            tiny / 2, -tiny / 2, tiny * fi.eps, -tiny * fi.eps, 1.0, -1.0, 3.0, -3.0, 5.0, -5.0]
    return torch.tensor(vals, dtype=torch.float64).to(dtype)


def _gelu_gradchecks(impl: str, approximate: str, device: torch.device) -> tuple[bool, bool]:
    """(gradcheck, gradgradcheck) of the rung in float64."""
    x = (torch.randn(24, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 3).to(device).requires_grad_()
    # Interpreted Triton costs ~0.1 s per call; fast_mode checks a random projection of the
    # Jacobian (2 evaluations instead of 2 per input element) — still fails on a wrong backward.
    kw = dict(eps=1e-6, atol=1e-5, rtol=1e-4, raise_exception=False, fast_mode=mode(impl, device) == "interpreted")
    fn = lambda t: gelu(t, impl=impl, approximate=approximate)  # noqa: E731
    return bool(torch.autograd.gradcheck(fn, (x,), **kw)), bool(torch.autograd.gradgradcheck(fn, (x,), **kw))


def _gelu_opcheck(dtype: torch.dtype, approximate: str, device: torch.device) -> bool:
    GELU_EXTENSION.load()
    x = torch.randn(3, 5, dtype=dtype, device=device, requires_grad=True)
    g = torch.randn(3, 5, dtype=dtype, device=device)
    r1 = torch.library.opcheck(torch.ops.trainlab.gelu_fwd.default, (x, approximate))
    r2 = torch.library.opcheck(torch.ops.trainlab.gelu_bwd.default, (g.requires_grad_(), x, approximate))
    r3 = torch.library.opcheck(torch.ops.trainlab.gelu_bwd2.default, (torch.randn_like(g).requires_grad_(), g, x, approximate))
    return all(v == "SUCCESS" for r in (r1, r2, r3) for v in r.values())


def _gelu_recipe(impl: str, approximate: str, dtype: torch.dtype, device: torch.device) -> dict:
    """The handout's test: same MSE loss via F.gelu and via the rung; losses and gradients agree."""
    gen = torch.Generator().manual_seed(2)
    x0 = torch.randn(100, dtype=torch.float32, generator=gen).to(dtype).to(device)
    target = torch.randn(100, dtype=torch.float32, generator=gen).to(dtype).to(device)
    x1 = x0.clone().requires_grad_()
    x2 = x0.clone().requires_grad_()
    loss1 = F.mse_loss(gelu_math.aten(x1, approximate).float(), target.float())
    loss2 = F.mse_loss(gelu(x2, impl=impl, approximate=approximate).float(), target.float())
    loss1.backward()
    loss2.backward()
    grad_mse = float(((x1.grad.double() - x2.grad.double()) ** 2).mean())
    tol = TOLERANCES["elementwise"][dtype]
    loss_diff = abs(float(loss1.detach()) - float(loss2.detach()))
    # "equal up to rounding": a few output ulps of the dtype, relative to the loss / gradient size.
    ok = (loss_diff <= 4 * tol.rtol * abs(float(loss1.detach())) + tol.atol
          and grad_mse <= (4 * tol.rtol) ** 2 * float((x1.grad.double() ** 2).mean()) + tol.atol ** 2)
    return {"recipe_loss_diff": loss_diff, "recipe_grad_mse": grad_mse, "recipe_ok": ok}


def gelu_row(impl: str, approximate: str, dtype: torch.dtype, n: int = 4096, seed: int = 0,
             run_opcheck: bool = True) -> dict:
    """One GELU row; never raises for a kernel failure (the row records it)."""
    tol = TOLERANCES["elementwise"][dtype]
    row = _new_row(op="gelu", case=GELU_CASE, impl=impl, approximate=approximate, dtype=dtype_name(dtype),
                   fwd_max_abs_err=None, fwd_max_rel_err=None, grad_max_abs_err=None, grad_max_rel_err=None,
                   edge_nonfinite_ok=None, empty_ok=None, scalar_ok=None, noncontig_ok=None, gradcheck=None,
                   gradgradcheck=None, opcheck=None, recipe_loss_diff=None, recipe_grad_mse=None,
                   vs_exact_max_abs=None, atol=tol.atol, rtol=tol.rtol)

    def body(row, device):
        call = lambda t: gelu(t, impl=impl, approximate=approximate)  # noqa: E731
        ref_of = lambda t: gelu_math.reference(t, approximate)  # noqa: E731
        gen = torch.Generator().manual_seed(seed)
        x = torch.cat([(torch.randn(n, dtype=torch.float64, generator=gen) * 3).to(dtype), edge_values(dtype)]).to(device)
        g = torch.randn(x.numel(), dtype=torch.float64, generator=gen).to(dtype).to(device)
        xr = x.detach().double().requires_grad_()
        ref = gelu_math.reference(xr, approximate)
        ref.backward(g.double())
        xi = x.detach().clone().requires_grad_()
        out = call(xi)
        out.backward(g)
        fe = compare(out.detach(), ref.detach(), tol, 1.0)
        ge = compare(xi.grad, xr.grad, tol, float(g.abs().max()))
        row.update(fwd_max_abs_err=fe["max_abs"], fwd_max_rel_err=fe["max_rel"], grad_max_abs_err=ge["max_abs"],
                   grad_max_rel_err=ge["max_rel"], edge_nonfinite_ok=fe["nonfinite_ok"] and ge["nonfinite_ok"],
                   # how far from x Phi(x): the kernel's error for "none", the approximation's otherwise
                   vs_exact_max_abs=gelu_math.error_vs_exact(out, x))
        # Layout corner cases: empty, 0-dim, and a strided (non-contiguous, non-dense) view.
        empty = call(torch.empty(0, 3, dtype=dtype, device=device))
        row["empty_ok"] = empty.shape == (0, 3) and empty.dtype == dtype
        s = torch.tensor(-0.75, dtype=dtype, device=device)
        s_out = call(s)
        row["scalar_ok"] = s_out.dim() == 0 and compare(s_out.reshape(1), ref_of(s).reshape(1), tol, 1.0)["within"]
        view = (torch.randn(16, 12, dtype=torch.float64, generator=gen) * 3).to(dtype).to(device).t()[:, ::2]
        assert not view.is_contiguous()
        v_out = call(view)
        row["noncontig_ok"] = v_out.shape == view.shape and compare(v_out, ref_of(view), tol, 1.0)["within"]
        if dtype == torch.float64:
            row["gradcheck"], row["gradgradcheck"] = _gelu_gradchecks(impl, approximate, device)
        if impl in ("cpp", "cuda") and run_opcheck and dtype in (torch.float32, torch.float64):
            row["opcheck"] = _gelu_opcheck(dtype, approximate, device)
        row.update(_gelu_recipe(impl, approximate, dtype, device))
        recipe_ok = row.pop("recipe_ok", True)
        edge_ok = row["edge_nonfinite_ok"]
        if impl == "aten" and not edge_ok:
            # F.gelu is the reference being measured, not a candidate: record its deviation from
            # float64 (on x86, float32/bf16 exact GELU goes through oneDNN and returns NaN at +inf),
            # but do not fail the check for it.
            row["note"] = "F.gelu's inf/NaN pattern differs from float64 F.gelu (torch behaviour, recorded only)"
            edge_ok = True
        row["ok"] = (fe["within"] and ge["within"] and edge_ok and row["empty_ok"] and row["scalar_ok"]
                     and row["noncontig_ok"] and row["gradcheck"] is not False and row["gradgradcheck"] is not False
                     and row["opcheck"] is not False and recipe_ok)
        if not row["ok"]:
            row["reason"] = "outside tolerance or a layout/edge case failed (see fields)"

    return _guarded(row, impl, body)


# ---- conv2d, max_pool2d, linear, relu: a row per shape case x rung x dtype ----------------------------

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
    if case.bound:
        return case.bound(inputs64, dy64)
    if case.bilinear:
        abs_inputs = {k: (v.abs() if isinstance(v, torch.Tensor) else v) for k, v in inputs64.items()}
        s_out, s_grads, _ = _run(case, abs_inputs, "aten", dy64.abs())
        return s_out, s_grads
    _, s_grads, _ = _run(case, inputs64, "aten", dy64.abs())   # the reference's routing, |dy|
    return ref_out.abs(), s_grads


def check_row(case: Case, impl: str, dtype: torch.dtype, batch: int = 8, seed: int = 0) -> dict:
    """One row of a layer operator's case; a kernel failure is recorded in the row, never raised."""
    row = _new_row(op=case.op, case=case.name, impl=impl, dtype=dtype_name(dtype), shapes=None, fwd_max_abs_err=None,
                   grad_max_abs_err=None, fwd_vs_aten=None, grad_vs_aten=None, worst_ratio_to_tol=None,
                   nonfinite_ok=None)

    if dtype in REDUCED and case.reduced_impls is not None and impl not in case.reduced_impls:
        row.update(ok=None, status="skipped", skipped=True, by_design=True,
                   reason=f"not checked in {dtype_name(dtype)}: this rung runs the ops one after another and rounds "
                          f"their intermediate results to {dtype_name(dtype)}, which moves the pooling's winners; "
                          f"checked in float32")
        return row

    def body(row, device):
        tol = TOLERANCES["sum"][dtype]
        base = case.make(batch, torch.Generator().manual_seed(seed))
        cast = {k: (v.to(dtype).to(device) if isinstance(v, torch.Tensor) else v) for k, v in base.items()}
        inputs = case.view(cast) if case.view else cast
        inputs64 = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
        row["shapes"] = {k: list(v.shape) for k, v in _tensors(inputs).items()}
        out, grads, dy64 = _run(case, inputs, impl, None)
        ref, ref_grads, _ = _run(case, inputs64, "aten", dy64)
        same, same_grads, _ = _run(case, inputs, "aten", dy64)
        s_out, s_grads = _bounds(case, inputs64, ref, dy64)
        cmp = [compare(out, ref, tol, s_out)] + [compare(grads[k], ref_grads[k], tol, s_grads[k]) for k in grads]
        row.update(
            fwd_max_abs_err=cmp[0]["max_abs"], grad_max_abs_err=max(c["max_abs"] for c in cmp[1:]),
            fwd_vs_aten=_max_diff(out, same), grad_vs_aten=max(_max_diff(grads[k], same_grads[k]) for k in grads),
            worst_ratio_to_tol=max(c["ratio"] for c in cmp),
            nonfinite_ok=all(c["nonfinite_ok"] for c in cmp) if case.edge else None)
        shape_ok = out.shape == ref.shape and out.dtype == dtype and all(grads[k].shape == inputs[k].shape for k in grads)
        row["ok"] = shape_ok and row["worst_ratio_to_tol"] <= 1.0 and row["nonfinite_ok"] is not False
        if impl == "aten" and not row["ok"] and shape_ok:
            # ATen is the reference being measured, not a candidate: record how far it is from
            # float64, do not fail the check for it (e.g. its bf16 pool backward sums in bf16).
            row["note"] = f"ATen itself is {row['worst_ratio_to_tol']:.1f}x the tolerance here (recorded, not failed)"
            row["ok"] = True
        if not row["ok"]:
            row["reason"] = ("wrong shape or dtype" if not shape_ok else
                             "NaN/inf pattern differs from ATen" if row["nonfinite_ok"] is False else
                             f"error {row['worst_ratio_to_tol']:.2f}x the tolerance")

    return _guarded(row, impl, body)


_REGISTERED = {"cpp": "", "cuda": "", "triton": "triton_"}   # op-name prefix of each registered family


def _opcheck(op: str, impl: str, device: torch.device) -> bool:
    inputs, _ = LAYER_OPS[op].gradcheck_case(torch.Generator().manual_seed(3))
    args = [t.float().to(device).requires_grad_() for t in inputs]
    fwd = getattr(torch.ops.trainlab, f"{_REGISTERED[impl]}{op}_fwd").default
    result = torch.library.opcheck(fwd, (*args, *LAYER_OPS[op].OPCHECK_EXTRA))
    return all(v == "SUCCESS" for v in result.values())


def autograd_row(op: str, impl: str) -> dict:
    """gradcheck in float64 and opcheck of the registered forward op, for one operator and rung."""
    row = _new_row(op=op, case="gradcheck", impl=impl, dtype="float64", gradcheck=None, opcheck=None)

    def body(row, device):
        inputs, fn = LAYER_OPS[op].gradcheck_case(torch.Generator().manual_seed(2))
        leaves = tuple(t.to(device).requires_grad_() for t in inputs)
        row["gradcheck"] = bool(torch.autograd.gradcheck(lambda *a: fn(*a, impl=impl), leaves, eps=1e-6, atol=1e-6,
                                                         rtol=1e-5, raise_exception=False,
                                                         fast_mode=mode(impl, device) == "interpreted"))
        if impl in getattr(LAYER_OPS[op], "REGISTERED", _REGISTERED):   # a rung with its own registered op
            row["opcheck"] = _opcheck(op, impl, device)
        row["ok"] = row["gradcheck"] is True and row["opcheck"] is not False
        if not row["ok"]:
            row["reason"] = "gradcheck failed" if not row["gradcheck"] else "opcheck failed"

    return _guarded(row, impl, body)


# ---- the whole check ---------------------------------------------------------------------------------------

def _choose(values, allowed, flag: str) -> list:
    for v in values:
        if v not in allowed:
            raise ConfigError(f"{flag} {v!r}: choose from {', '.join(allowed)}")
    return list(values)


def case_names(ops) -> list[str]:
    return [GELU_CASE] * ("gelu" in ops) + [c.name for op in ops if op in CASES for c in CASES[op]]


def run_gelu_check(impls=IMPLS, approximations=APPROXIMATIONS, dtypes=DEFAULT_DTYPES["gelu"], n: int = 4096,
                   progress=None) -> dict:
    """Every GELU row plus the tolerances; `ok` is False if a row failed or none ran."""
    rows = []
    for impl in _choose(impls, IMPLS, "--impl"):
        for approximate in _choose(approximations, APPROXIMATIONS, "--approximate"):
            for dname in _choose(dtypes, tuple(DTYPES), "--dtype"):
                rows.append(gelu_row(impl, approximate, DTYPES[dname], n=n))
                if progress:
                    progress(rows[-1])
    ok, _ = verdict(rows)
    return {"torch": torch.__version__,
            "tolerances": {k: {"atol": TOLERANCES["elementwise"][v].atol, "rtol": TOLERANCES["elementwise"][v].rtol}
                           for k, v in DTYPES.items()},
            "reference": "F.gelu in float64 on the same (rounded) inputs (sigmoid: x * sigmoid(1.702 x) in float64); "
                         "'vs exact': max |y - x Phi(x)|",
            "rows": rows, "ok": ok, "skipped": sum(r["skipped"] for r in rows)}


def run_layer_check(ops=tuple(LAYER_OPS), impls=IMPLS, dtypes=DEFAULT_DTYPES["layers"], cases=None, batch: int = 8,
                    progress=None) -> dict:
    """Every layer-operator row and autograd row; `ok` is False if a row failed or none ran.
    `cases` filters case names (None: all); an unknown name is a ConfigError."""
    ops, impls = _choose(ops, tuple(LAYER_OPS), "--op"), _choose(impls, IMPLS, "--impl")
    dtypes = _choose(dtypes, tuple(DTYPES), "--dtype")
    if cases:
        _choose(cases, case_names(ops), "--case")
    if batch < 1:
        raise ConfigError(f"--batch {batch}: expected a positive number of samples")
    rows, grad_rows = [], []
    for op in ops:
        chosen = [c for c in CASES[op] if not cases or c.name in cases]
        for case in chosen:
            for impl in impls:
                for dname in dtypes:
                    rows.append(check_row(case, impl, DTYPES[dname], batch=batch))
                    if progress:
                        progress(rows[-1])
        if chosen:
            grad_rows += [autograd_row(op, impl) for impl in impls]
    ok, _ = verdict(rows + grad_rows)
    tol = {k: {"abs_sum": TOLERANCES["sum"][v].atol, "rel": TOLERANCES["sum"][v].rtol} for k, v in DTYPES.items()}
    return {"torch": torch.__version__, "batch": batch, "tolerances": tol,
            "reference": "ATen in float64 on the same (rounded) inputs; tolerance |err| <= a*S + r*|ref| (S: the op on |inputs|)",
            "rows": rows, "autograd_rows": grad_rows, "ok": ok}


def run_check(ops=OPS, impls=IMPLS, dtypes=None, cases=None, approximations=APPROXIMATIONS, n: int = 4096,
              batch: int = 8, progress=None) -> dict:
    """The layer check for the layer operators in `ops` (top level, as ops_check.json has it) and the
    GELU check under "gelu" (None when gelu is not in `ops`). `ok` over both; no row at all is a failure."""
    ops = _choose(ops, OPS, "--op")
    if cases:
        _choose(cases, case_names(ops), "--case")
    layer_cases = [c for c in cases or () if c != GELU_CASE]
    layer_ops = [op for op in ops if op in LAYER_OPS and (not cases or any(c.name in layer_cases for c in CASES[op]))]
    gelu_runs = "gelu" in ops and (not cases or GELU_CASE in cases)
    result = run_layer_check(layer_ops, impls, dtypes or DEFAULT_DTYPES["layers"], layer_cases or None, batch, progress)
    result["gelu"] = run_gelu_check(impls, approximations, dtypes or DEFAULT_DTYPES["gelu"], n, progress) if gelu_runs else None
    all_rows = result["rows"] + result["autograd_rows"] + (result["gelu"]["rows"] if result["gelu"] else [])
    result["ok"], result["verdict"] = verdict(all_rows)
    return result


# ---- tables --------------------------------------------------------------------------------------------------

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


def _table(rows: list[dict], cols: list[tuple[str, str]]) -> list[str]:
    """The rows that ran as aligned columns, then one line per rung and reason that could not run."""
    lines = _columns([[h for _, h in cols]] + [[_fmt(r[k]) for k, _ in cols] for r in rows if not r["skipped"]])
    skipped: dict[tuple, int] = {}
    for r in rows:
        if r["skipped"]:
            skipped[(r["impl"], r["reason"])] = skipped.get((r["impl"], r["reason"]), 0) + 1
    return lines + [f"skipped: {reason} ({impl}, {n} rows)" for (impl, reason), n in skipped.items()]


def _row_name(r: dict) -> str:
    middle = r["approximate"] if r["op"] == "gelu" else r["case"]
    return f"{r['op']}/{middle}/{r['impl']}/{r['dtype']}"


def _notes_and_failures(rows: list[dict]) -> list[str]:
    return ([f"note {_row_name(r)}: {r['note']}" for r in rows if r.get("note")]
            + [f"FAILED {_row_name(r)}: {r['reason']}" for r in rows if r["ok"] is False])


def format_gelu_table(result: dict) -> str:
    cols = [("impl", "impl"), ("approximate", "approx"), ("dtype", "dtype"), ("mode", "mode"),
            ("fwd_max_abs_err", "fwd abs"), ("fwd_max_rel_err", "fwd rel"), ("grad_max_abs_err", "grad abs"),
            ("grad_max_rel_err", "grad rel"), ("edge_nonfinite_ok", "inf/nan"), ("noncontig_ok", "strided"),
            ("gradcheck", "gradchk"), ("gradgradcheck", "gradgrad"), ("opcheck", "opchk"), ("recipe_loss_diff", "|dloss|"),
            ("recipe_grad_mse", "grad mse"), ("vs_exact_max_abs", "vs exact"), ("ok", "ok")]
    tol = ", ".join(f"{k} atol {v['atol']:.0e} rtol {v['rtol']:.1e}" for k, v in result["tolerances"].items())
    lines = _table(result["rows"], cols) + [f"reference: {result['reference']}; tolerances: {tol}"]
    return "\n".join(lines + _notes_and_failures(result["rows"]) + [verdict(result["rows"])[1]])


def format_layer_table(result: dict) -> str:
    cols = [("op", "op"), ("case", "case"), ("impl", "impl"), ("dtype", "dtype"), ("mode", "mode"),
            ("fwd_max_abs_err", "fwd err"), ("grad_max_abs_err", "grad err"), ("worst_ratio_to_tol", "err/tol"),
            ("fwd_vs_aten", "fwd Δaten"), ("grad_vs_aten", "grad Δaten"), ("nonfinite_ok", "nan/inf"), ("ok", "ok")]
    gcols = [("op", "op"), ("impl", "impl"), ("gradcheck", "gradcheck (float64)"), ("opcheck", "opcheck"), ("ok", "ok")]
    tol = "; ".join(f"{k}: {v['abs_sum']:g}*S + {v['rel']:g}*|ref|" for k, v in result["tolerances"].items())
    lines = _table(result["rows"], cols) + [""] + _table(result["autograd_rows"], gcols) + [
        f"batch {result['batch']}; reference: {result['reference']}", f"tolerances: {tol}"]
    rows = result["rows"] + result["autograd_rows"]
    return "\n".join(lines + _notes_and_failures(rows) + [verdict(rows)[1]])


def format_table(result: dict) -> str:
    """The whole `ops check`: the layer tables (when a layer operator was asked for), then GELU's, then
    the one verdict over every row."""
    parts = []
    if result["rows"] or result["autograd_rows"]:
        parts.append(format_layer_table(result))
    if result["gelu"]:
        parts.append("GELU (trainlab gelu check):\n" + format_gelu_table(result["gelu"]))
    if len(parts) != 1:
        parts.append(result["verdict"])
    return "\n\n".join(parts)
