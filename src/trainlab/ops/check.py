"""`trainlab ops check` (and its alias `trainlab gelu check`): every rung of every operator in the
registry (ops/registry.py) against a float64 reference, a row per shape case x rung x dtype, each
row `ok`, `skipped (why)` or `FAIL`; every row of every operator has the same fields (ROW_FIELDS).

The reference is the aten rung evaluated in float64 on the *same* (already rounded) inputs, so an
error measures the kernel, not the rounding of the inputs. Tolerances (ops/ladder.py) are
elementwise, on finite reference values:  |err| <= atol * S + rtol * |ref|.

The cases live in each operator's folder (`CASES`): LeNet-5's own layer shapes, batch 1,
non-square kernels, overlapping windows, strided inputs, NaN/inf/ties; for GELU ~4K random values
plus the edge values +-0, +-10, +-1e4, +-inf, NaN and denormals, a strided view, a 0-dim and an
empty tensor, per approximation. S depends on what an output element is:
  * element-wise (gelu, the case's `tolerance` "elementwise"): S = 1 for the output and max|grad_out|
    for the gradient;
  * a sum of products (conv, linear): the same computation on absolute values — conv(|x|, |W|) + |b|
    for a convolution, the backward applied to |dy| for a gradient; a floating-point sum of k terms
    is within k u S of the exact one (u = 2^-53, 2^-24);
  * a selection (pool, relu): S = |ref| forward, and errors are 0 unless windows overlap.
A row also has the max difference to ATen run in the row's own dtype (informative: both round),
whether the NaN/inf pattern matches the reference (edge cases), and the checks a case adds of its
own (`checks`: GELU's is the handout's recipe — the same MSE loss through F.gelu and through the
rung, |loss1 - loss2| and the MSE between the input gradients). A second table has, per operator
and rung, `gradcheck` in float64 (small shapes; fast mode for interpreted Triton), `gradgradcheck`
for operators with a double backward, and `opcheck` of the registered ops (cpp, triton, cuda).

Every tensor the check hands to autograd must live on the rung's device (`grad`): a reference or a
bound computed on another device is a harness bug that only a GPU would otherwise reveal.

Rows that cannot run here (no GPU for `cuda`, Triton not installed) are `skipped` with the reason,
`ok` null: never reported as passing. A check in which no row ran checked nothing and fails.
"""

from __future__ import annotations

import time

import torch

from trainlab.device import ieee_float32
from trainlab.errors import ConfigError, UserError
from trainlab.ops import registry
from trainlab.ops.choices import IMPLS
from trainlab.ops.ladder import (
    DEFAULT_DTYPES,
    DTYPES,
    REDUCED,
    TOLERANCES,
    Case,
    Tolerance,
    availability,
    dtype_name,
    mode,
    triton_interpreter_if_cpu,
)

OPS = registry.OPS
CASES: dict[str, list[Case]] = {op: registry.module(op).CASES for op in OPS}
# The fields of every row, of every operator, in the case table and the autograd table alike.
ROW_FIELDS = (
    "op",
    "case",
    "impl",
    "dtype",
    "device",
    "mode",
    "shapes",
    "fwd_max_abs_err",
    "fwd_max_rel_err",
    "grad_max_abs_err",
    "grad_max_rel_err",
    "fwd_vs_aten",
    "grad_vs_aten",
    "worst_ratio_to_tol",
    "nonfinite_ok",
    "gradcheck",
    "gradgradcheck",
    "opcheck",
    "checks",
    "ok",
    "status",
    "skipped",
    "by_design",
    "reason",
    "note",
    "seconds",
)


# ---- shared by every row ------------------------------------------------------------------------------


def compare(value: torch.Tensor, ref: torch.Tensor, tol: Tolerance, bound) -> dict:
    """Max abs error on the finite reference entries, max rel error where |ref| >= 1e-3, the worst
    ratio to the tolerance atol * bound + rtol * |ref| (bound: a tensor like ref, or a number),
    whether every entry is within it, and whether NaN/+-inf come out where the reference has them."""
    v, r = value.double().cpu(), ref.double().cpu()
    finite = torch.isfinite(r)
    nonfinite_ok = bool(
        torch.equal(torch.isnan(v), torch.isnan(r)) and torch.equal(v[torch.isinf(r)], r[torch.isinf(r)])
    )
    if not finite.any():
        return {"max_abs": 0.0, "max_rel": 0.0, "ratio": 0.0, "within": True, "nonfinite_ok": nonfinite_ok}
    d, ra = (v[finite] - r[finite]).abs(), r[finite].abs()
    s = bound.double().cpu()[finite] if isinstance(bound, torch.Tensor) else bound
    limit = tol.atol * s + tol.rtol * ra
    ratio = torch.where(d == 0, torch.zeros_like(d), d / limit.clamp_min(1e-300))
    # Relative error only where |ref| >= 1e-3: near a zero, outputs like 1e-23 are legitimately
    # flushed to 0 by float32/bf16 math, and "100 % relative error" there says nothing.
    big = ra >= 1e-3
    return {
        "max_abs": float(d.max()),
        "max_rel": float((d[big] / ra[big]).max()) if big.any() else 0.0,
        "ratio": float(ratio.max()),
        "within": bool((d <= limit).all()),
        "nonfinite_ok": nonfinite_ok,
    }


def _guarded(row: dict, impl: str, body) -> dict:
    """Fill `row` by body(row, device) unless the rung cannot run here (then `skipped` with why);
    a kernel failure is recorded in the row, never raised."""
    skip, device = availability(impl)
    if skip:  # could not run here: neither a pass nor a failure
        row.update(ok=None, status="skipped", skipped=True, reason=skip)
        return row
    row.update(device=str(device), mode=mode(impl, device))
    t0 = time.perf_counter()
    try:
        with triton_interpreter_if_cpu(impl), ieee_float32():  # float32 tolerances: no TF32 (cuDNN's default)
            body(row, device)
    except UserError as e:  # the rung cannot run here although the machine claims it can (toolchain)
        row.update(ok=False, reason=str(e))
    except Exception as e:  # a crashing kernel is a failed row, not a crashed check
        row.update(ok=False, reason=f"{type(e).__name__}: {e}")
    row["ok"] = bool(row["ok"])
    row["status"] = "ok" if row["ok"] else "FAIL"
    row["seconds"] = round(time.perf_counter() - t0, 3)
    return row


def _new_row(**fields) -> dict:
    """A row with every field of ROW_FIELDS: None until measured."""
    return {**dict.fromkeys(ROW_FIELDS), **fields, "ok": False, "status": "FAIL", "skipped": False, "by_design": False}


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
    tail = (f", {cannot} skipped (could not run here)" if cannot else "") + (
        f", {by_design} not run by design (see the skipped lines)" if by_design else ""
    )
    if not ran:
        why = sorted({r["reason"] for r in rows if r["reason"]})
        return False, (
            f"nothing checked: 0 rows that ran{tail}"
            + (f" — {'; '.join(why)}" if why else " — no case matched the selection")
        )
    if failed:
        return False, f"{len(failed)} of {len(ran)} row(s) failed{tail}"
    return True, f"all ok ({len(ran)} rows that ran{tail})"


# ---- a row per shape case x rung x dtype ---------------------------------------------------------------


class DeviceMismatch(RuntimeError):
    """The check itself handed autograd a tensor that is not on the rung's device."""


def grad(outputs, inputs, grad_outputs, device: torch.device):
    """torch.autograd.grad, after checking that every tensor it is handed lives on `device` (the
    rung's): the one way the check and the cases' bounds take gradients."""
    tensors = [
        *(outputs if isinstance(outputs, (list, tuple)) else [outputs]),
        *inputs,
        *(grad_outputs if isinstance(grad_outputs, (list, tuple)) else [grad_outputs]),
    ]
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.device.type != torch.device(device).type:
            raise DeviceMismatch(
                f"check harness: a tensor handed to autograd is on {t.device}, the rung runs on "
                f"{device} (shape {list(t.shape)})"
            )
    return torch.autograd.grad(outputs, inputs, grad_outputs)


def _tensors(d: dict) -> dict:
    return {k: v for k, v in d.items() if isinstance(v, torch.Tensor)}


def _run(case: Case, inputs: dict, impl: str, dy: torch.Tensor | None, device: torch.device):
    """(output, {name: grad}, dy) with the grads of every tensor input, taken with `dy` — if None, a
    random one already rounded to the output's dtype (so the float64 reference sees the same dy),
    in float64 on the rung's device."""
    leaves = {k: v.detach().requires_grad_() for k, v in _tensors(inputs).items()}
    out = case.call({**inputs, **leaves}, impl)
    if dy is None:
        gen = torch.Generator().manual_seed(7)
        dy = torch.randn(out.shape, generator=gen, dtype=torch.float64).to(out.dtype).double().to(device)
    grads = grad(out, list(leaves.values()), dy.to(out.dtype), device)
    return out.detach(), dict(zip(leaves, grads)), dy


def _bounds(case: Case, inputs64: dict, ref_out, dy64, device) -> tuple[torch.Tensor, dict]:
    """S for the output and for each gradient (see the module docstring), in float64."""
    if case.bound:
        return case.bound(inputs64, dy64, lambda o, i, g: grad(o, i, g, device))
    if case.bilinear:
        abs_inputs = {k: (v.abs() if isinstance(v, torch.Tensor) else v) for k, v in inputs64.items()}
        s_out, s_grads, _ = _run(case, abs_inputs, "aten", dy64.abs(), device)
        return s_out, s_grads
    _, s_grads, _ = _run(case, inputs64, "aten", dy64.abs(), device)  # the reference's routing, |dy|
    return ref_out.abs(), s_grads


def _skipped_by_design(row: dict, case: Case, impl: str, dtype: torch.dtype) -> bool:
    if case.impls is not None and impl not in case.impls:
        row.update(
            ok=None,
            status="skipped",
            skipped=True,
            by_design=True,
            reason=f"this rung does not have what the case runs (only {', '.join(case.impls)} do)",
        )
        return True
    if dtype in REDUCED and case.reduced_impls is not None and impl not in case.reduced_impls:
        row.update(
            ok=None,
            status="skipped",
            skipped=True,
            by_design=True,
            reason=f"not checked in {dtype_name(dtype)}: this rung runs the ops one after another and rounds "
            f"their intermediate results to {dtype_name(dtype)}, which moves the pooling's winners; "
            f"checked in float32",
        )
        return True
    return False


def check_row(case: Case, impl: str, dtype: torch.dtype, batch: int = 8, seed: int = 0, n: int = 4096) -> dict:
    """One row of an operator's case; a kernel failure is recorded in the row, never raised.
    `batch` sizes the LeNet-shaped cases, `n` the element-wise ones (the case's `sized_by`)."""
    row = _new_row(op=case.op, case=case.name, impl=impl, dtype=dtype_name(dtype))
    if _skipped_by_design(row, case, impl, dtype):
        return row

    def body(row, device):
        tol = TOLERANCES[case.tolerance][dtype]
        base = case.make({"batch": batch, "n": n}[case.sized_by], torch.Generator().manual_seed(seed))
        cast = {k: (v.to(dtype).to(device) if isinstance(v, torch.Tensor) else v) for k, v in base.items()}
        inputs = case.view(cast) if case.view else cast
        inputs64 = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
        row["shapes"] = {k: list(v.shape) for k, v in _tensors(inputs).items()}
        out, grads, dy64 = _run(case, inputs, impl, None, device)
        ref, ref_grads, _ = _run(case, inputs64, "aten", dy64, device)
        same, same_grads, _ = _run(case, inputs, "aten", dy64, device)
        s_out, s_grads = _bounds(case, inputs64, ref, dy64, device)
        cmp = [compare(out, ref, tol, s_out)] + [compare(grads[k], ref_grads[k], tol, s_grads[k]) for k in grads]
        row.update(
            fwd_max_abs_err=cmp[0]["max_abs"],
            fwd_max_rel_err=cmp[0]["max_rel"],
            grad_max_abs_err=max(c["max_abs"] for c in cmp[1:]),
            grad_max_rel_err=max(c["max_rel"] for c in cmp[1:]),
            fwd_vs_aten=_max_diff(out, same),
            grad_vs_aten=max(_max_diff(grads[k], same_grads[k]) for k in grads),
            worst_ratio_to_tol=max(c["ratio"] for c in cmp),
            nonfinite_ok=all(c["nonfinite_ok"] for c in cmp) if case.edge else None,
        )
        shape_ok = (
            out.shape == ref.shape and out.dtype == dtype and all(grads[k].shape == inputs[k].shape for k in grads)
        )
        extra_ok = True
        if case.extra:
            row["checks"] = case.extra(impl, dtype, device)
            extra_ok = bool(row["checks"].pop("ok"))
        row["ok"] = shape_ok and row["worst_ratio_to_tol"] <= 1.0 and row["nonfinite_ok"] is not False and extra_ok
        if impl == "aten" and not row["ok"] and shape_ok:
            # ATen is the reference being measured, not a candidate: record how far it is from
            # float64, do not fail the check for it (e.g. its bf16 pool backward sums in bf16; on x86
            # float32/bf16 exact GELU goes through oneDNN and returns NaN at +inf).
            row["note"] = (
                f"ATen itself is {row['worst_ratio_to_tol']:.1f}x the tolerance here"
                + (", its NaN/inf pattern differs from float64" if row["nonfinite_ok"] is False else "")
                + " (recorded, not failed)"
            )
            row["ok"] = True
        if not row["ok"]:
            row["reason"] = (
                "wrong shape or dtype"
                if not shape_ok
                else "NaN/inf pattern differs from ATen"
                if row["nonfinite_ok"] is False
                else f"error {row['worst_ratio_to_tol']:.2f}x the tolerance"
                if row["worst_ratio_to_tol"] > 1.0
                else f"its own check failed ({', '.join(f'{k} {_fmt(v)}' for k, v in row['checks'].items())})"
            )

    return _guarded(row, impl, body)


_REGISTERED = {"cpp": "", "cuda": "", "triton": "triton_"}  # op-name prefix of each registered family


def _opcheck(op: str, impl: str, device: torch.device) -> bool:
    module = registry.module(op)
    if hasattr(module, "opcheck"):  # an operator with several registered ops checks them itself
        return module.opcheck(impl, device)
    inputs, _ = module.gradcheck_case(torch.Generator().manual_seed(3))
    args = [t.float().to(device).requires_grad_() for t in inputs]
    fwd = getattr(torch.ops.trainlab, f"{_REGISTERED[impl]}{op}_fwd").default
    result = torch.library.opcheck(fwd, (*args, *module.OPCHECK_EXTRA))
    return all(v == "SUCCESS" for v in result.values())


def autograd_row(op: str, impl: str) -> dict:
    """gradcheck (and gradgradcheck) in float64 and opcheck of the registered ops, for one operator and rung."""
    module = registry.module(op)
    row = _new_row(op=op, case="gradcheck", impl=impl, dtype="float64")

    def body(row, device):
        inputs, fn = module.gradcheck_case(torch.Generator().manual_seed(2))
        leaves = tuple(t.to(device).requires_grad_() for t in inputs)
        # Interpreted Triton costs ~0.1 s per call; fast_mode checks a random projection of the
        # Jacobian (2 evaluations instead of 2 per input element) — still fails on a wrong backward.
        kw = dict(eps=1e-6, atol=1e-6, rtol=1e-5, raise_exception=False, fast_mode=mode(impl, device) == "interpreted")
        call = lambda *a: fn(*a, impl=impl)  # noqa: E731
        row["gradcheck"] = bool(torch.autograd.gradcheck(call, leaves, **kw))
        if getattr(module, "DOUBLE_BACKWARD", False):
            row["gradgradcheck"] = bool(torch.autograd.gradgradcheck(call, leaves, **kw))
        if impl in getattr(module, "REGISTERED", _REGISTERED):  # a rung with its own registered op
            row["opcheck"] = _opcheck(op, impl, device)
        row["ok"] = row["gradcheck"] is True and row["gradgradcheck"] is not False and row["opcheck"] is not False
        if not row["ok"]:
            row["reason"] = (
                "gradcheck failed"
                if not row["gradcheck"]
                else "gradgradcheck failed"
                if row["gradgradcheck"] is False
                else "opcheck failed"
            )

    return _guarded(row, impl, body)


# ---- the whole check ---------------------------------------------------------------------------------------


def _choose(values, allowed, flag: str) -> list:
    for v in values:
        if v not in allowed:
            raise ConfigError(f"{flag} {v!r}: choose from {', '.join(allowed)}")
    return list(values)


def case_names(ops) -> list[str]:
    return [c.name for op in ops for c in CASES[op]]


def run_check(
    ops=OPS, impls=IMPLS, dtypes=None, cases=None, variants=None, n: int = 4096, batch: int = 8, progress=None
) -> dict:
    """Every row of the operators in `ops` (case rows, then one autograd row per operator and rung);
    `ok` is False if a row failed or none ran. `dtypes` None: each operator's own DTYPES. `cases`
    filters case names and `variants` the cases' variants (GELU's approximations); None: all."""
    ops, impls = _choose(ops, OPS, "--op"), _choose(impls, IMPLS, "--impl")
    if dtypes:
        _choose(dtypes, tuple(DTYPES), "--dtype")
    if cases:
        _choose(cases, case_names(ops), "--case")
    if batch < 1:
        raise ConfigError(f"--batch {batch}: expected a positive number of samples")
    rows, grad_rows = [], []
    for op in ops:
        chosen = [
            c
            for c in CASES[op]
            if (not cases or c.name in cases) and (not variants or c.variant is None or c.variant in variants)
        ]
        for case in chosen:
            for impl in impls:
                for dname in dtypes or getattr(registry.module(op), "DTYPES", DEFAULT_DTYPES):
                    rows.append(check_row(case, impl, DTYPES[dname], batch=batch, n=n))
                    if progress:
                        progress(rows[-1])
        if chosen:
            grad_rows += [autograd_row(op, impl) for impl in impls]
    ok, line = verdict(rows + grad_rows)
    tol = {
        family: {dtype_name(d): {"atol": t.atol, "rtol": t.rtol} for d, t in by_dtype.items()}
        for family, by_dtype in TOLERANCES.items()
    }
    return {
        "torch": torch.__version__,
        "ops": ops,
        "batch": batch,
        "n": n,
        "tolerances": tol,
        "reference": "ATen in float64 on the same (rounded) inputs; tolerance |err| <= atol*S + rtol*|ref| "
        "(S: 1 element-wise, else the op on |inputs|)",
        "rows": rows,
        "autograd_rows": grad_rows,
        "ok": ok,
        "verdict": line,
        "skipped": sum(r["skipped"] for r in rows + grad_rows),
    }


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
    return f"{r['op']}/{r['case']}/{r['impl']}/{r['dtype']}"


def _notes_and_failures(rows: list[dict]) -> list[str]:
    return [f"note {_row_name(r)}: {r['note']}" for r in rows if r.get("note")] + [
        f"FAILED {_row_name(r)}: {r['reason']}" for r in rows if r["ok"] is False
    ]


def format_table(result: dict) -> str:
    """The case table, the autograd table, notes and failures, then the one verdict over every row."""
    cols = [
        ("op", "op"),
        ("case", "case"),
        ("impl", "impl"),
        ("dtype", "dtype"),
        ("mode", "mode"),
        ("fwd_max_abs_err", "fwd err"),
        ("grad_max_abs_err", "grad err"),
        ("worst_ratio_to_tol", "err/tol"),
        ("fwd_vs_aten", "fwd Δaten"),
        ("grad_vs_aten", "grad Δaten"),
        ("nonfinite_ok", "nan/inf"),
        ("ok", "ok"),
    ]
    gcols = [
        ("op", "op"),
        ("impl", "impl"),
        ("gradcheck", "gradcheck (float64)"),
        ("gradgradcheck", "gradgradcheck"),
        ("opcheck", "opcheck"),
        ("ok", "ok"),
    ]
    tol = "; ".join(
        f"{family} {d}: {v['atol']:g}*S + {v['rtol']:g}*|ref|"
        for family, by_dtype in result["tolerances"].items()
        for d, v in by_dtype.items()
    )
    rows = result["rows"] + result["autograd_rows"]
    own = [
        f"{_row_name(r)}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in r["checks"].items())
        for r in result["rows"]
        if r.get("checks")
    ]
    lines = (
        _table(result["rows"], cols)
        + [""]
        + _table(result["autograd_rows"], gcols)
        + (
            ["", "checks of a case's own (GELU: the handout's recipe, |Δloss| and gradient MSE vs F.gelu):"] + own
            if own
            else []
        )
        + [f"batch {result['batch']}, n {result['n']}; reference: {result['reference']}", f"tolerances: {tol}"]
    )
    return "\n".join(lines + _notes_and_failures(rows) + [verdict(rows)[1]])
