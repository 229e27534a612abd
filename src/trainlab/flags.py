"""Typed command configs: one dataclass per command; its CLI flags and its JSON follow from its fields.

A field is declared once, with its default and its help:

    @dataclass
    class BenchConfig(Config):
        steps: int = opt(10, "timed optimizer steps")

- `add_flags(parser, BenchConfig)` adds `--steps` (type from the annotation, help from the field, booleans
  as `--x/--no-x`). Every flag defaults to None, so `explicit_values(args, BenchConfig)` knows which values
  the user gave; the dataclass (or a preset, or a resumed run's saved config) supplies the rest.
- `BenchConfig.from_dict(d, source=path)` rebuilds a config from JSON with its types checked: a hand-edited
  config.json with a string where a number belongs is one error line naming the file and the key, not a
  crash deep inside training.
- `opt(..., check=positive)` declares a field's range (or choices, or an output path); `cfg.validate()`
  applies every declared check and names the flag: `--lr nan: expected a finite number > 0`. Each
  command config extends `validate()` with the checks that span several fields. The CLI calls it before
  any data is loaded or worker started, and the worker calls it again on the config it was handed.
- Worker processes receive the resolved config as JSON (`distributed.launch`), never as a command line.

Every parser is a `Parser`: its help cannot crash on a `%` in a help text (`HelpFormatter` escapes any
`%` that is not an argparse placeholder) and names each flag's default once, and a mistyped flag gets
the subcommand's usage, one `trainlab: error:` line and the nearest real flag (`--lr-rate` → `--lr`).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import math
import re
import sys
import types
import typing
from collections.abc import Callable
from typing import Any

from trainlab.errors import ConfigError
from trainlab.io import output_problem
from trainlab.schema import MAX_SECONDS

_PLACEHOLDER = re.compile(r"%%|%\(\w+\)[a-z]|%")
_NO_DEFAULT = (None, False, argparse.SUPPRESS)


def _has_default(action: argparse.Action) -> bool:
    return action.default not in _NO_DEFAULT and action.default != [] and action.option_strings != []


class HelpFormatter(argparse.HelpFormatter):
    """Help text is data: a bare `%` is printed as is (argparse would %-format it and crash), and a flag
    whose default its text does not name gets `(default: X)` once."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        text = _PLACEHOLDER.sub(lambda m: m.group(0) if len(m.group(0)) > 1 else "%%", text)
        if _has_default(action) and "default:" not in text:
            text += " (default: %(default)s)"
        return text


class Parser(argparse.ArgumentParser):
    """trainlab's argparse: safe help (`HelpFormatter`), errors as one `trainlab: error:` line after the
    usage of the subcommand at fault, and a "did you mean" for a flag it does not know."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        self.print_usage(sys.stderr)
        self.exit(
            2,
            f"trainlab: error: {self.prog.removeprefix('trainlab ')}: {message}\n"
            if self.prog != "trainlab"
            else f"trainlab: error: {message}\n",
        )

    def parse_args(self, args=None, namespace=None):
        parsed, unknown = self.parse_known_args(args, namespace)
        if unknown:
            target = innermost_parser(self, parsed)
            target.error(
                "; ".join(_unknown_line(target, u) for u in unknown if u.startswith("-"))
                or f"unexpected arguments: {' '.join(unknown)}"
            )
        return parsed


def innermost_parser(parser: argparse.ArgumentParser, ns: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command parser `ns` was parsed by: `trainlab dp compare …` → the `compare` parser."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = getattr(ns, action.dest, None)
            if chosen in action.choices:
                return innermost_parser(action.choices[chosen], ns)
    return parser


def _unknown_line(parser: argparse.ArgumentParser, token: str) -> str:
    name = token.split("=", 1)[0]
    flags = [o for a in parser._actions for o in a.option_strings if o.startswith("--") and a.help != argparse.SUPPRESS]
    near = [f for f in flags if name.startswith(f + "-")] or difflib.get_close_matches(name, flags, n=1, cutoff=0.6)
    return (
        f"unrecognized argument {name}"
        + (f" (did you mean {near[0]}?)" if near else "")
        + f"; `{parser.prog} --help` lists the flags"
    )


# A check takes a field's value and returns what is wrong with it (None when nothing is).
Check = Callable[[Any], "str | None"]


def opt(
    default: Any,
    help: str,
    *,
    flag: str | None = None,
    choices: tuple | list | None = None,
    metavar: str | None = None,
    cli: bool = True,
    check: Check | None = None,
) -> Any:
    """A config field: its default, its help text, how it appears on the command line, and its check.

    `flag` overrides the derived `--field-name`; `cli=False` keeps a field out of the command line
    (set by the program, recorded in the JSON); `check` (e.g. `positive`, `at_least(0)`, `one_of(...)`,
    `output_dir`) is applied by `Config.validate()` to any value but None."""
    return dataclasses.field(
        default=default,
        metadata={"help": help, "flag": flag, "choices": choices, "metavar": metavar, "cli": cli, "check": check},
    )


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def between(lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, hi_open: bool = False) -> Check:
    """A finite number in the given range (NaN and ±inf always fail)."""
    parts = ([f"{'>' if lo_open else '>='} {lo:g}"] if lo is not None else []) + (
        [f"{'<' if hi_open else '<='} {hi:g}"] if hi is not None else []
    )
    expected = "expected a finite number" + (" " + " and ".join(parts) if parts else "")

    def check(v: Any) -> str | None:
        ok = _is_number(v) and math.isfinite(v)
        ok = (
            ok and (lo is None or (v > lo if lo_open else v >= lo)) and (hi is None or (v < hi if hi_open else v <= hi))
        )
        return None if ok else expected

    return check


def at_least(lo: int) -> Check:
    """An integer >= lo (counts, sizes, steps)."""

    def check(v: Any) -> str | None:
        return None if isinstance(v, int) and not isinstance(v, bool) and v >= lo else f"expected an integer >= {lo}"

    return check


def int_range(lo: int, hi: int) -> Check:
    """An integer >= lo and <= hi (a count whose upper bound is what could ever finish)."""

    def check(v: Any) -> str | None:
        ok = isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi
        return None if ok else f"expected an integer >= {lo} and <= {hi:,}"

    return check


def process_count(lo: int) -> Check:
    """An integer >= lo and at most `hardware.process_limit()` (ranks or workers this machine can run)."""

    def check(v: Any) -> str | None:
        from trainlab.hardware import PROCESSES_PER_CORE, cpu_cores, process_limit

        problem = at_least(lo)(v)
        if problem is None and v > process_limit():
            return (
                f"expected an integer >= {lo} and <= {process_limit()} ({PROCESSES_PER_CORE} per CPU core; "
                f"this machine has {cpu_cores()})"
            )
        return problem

    return check


def thread_count(v: Any) -> str | None:
    """torch CPU threads (every --threads): an integer >= 1 and at most the CPUs this process may run on.
    More only oversubscribe them (OpenMP threads spin waiting for a core, and timings measure the wait);
    100,000 would exhaust the process's thread limit."""
    from trainlab.hardware import cpu_cores

    problem = at_least(1)(v)
    if problem is None and v > cpu_cores():
        return f"expected an integer >= 1 and <= {cpu_cores()} (this machine's CPUs)"
    return problem


# Seeds are 32-bit: numpy's generators and the loaders' per-sample streams take no more.
SEED_MAX = 2**32 - 1


def seed_value(v: Any) -> str | None:
    ok = isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= SEED_MAX
    return None if ok else f"expected an integer >= 0 and <= {SEED_MAX} (2^32 - 1)"


positive = between(0, lo_open=True)  # a finite number > 0 (rates, seconds)
timeout_seconds = between(0, MAX_SECONDS, lo_open=True)  # a duration that timedelta (and every clock) can hold
non_negative = between(0)  # a finite number >= 0 (weight decay, warm-up)


def one_of(choices) -> Check:
    """One of `choices` (any iterable of names, e.g. a registry dict)."""

    def check(v: Any) -> str | None:
        names = list(choices)
        return None if v in names else f"expected one of {', '.join(map(str, names))}"

    return check


class names_of:
    """The names of a registry in a module that imports torch, read only when a value is checked, so that
    a config (and its flags, and `--help`) imports nothing heavy: `one_of(names_of("pkg.mod:REGISTRY"))`.
    `extra` names come first (`names_of("trainlab.lenet.plan:STEP_MODES", "auto")`)."""

    def __init__(self, where: str, *extra: str):
        self.where, self.extra = where, extra

    def __iter__(self):
        import importlib

        module, name = self.where.split(":")
        yield from self.extra
        yield from getattr(importlib.import_module(module), name)


def output_dir(v: Any) -> str | None:
    """A directory trainlab may create or write into."""
    return output_problem(v, "dir")


def output_file(v: Any) -> str | None:
    """A file trainlab may create or replace."""
    return output_problem(v, "file")


def json_output(v: Any) -> str | None:
    """`--json PATH|-` (every command): a file trainlab may write atomically, or `-` for stdout
    (`io.write_json_output` does either)."""
    return None if v == "-" else output_file(v)


def json_opt(help: str) -> Any:
    """The `--json PATH|-` field of a config: `help` says what is written there and what `-` does."""
    return opt(None, help, metavar="PATH", check=json_output)


def check_value(value: Any, check: Check, flag: str) -> None:
    """Apply one check outside a dataclass (a positional argument, a value derived from a flag)."""
    problem = check(value)
    if problem is not None:
        raise ConfigError(f"{flag} {_show(value)}: {problem}")


def _show(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value) if _is_number(value) else repr(value)


def _field_type(cls, f: dataclasses.Field) -> tuple[Any, bool]:
    """(base type, optional?) of a field: `int | None` → (int, True); `list[str]` → (list[str], False)."""
    hint = typing.get_type_hints(cls)[f.name]
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return args[0], len(args) < len(typing.get_args(hint))
    return hint, False


def flag_name(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


def cli_fields(cls, exclude=()) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(cls) if f.metadata.get("cli", False) and f.name not in exclude]


def add_flags(parser: argparse.ArgumentParser, cls, exclude=(), defaults: Any = None) -> None:
    """One flag per CLI field of `cls` (all defaulting to None; see `explicit_values`). The help text
    shows the default of `defaults` (an instance, e.g. after a preset) or of the dataclass."""
    for f in cli_fields(cls, exclude):
        typ, _ = _field_type(cls, f)
        meta = f.metadata
        default = getattr(defaults, f.name) if defaults is not None else f.default
        help_ = meta["help"] + (
            f" (default: {default})"
            if default not in (None, False, dataclasses.MISSING) and "default:" not in meta["help"]
            else ""
        )  # a text naming its own default keeps it
        kw: dict[str, Any] = {"dest": f.name, "default": None, "help": help_}
        if typ is bool:
            kw["action"] = argparse.BooleanOptionalAction
        elif typing.get_origin(typ) is list:
            kw.update(action="append", type=typing.get_args(typ)[0])
        else:
            kw["type"] = typ
        if meta.get("choices") is not None:
            kw["choices"] = list(meta["choices"])
        if typ is not bool and meta.get("choices") is None:
            kw["metavar"] = meta.get("metavar") or flag_name(f).lstrip("-").upper().replace("-", "_")
        parser.add_argument(flag_name(f), **kw)


def add_command(subparsers, name: str, help: str, cls, func, exclude=()) -> argparse.ArgumentParser:
    """A subcommand whose flags are the CLI fields of `cls` and which runs `func(args)`."""
    p = subparsers.add_parser(name, help=help, description=help[:1].upper() + help[1:] + ".")
    add_flags(p, cls, exclude)
    p.set_defaults(func=func)
    return p


def add_list_flags(parser: argparse.ArgumentParser, cls, exclude=()) -> None:
    """One flag per CLI field of `cls` that takes a comma-separated list of values to sweep
    (`--lr 1e-3,2e-3`, `--optimizer adam,sgd`, `--augment true,false`; a lone `--augment` is `true`,
    `--no-augment` is `false`). Parse them with `list_values`."""
    for f in cli_fields(cls, exclude):
        typ, _ = _field_type(cls, f)
        if typing.get_origin(typ) is list:
            continue  # a list-valued setting has no unambiguous comma-separated sweep
        meta, name = f.metadata, flag_name(f)
        choices = f" from {{{','.join(map(str, meta['choices']))}}}" if meta.get("choices") else ""
        own = "default:" in meta["help"] or f.default is None  # the text names its default, or there is none
        help_ = f"{meta['help']} — one or more values{choices}, comma-separated" + (
            "" if own else f" (default: {f.default})"
        )
        if typ is bool:
            parser.add_argument(
                name, dest=f.name, nargs="?", const="true", default=None, metavar="true,false", help=help_
            )
            parser.add_argument(
                "--no-" + name[2:], dest=f.name, action="store_const", const="false", help=argparse.SUPPRESS
            )
        else:
            parser.add_argument(name, dest=f.name, default=None, metavar="V[,V...]", help=help_)


def to_argv(cfg, defaults: Any = None, exclude=(), nested: dict[str, tuple] | None = None) -> list[str]:
    """The flags a user types to get `cfg`: the inverse of `add_flags` + `explicit_values` (round-trip tested
    in tests/test_lab_commands.py). One flag per CLI field whose value differs from `defaults` (an instance:
    after a preset, say; default the dataclass's own defaults), in field order; `nested` names a field that
    holds another config (`gpt compare`'s bench) and the flags of it the command leaves out."""
    base = defaults if defaults is not None else type(cfg)()
    argv: list[str] = []
    for f in cli_fields(type(cfg), exclude):
        value = getattr(cfg, f.name)
        if value == getattr(base, f.name):
            continue
        name, (typ, _) = flag_name(f), _field_type(type(cfg), f)
        if value is None:
            raise ValueError(f"{name}: None differs from the default {getattr(base, f.name)!r} and has no flag")
        if typ is bool:
            argv.append(name if value else "--no-" + name[2:])
        elif typing.get_origin(typ) is list:
            argv += [t for v in value for t in (name, str(v))]
        else:
            argv += [name, repr(value) if isinstance(value, float) else str(value)]
    for field_name, excluded in (nested or {}).items():
        inner = getattr(cfg, field_name)
        argv += to_argv(inner, getattr(base, field_name), excluded)
    return argv


_TRUE, _FALSE = ("true", "on", "yes", "1"), ("false", "off", "no", "0")


def list_values(args: argparse.Namespace, cls, exclude=()) -> dict[str, list[Any]]:
    """The lists given to `add_list_flags` flags, each value converted to its field's type (in the
    order given, duplicates dropped); a value that does not convert is one error naming the flag."""
    out: dict[str, list[Any]] = {}
    for f in cli_fields(cls, exclude):
        raw = getattr(args, f.name, None)
        if raw is None:
            continue
        typ, optional = _field_type(cls, f)
        items = [item.strip() for item in str(raw).split(",")]
        if not all(items):
            raise ConfigError(f"{flag_name(f)} {raw!r}: expected comma-separated values with none empty")
        values = []
        for item in items:
            v = _convert(item, typ, optional)
            if v is _BAD:
                raise ConfigError(f"{flag_name(f)} {raw!r}: {item!r} is not {_type_name(typ)}")
            if f.metadata.get("choices") is not None and v not in f.metadata["choices"]:
                raise ConfigError(
                    f"{flag_name(f)} {raw!r}: {item!r} is not one of {', '.join(map(str, f.metadata['choices']))}"
                )
            if v not in values:
                values.append(v)
        out[f.name] = values
    return out


_BAD = object()


def _convert(item: str, typ, optional: bool) -> Any:
    if optional and item.lower() in ("none", "null"):
        return None
    if typ is bool:
        low = item.lower()
        return True if low in _TRUE else False if low in _FALSE else _BAD
    if typ in (int, float):
        try:
            return typ(item)
        except ValueError:
            return _BAD
    return item


def explicit_values(args: argparse.Namespace, cls, exclude=()) -> dict[str, Any]:
    """The CLI fields of `cls` the user set on the command line."""
    return {f.name: getattr(args, f.name) for f in cli_fields(cls, exclude) if getattr(args, f.name, None) is not None}


def _check_type(cls, f: dataclasses.Field, value: Any, source: str) -> Any:
    typ, optional = _field_type(cls, f)
    if value is None:
        if optional or f.default is None:
            return None
        raise ConfigError(f"{source}: {f.name!r} must not be null (expected {_type_name(typ)})")
    ok = False
    if typ is bool:
        ok = isinstance(value, bool)
    elif typ is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif typ is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif typ is str:
        ok = isinstance(value, str)
    elif typing.get_origin(typ) is list:
        inner = typing.get_args(typ)[0]
        ok = isinstance(value, list) and all(isinstance(v, inner) for v in value)
    elif dataclasses.is_dataclass(typ) and isinstance(value, dict):
        return typ.from_dict(value, source=f"{source} [{f.name}]")
    else:
        ok = isinstance(value, typ) if isinstance(typ, type) else True
    if not ok:
        raise ConfigError(
            f"{source}: {f.name!r} must be {_type_name(typ)}{' or null' if optional else ''}, "
            f"got {value!r} ({type(value).__name__})"
        )
    return value


def _type_name(typ) -> str:
    return {bool: "true/false", int: "an integer", float: "a number", str: "a string"}.get(typ, str(typ))


class Config:
    """Mixin for the command dataclasses: JSON out (`to_dict`), typed JSON in (`from_dict`), and
    `validate()`, which applies every field's declared check (subclasses add cross-field checks)."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self):
        for f in dataclasses.fields(self):
            check, value = f.metadata.get("check"), getattr(self, f.name)
            if check is not None and value is not None:
                check_value(value, check, flag_name(f) if f.metadata.get("cli") else f.name)
            if isinstance(value, Config):  # a nested config's fields; its cross-field checks are its owner's call
                Config.validate(value)

    @classmethod
    def from_dict(cls, d: Any, source: str = "config"):
        if not isinstance(d, dict):
            raise ConfigError(f"{source}: expected a JSON object of {cls.__name__} fields, got {type(d).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = set(d) - set(fields)
        if unknown:
            raise ConfigError(f"{source}: unknown config keys: {', '.join(sorted(unknown))}")
        return cls(**{k: _check_type(cls, fields[k], v, source) for k, v in d.items()})
