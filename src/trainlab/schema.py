"""One reader for every JSON file trainlab reads back, and the schemas that say what each must hold.

Every JSON that trainlab wrote and later reads again (a lab's results.json, a run's summary.json,
config.json and metrics.jsonl, a worker's spec, a pack's or cache's manifest, a sweep.json) may have
been edited, truncated or replaced by the time it is read. So it is read here, one way:

- at most `MAX_JSON_BYTES` (a file's size is checked before it is read, and the read stops at the cap:
  a 1 GiB metrics.jsonl costs nothing), never a FIFO or device (`io.read_capped`);
- parsed with NaN/Infinity refused and at most `MAX_DEPTH` levels of nesting (a list nested 200,000
  deep is one line, not a `RecursionError`);
- refused when a string holds a lone surrogate (`"\\udc80"`: not text, and it cannot be written into a
  page or a figure; trainlab never writes one);
- checked against its schema when the caller gives one: each key's type, and a length cap on lists,
  so a bad key is one line naming the file and the key path (`results.json: 'steps'['lenet_train']
  must be an object, found "ok"`), never a traceback somewhere later.

A schema is a tree of `Spec`s: `NUMBER`, `INT`, `STR`, `BOOL`, `ANY`, `Opt(spec)`, `ListOf(spec,
max_len)`, `DictOf(spec)` (an object with any keys) and `Obj({key: spec}, required=(...))` (an object
whose named keys are checked; other keys pass, so a producer may add fields).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any

from trainlab.errors import UserError
from trainlab.text import lone_surrogate, shown

MAX_JSON_BYTES = 64 * 2**20  # larger than any file trainlab writes (a long run's metrics.jsonl: a few MB)
MAX_DEPTH = 64  # trainlab's own files nest 6 levels at most
MAX_SECONDS = 1e9  # ~31 years: more than any run or timeout, far below timedelta's limit (~8.6e13 s)


class Spec:
    """A value's expected type: `what` names it in messages, `test` accepts it."""

    def __init__(self, what: str, test: Callable[[Any], bool] = lambda v: True):
        self.what, self.test = what, test


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def between(lo: float, hi: float, what: str = "a number") -> Spec:
    """A finite number in [lo, hi]: a counter read back (seconds, steps) whose range the code relies on."""
    return Spec(f"{what} from {lo:g} to {hi:g}", lambda v: _is_number(v) and lo <= v <= hi)


ANY = Spec("anything")
NUMBER = Spec("a number", _is_number)
INT = Spec("an integer", lambda v: isinstance(v, int) and not isinstance(v, bool))
STR = Spec("a string", lambda v: isinstance(v, str))
BOOL = Spec("true or false", lambda v: isinstance(v, bool))


class Opt(Spec):
    """`inner` or null."""

    def __init__(self, inner: Spec):
        super().__init__(f"{inner.what} or null")
        self.inner = inner


class ListOf(Spec):
    """A list of at most `max_len` items, each `item`."""

    def __init__(self, item: Spec = ANY, max_len: int = 1_000_000):
        super().__init__(f"a list (each {item.what})" if item is not ANY else "a list", lambda v: isinstance(v, list))
        self.item, self.max_len = item, max_len


class DictOf(Spec):
    """An object with any keys, each value `item`."""

    def __init__(self, item: Spec = ANY):
        super().__init__("an object", lambda v: isinstance(v, dict))
        self.item = item


class Obj(Spec):
    """An object: the listed keys checked (those in `required` must be there), others passed through."""

    def __init__(self, keys: dict, required: tuple = (), what: str = "an object"):
        super().__init__(what, lambda v: isinstance(v, dict))
        self.keys, self.required = keys, tuple(required)


def _show(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (str, int, float, bool, type(None))) else type(value).__name__
    return text if len(text) <= 60 else text[:57] + "…"


def _key(path: str, k: Any) -> str:
    return f"{path}[{k!r}]" if path else repr(k)


def check(value: Any, spec: Spec, where: str, path: str = "") -> Any:
    """`value` if it fits `spec`; else a one-line `UserError`: `WHERE: KEYPATH must be WHAT, found X`."""

    def fail(what: str, found: str) -> UserError:
        return UserError(
            f"{where}: {path} must be {what}, found {found}" if path else f"{where}: expected {what}, found {found}"
        )

    if isinstance(spec, Opt):
        return value if value is None else check(value, spec.inner, where, path)
    if not spec.test(value):
        raise fail(
            spec.what if path else spec.what.replace("an object", "a JSON object"),
            _show(value) if path else type(value).__name__,
        )
    if isinstance(spec, ListOf):
        if len(value) > spec.max_len:
            raise fail(f"{spec.what} with at most {spec.max_len:,} items", f"{len(value):,}")
        if spec.item is not ANY:
            for i, item in enumerate(value):
                check(item, spec.item, where, f"{path}[{i}]" if path else f"[{i}]")
    elif isinstance(spec, DictOf) and spec.item is not ANY:
        for k, item in value.items():
            check(item, spec.item, where, _key(path, k))
    elif isinstance(spec, Obj):
        for k in spec.required:
            if k not in value:
                raise UserError(f"{where}: {_key(path, k)} is missing")
        for k, sub in spec.keys.items():
            if k in value:
                check(value[k], sub, where, _key(path, k))
    return value


# ----------------------------------------------------------------------------- parsing


def _no_constant(token: str):
    raise ValueError(f"holds {token}, which is not JSON (trainlab writes null for 'no value')")


def _too_deep(value: Any, limit: int) -> bool:
    """Whether `value` nests more than `limit` containers deep (iterative: no recursion to run out of)."""
    stack = [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            if depth > limit:
                return True
            stack.extend(
                (c, depth + 1) for c in (v.values() if isinstance(v, dict) else v) if isinstance(c, (dict, list))
            )
    return False


def loads(text: str, where: str = "JSON", max_depth: int = MAX_DEPTH) -> Any:
    """`json.loads` that refuses NaN/Infinity (as `io.to_json` refuses to write them) and nesting deeper
    than `max_depth`. Errors are one `UserError` line starting with `where`."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        value = None
    except json.JSONDecodeError as e:
        raise UserError(f"{where}: not valid JSON ({e})") from None
    except ValueError as e:  # NaN / Infinity
        raise UserError(f"{where}: {e}") from None
    else:
        if not _too_deep(value, max_depth):
            if re.search(r"\\u[dD][89a-fA-F]", text) or lone_surrogate(text) is not None:
                _refuse_surrogates(value, where)
            return value
    raise UserError(f"{where}: nested deeper than {max_depth} levels; not a file trainlab wrote")


def _refuse_surrogates(value: Any, where: str) -> None:
    """One line naming the first string (key or value) that holds a lone surrogate (iterative walk)."""
    stack = [(value, "")]
    while stack:
        v, path = stack.pop()
        if isinstance(v, str):
            if lone_surrogate(v) is not None:
                at = f"{path} " if path else ""
                raise UserError(
                    f"{where}: {at}holds a lone surrogate ({shown(v)[:60]}), which is not text; "
                    "not a file trainlab wrote"
                )
        elif isinstance(v, dict):
            for k, item in v.items():
                stack.append((k, path))
                stack.append((item, _key(path, k)))
        elif isinstance(v, list):
            stack.extend((item, f"{path}[{i}]") for i, item in enumerate(v))
