"""Requests: a verb's options declared once, as a dataclass whose fields carry an :class:`Option`.

From one request class come the argparse flags of ``exactlens VERB`` (:func:`add_arguments`), the
keyword arguments of ``el.VERB`` (:func:`from_call`), the validation both entries share (every value
checked by its field's :class:`Kind`: type, range, choices, finiteness) and the settings echo
(:func:`command_line`). A field is declared with :func:`option`::

    @dataclass(frozen=True)
    class VerifyRequest:
        name: str = option(help="a construction name", kind=Text(), positional=True)
        strings: int = option(1000, help="random strings per length", kind=Int(1))

Like every module the command line loads before a verb runs, this one imports nothing heavy (no torch).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field
from typing import Any

from exactlens.errors import ExactLensError

__all__ = [
    "Any_", "Bool", "Choice", "ConstructionRequest", "DType", "Device", "FlagsOf", "Float", "Int", "IntList", "Kind",
    "Lengths", "Option", "Pairs", "Path_", "Text", "TextList", "add_arguments", "command_line", "device_option",
    "from_call", "from_namespace", "model_target_option", "option", "options_of", "task_option",
]


LARGEST_INT = 2**40
"""Every integer option is within +-2^40: larger counts cannot fit anywhere, and larger seeds overflow
inside torch's generators."""


# ---- kinds: what a value may be ---------------------------------------------------------------------------


class Kind:
    """What one option's value may be: ``check`` a Python value (the API's and the parsed CLI's),
    ``parse`` the command line's text. Both raise ExactLensError naming the option and what is allowed."""

    what = "a value"
    argparse_type: Callable[[str], Any] | None = None

    def check(self, name: str, value: Any) -> Any:
        return value

    def parse(self, name: str, text: str) -> Any:
        return self.check(name, text)

    def cli_text(self, value: Any) -> str:
        """The command line's text for a checked value (``parse`` reads it back)."""
        return ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else str(value)

    def refuse(self, name: str, value: Any, extra: str = "") -> ExactLensError:
        shown = repr(value)
        shown = shown if len(shown) <= 80 else shown[:77] + "..."
        return ExactLensError(f"{name} takes {self.what}{extra}, got {shown}")


@dataclass(frozen=True)
class Any_(Kind):
    """Anything (a model object, a checkpoint path, a name): the verb's own code checks it."""

    what: str = "a value"


@dataclass(frozen=True)
class Text(Kind):
    what: str = "a string"
    nonempty: bool = True

    def check(self, name: str, value: Any) -> Any:
        if not isinstance(value, str) or (self.nonempty and not value.strip()):
            raise self.refuse(name, value, " (not empty)" if self.nonempty else "")
        return value


@dataclass(frozen=True)
class Path_(Kind):
    """A file or directory path: a string or an os.PathLike (kept as given)."""

    what: str = "a path (a string or pathlib.Path)"

    def check(self, name: str, value: Any) -> Any:
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if not isinstance(value, str) or not value.strip() or "\0" in value:
            raise self.refuse(name, value)
        return value


@dataclass(frozen=True)
class Bool(Kind):
    what: str = "True or False"

    def check(self, name: str, value: Any) -> Any:
        if not isinstance(value, bool):
            raise self.refuse(name, value)
        return value


@dataclass(frozen=True)
class Int(Kind):
    """An integer in [lo, hi] (bounds optional); bools and floats are refused (1.5 is no count)."""

    lo: int | None = None
    hi: int | None = None

    @property
    def what(self) -> str:  # type: ignore[override]
        if self.lo is not None and self.hi is not None:
            return f"an integer from {self.lo} to {self.hi}"
        if self.lo is not None:
            return f"an integer >= {self.lo}"
        return "an integer" if self.hi is None else f"an integer <= {self.hi}"

    def check(self, name: str, value: Any) -> Any:
        if isinstance(value, bool) or not _is_int(value):
            raise self.refuse(name, value)
        value = int(value)
        if (self.lo is not None and value < self.lo) or (self.hi is not None and value > self.hi):
            raise self.refuse(name, value)
        if abs(value) > LARGEST_INT:  # no count, seed or width of ours is that large; torch would overflow
            raise self.refuse(name, value, f" (at most 2^40 = {LARGEST_INT})")
        return value

    def parse(self, name: str, text: str) -> Any:
        return self.check(name, _number(self, name, text, int))


@dataclass(frozen=True)
class Float(Kind):
    """A finite number in the interval (bounds optional; ``open_lo``/``open_hi`` exclude them)."""

    lo: float | None = None
    hi: float | None = None
    open_lo: bool = False
    open_hi: bool = False

    @property
    def what(self) -> str:  # type: ignore[override]
        parts = []
        if self.lo is not None:
            parts.append(f"{'>' if self.open_lo else '>='} {self.lo:g}")
        if self.hi is not None:
            parts.append(f"{'<' if self.open_hi else '<='} {self.hi:g}")
        return "a finite number" + (f" {' and '.join(parts)}" if parts else "")

    def check(self, name: str, value: Any) -> Any:
        if isinstance(value, bool) or not (_is_int(value) or _is_float(value)):
            raise self.refuse(name, value)
        value = float(value)
        if not math.isfinite(value):
            raise self.refuse(name, value)
        if self.lo is not None and (value < self.lo or (self.open_lo and value == self.lo)):
            raise self.refuse(name, value)
        if self.hi is not None and (value > self.hi or (self.open_hi and value == self.hi)):
            raise self.refuse(name, value)
        return value

    def parse(self, name: str, text: str) -> Any:
        return self.check(name, _number(self, name, text, float))


@dataclass(frozen=True)
class Choice(Kind):
    """One of ``options`` (a tuple, or a function giving them when first asked: a registry's names)."""

    options: tuple[str, ...] | Callable[[], Sequence[str]] = ()

    def allowed(self) -> tuple[str, ...]:
        return tuple(self.options() if callable(self.options) else self.options)

    @property
    def what(self) -> str:  # type: ignore[override]
        return "one of " + ", ".join(self.allowed())

    def check(self, name: str, value: Any) -> Any:
        if not isinstance(value, str) or value not in self.allowed():
            raise self.refuse(name, value)
        return value


@dataclass(frozen=True)
class DType(Kind):
    """A floating dtype: its name ("float32", "float64") or the torch dtype itself (torch.float64), as
    TransformerLens takes them; kept as the name (exactlens.dtypes.dtype_name, the one check)."""

    names: tuple[str, ...] = ("float32", "float64")
    what: str = "one of float32, float64 (a name or the torch dtype)"

    def check(self, name: str, value: Any) -> Any:
        from exactlens.dtypes import dtype_name

        return dtype_name(value, name)


@dataclass(frozen=True)
class Device(Kind):
    """Where models run: "auto", "cpu", "cuda", "cuda:N", "mps" or a torch.device (checked against the
    machine when the verb runs: exactlens.devices)."""

    what: str = "a device: auto, cpu, cuda, cuda:N, mps, or a torch.device"

    def check(self, name: str, value: Any) -> Any:
        if type(value).__name__ == "device":
            return value
        if not isinstance(value, str) or not value.strip():
            raise self.refuse(name, value)
        return value


@dataclass(frozen=True)
class Lengths(Kind):
    """Word lengths: 'A:B[:STEP]' (inclusive), 'a,b,c', an integer, or a list/range of integers >= ``lo``;
    kept as a sorted list without repeats."""

    lo: int = 0
    hi: int | None = None
    most: int = 10_000  # lengths in one request: a range is refused before its list is built
    what: str = "word lengths: 'A:B[:STEP]', 'a,b,c', an integer or a list of integers"

    def check(self, name: str, value: Any) -> Any:
        if isinstance(value, str):
            return self.parse(name, value)
        if _is_int(value) and not isinstance(value, bool):
            value = [value]
        if not isinstance(value, (list, tuple, range)) or not value:
            raise self.refuse(name, value)
        if any(isinstance(v, bool) or not _is_int(v) for v in value):
            raise self.refuse(name, value)
        if len(value) > self.most:
            raise self.refuse(name, f"{len(value)} lengths", f" (at most {self.most})")
        lengths = sorted({int(v) for v in value})
        if lengths[0] < self.lo or (self.hi is not None and lengths[-1] > self.hi):
            bound = f" from {self.lo}" + (f" to {self.hi}" if self.hi is not None else "")
            raise self.refuse(name, value, bound)
        return lengths

    def parse(self, name: str, text: str | list[str]) -> Any:
        texts = [text] if isinstance(text, str) else list(text)
        out: list[int] = []
        for item in texts:
            out += self._parse_one(name, item)
        return self.check(name, out)

    def _parse_one(self, name: str, text: str) -> list[int]:
        try:
            if ":" in text:
                parts = [int(p) for p in text.split(":")]
                if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] <= 0) or parts[1] < parts[0]:
                    raise ValueError
                span = range(parts[0], parts[1] + 1, parts[2] if len(parts) == 3 else 1)
                if len(span) > self.most:
                    raise OverflowError
                return list(span)
            return [int(p) for p in text.split(",")]
        except ValueError:
            raise self.refuse(name, text) from None
        except OverflowError:
            raise self.refuse(name, text, f" (at most {self.most} lengths)") from None


@dataclass(frozen=True)
class IntList(Kind):
    """Integers: 'LO:HI' (inclusive), 'a,b,c', or a list of integers >= ``lo``, at most ``most``."""

    lo: int = 0
    most: int | None = None
    what: str = "integers: LO:HI (inclusive), a comma list, or a list of integers"
    count_check: Callable[[int], None] | None = None  # the request's size, from the count before any list is built

    def check(self, name: str, value: Any) -> Any:
        if isinstance(value, str):
            return self.parse(name, value)
        if not isinstance(value, (list, tuple, range)) or not value:
            raise self.refuse(name, value)
        if self.count_check is not None:
            self.count_check(len(value))
        if isinstance(value, range) and min(value[0], value[-1]) < self.lo:  # a range's least, without iterating
            raise self.refuse(name, value, f" (each >= {self.lo})")
        if not isinstance(value, range) and any(isinstance(v, bool) or not _is_int(v) or int(v) < self.lo
                                                for v in value):
            raise self.refuse(name, value, f" (each >= {self.lo})")
        if self.most is not None and len(value) > self.most:
            raise self.refuse(name, f"{len(value)} values", f" (at most {self.most})")
        return [int(v) for v in value]

    def parse(self, name: str, text: str) -> Any:
        try:
            bounds = [int(v) for v in text.split(":")] if ":" in text else None
            values = None if bounds else [int(v) for v in text.split(",")]
        except ValueError:
            raise self.refuse(name, text) from None
        if bounds is None:
            return self.check(name, values)
        if len(bounds) != 2 or bounds[1] < bounds[0]:
            raise self.refuse(name, text)
        if self.most is not None and bounds[1] - bounds[0] + 1 > self.most:  # refused before a list is built
            raise self.refuse(name, text, f" (at most {self.most} values)")
        return self.check(name, range(bounds[0], bounds[1] + 1))


@dataclass(frozen=True)
class TextList(Kind):
    """Names: a list of strings, one string (one name), or on the command line a comma list / several words."""

    choices: tuple[str, ...] | Callable[[], Sequence[str]] | None = None
    nonempty: bool = True
    what: str = "a list of names"

    def check(self, name: str, value: Any) -> Any:
        if isinstance(value, str):
            if not value.strip():
                raise self.refuse(name, value, " (at least one)")
            value = [value]
        if not isinstance(value, (list, tuple)) or any(not isinstance(v, str) or not v.strip() for v in value):
            raise self.refuse(name, value)
        if self.nonempty and not value:
            raise self.refuse(name, value, " (at least one)")
        allowed = self.choices() if callable(self.choices) else self.choices
        wrong = [v for v in value if allowed is not None and v not in allowed]
        if wrong:
            raise ExactLensError(f"{name}: unknown {', '.join(map(repr, wrong))}; allowed: {', '.join(allowed)}")
        return tuple(value)

    def parse(self, name: str, text: str | list[str]) -> Any:
        words = [text] if isinstance(text, str) else list(text)
        items = [part.strip() for word in words for part in word.split(",")]
        if any(not item for item in items):
            raise self.refuse(name, text, " (no empty names)")
        return self.check(name, items)


@dataclass(frozen=True)
class Pairs(Kind):
    """KEY=VALUE pairs (repeatable on the command line; VALUE read as JSON where it is: numbers, true,
    null, lists); in the API a dict with string keys."""

    what: str = "KEY=VALUE pairs (a dict of string keys in Python)"

    def check(self, name: str, value: Any) -> Any:
        if not isinstance(value, Mapping) or any(not isinstance(k, str) or not k for k in value):
            raise self.refuse(name, value)
        return dict(value)

    def parse(self, name: str, text: str | list[str]) -> Any:
        out: dict[str, Any] = {}
        for pair in [text] if isinstance(text, str) else text:
            key, sep, raw = pair.partition("=")
            if not sep or not key:
                raise ExactLensError(f"{name} takes KEY=VALUE, got {pair!r}")
            try:
                out[key] = json.loads(raw)
            except json.JSONDecodeError:
                out[key] = raw
        return out


_FLAG_VIEWS: dict[type, type] = {}


@dataclass(frozen=True)
class FlagsOf(Kind):
    """A dict field holding another declaration's options given as flags: one command-line flag per field of
    ``options`` (its help, kind and metavar; default None, i.e. not given; a switch: off), collected into the dict
    (only those given). ``exactlens train``'s ``--epochs 5`` etc. (exactlens.train.options.TrainOptions), which the
    API takes as keywords (``**options``), so such a field is ``api=False``."""

    options: type = object
    what: str = "a dict of options"

    def view(self) -> type:
        """The flags as a request class (generated once: each field of ``options``, default None, the CLI only)."""
        if self.options in _FLAG_VIEWS:
            return _FLAG_VIEWS[self.options]
        fields = []
        for f, opt in options_of(self.options):
            default = False if isinstance(opt.kind, Bool) else None
            fields.append((f.name, Any, option(default, help=opt.help, kind=opt.kind, metavar=opt.metavar, api=False)))
        view = _FLAG_VIEWS[self.options] = dataclasses.make_dataclass(f"{self.options.__name__}Flags", fields,
                                                                      frozen=True)
        return view

    def check(self, name: str, value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise self.refuse(name, value)
        known = {f.name: opt for f, opt in options_of(self.options)}
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ExactLensError(f"{name}: {unknown[0]!r} is no option of {self.options.__name__}")
        return {key: known[key].kind.check(key, item) for key, item in value.items()}


def _number(kind: Kind, name: str, text: str, convert: Callable[[str], Any]) -> Any:
    """The command line's text as a number (``int`` or ``float``), or the kind's refusal."""
    try:
        return convert(text.strip())
    except ValueError:
        raise kind.refuse(name, text) from None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) or type(value).__name__ in ("int64", "int32", "int16", "int8", "uint8")


def _is_float(value: Any) -> bool:
    return isinstance(value, float) or type(value).__name__ in ("float64", "float32", "float16")


# ---- options: a field of a request --------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """How one request field shows on the command line and in the API.

    ``flag``: the CLI flag (default ``--field-name``; positional fields have none); ``positional``: a
    positional word on the CLI and a positional parameter of ``el.VERB`` (in field order); ``nargs`` for
    positional words ("?", "*") or lists ("+"); ``negate``: a ``--no-...`` flag that sets False;
    ``cli``/``api``: whether the entry has it; ``required_on_cli``: a flag the CLI requires though the API
    has a default or takes it positionally; ``group``: mutually exclusive flags; ``extra``: the API's
    ``**kwargs`` land in this (dict) field; ``api_name``: the keyword in the API where it differs;
    ``dest``: the argparse dest where it differs."""

    help: str = ""
    kind: Kind = field(default_factory=Any_)
    flag: str | None = None
    positional: bool = False
    nargs: str | None = None
    metavar: str | None = None
    negate: bool = False
    cli: bool = True
    api: bool = True
    required_on_cli: bool = False
    group: str | None = None
    extra: bool = False
    api_name: str | None = None
    api_positional: bool | None = None
    dest: str | None = None  # the argparse dest where it differs from the field's name (compatibility)

    @property
    def positional_in_api(self) -> bool:
        """Whether ``el.VERB`` takes it positionally (``api_positional``, else as on the command line)."""
        return self.positional if self.api_positional is None else self.api_positional


def option(default: Any = MISSING, *, help: str = "", kind: Kind | None = None, **how: Any) -> Any:
    """A request field: its default (omitted: required), its help and :class:`Kind`, and how it shows
    (:class:`Option`)."""
    meta = {"option": Option(help=help, kind=kind or Any_(), **how)}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def options_of(request: type) -> list[tuple[dataclasses.Field, Option]]:
    """The fields of a request class with their Option, in declaration order."""
    if not dataclasses.is_dataclass(request):
        raise ExactLensError(f"a request is a dataclass, got {request!r}")
    return [(f, f.metadata.get("option") or Option()) for f in dataclasses.fields(request)]


def _flag(f: dataclasses.Field, opt: Option) -> str:
    return opt.flag or "--" + f.name.replace("_", "-")


def _required(f: dataclasses.Field) -> bool:
    return f.default is MISSING and f.default_factory is MISSING  # type: ignore[misc]


def _default(f: dataclasses.Field) -> Any:
    if f.default is not MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not MISSING else None  # type: ignore[misc]


# ---- the command line ---------------------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser, request: type) -> None:
    """One argparse argument per CLI field of ``request`` (dest = the field's name; values stay text until
    :func:`from_namespace` parses and checks them with the field's kind)."""
    groups: dict[str, Any] = {}
    for f, opt in options_of(request):
        if not opt.cli:
            continue
        if isinstance(opt.kind, FlagsOf):
            add_arguments(parser, opt.kind.view())
            continue
        target = parser
        if opt.group is not None:
            if opt.group not in groups:  # one group per name (setdefault would make an empty one per member)
                groups[opt.group] = parser.add_mutually_exclusive_group()
            target = groups[opt.group]
        default = None if isinstance(_default(f), dict) else _default(f)
        choices = (opt.kind.allowed() if isinstance(opt.kind, Choice)
                   else opt.kind.names if isinstance(opt.kind, DType) else None)
        if opt.positional:
            nargs = opt.nargs or ("?" if not _required(f) else None)
            kwargs: dict[str, Any] = {"help": opt.help, "metavar": opt.metavar}
            if nargs is not None:
                kwargs["nargs"] = nargs
                kwargs["default"] = default if nargs != "*" else None
            target.add_argument(opt.dest or f.name, **kwargs)
        elif isinstance(opt.kind, Bool):
            action = "store_false" if opt.negate else "store_true"
            target.add_argument(_flag(f, opt), dest=opt.dest or f.name, action=action, help=opt.help)
        elif isinstance(opt.kind, Pairs):
            target.add_argument(_flag(f, opt), dest=opt.dest or f.name, action="append",
                                metavar=opt.metavar or "KEY=VALUE", help=opt.help)
        else:
            kwargs = {"dest": opt.dest or f.name, "default": default, "help": opt.help, "metavar": opt.metavar}
            if choices is not None:
                kwargs["choices"] = choices
            if opt.nargs is not None:
                kwargs["nargs"] = opt.nargs
            if opt.required_on_cli or (_required(f) and not opt.positional):
                kwargs["required"] = True
                kwargs["default"] = None
            if isinstance(opt.kind, (Int, Float)):  # argparse shows "invalid int value" in its own words
                kwargs["type"] = str
            target.add_argument(_flag(f, opt), **kwargs)


def from_namespace(request: type, args: argparse.Namespace) -> Any:
    """The request from parsed CLI arguments: every text parsed and checked by its field's kind."""
    values: dict[str, Any] = {}
    for f, opt in options_of(request):
        if not opt.cli:
            continue
        if isinstance(opt.kind, FlagsOf):  # the flags given (a switch only when on; 0 is a value)
            flags = from_namespace(opt.kind.view(), args)
            values[f.name] = {k: v for k, v in vars(flags).items() if v is not None and v is not False}
            continue
        raw = getattr(args, opt.dest or f.name, None)
        name = f.name if opt.positional else _flag(f, opt)
        if isinstance(opt.kind, Bool):
            values[f.name] = bool(raw)
        elif raw is None or (raw == [] and opt.nargs in ("*", "?")):
            continue  # the field's default
        elif raw == _default(f) and not isinstance(raw, str | list):
            values[f.name] = raw
        elif isinstance(raw, str) or (isinstance(raw, list) and isinstance(opt.kind, (Pairs, Lengths, TextList))):
            values[f.name] = opt.kind.parse(name, raw)
        else:
            values[f.name] = opt.kind.check(name, raw)
    return request(**values)


def command_line(verb: str, request: Any) -> str:
    """The ``exactlens VERB ...`` command that makes this request (options at their default left out):
    the settings echo a report or a run records."""
    words = ["exactlens", verb]
    for f, opt in options_of(type(request)):
        if not opt.cli:
            continue
        value = getattr(request, f.name)
        if value == _default(f) and not opt.positional:
            continue
        if isinstance(opt.kind, FlagsOf):
            view = opt.kind.view()
            given = command_line(verb, view(**value))
            words += shlex.split(given)[2:]
            continue
        if opt.positional:
            words += [str(v) for v in value] if isinstance(value, (list, tuple)) else [] if value is None else [
                str(value)]
        elif isinstance(opt.kind, Bool):
            words.append(_flag(f, opt))
        elif isinstance(opt.kind, Pairs):
            for key, item in value.items():
                words += [_flag(f, opt), f"{key}={json.dumps(item) if not isinstance(item, str) else item}"]
        else:
            words += [_flag(f, opt), opt.kind.cli_text(value)]
    return shlex.join(words)


# ---- the Python API -----------------------------------------------------------------------------------------


def api_parameters(request: type) -> tuple[list[tuple[str, dataclasses.Field, Option]], str | None]:
    """The API's parameters: (keyword, field, option) in order (positional ones first), and the field that
    takes ``**kwargs`` (None: unknown keywords are refused)."""
    params = [(opt.api_name or f.name, f, opt) for f, opt in options_of(request) if opt.api and not opt.extra]
    positional = [p for p in params if p[2].positional_in_api]
    keyword = [p for p in params if p not in positional]
    extra = next((f.name for f, opt in options_of(request) if opt.extra), None)
    return positional + keyword, extra


def from_call(verb: str, request: type, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """The request from ``el.VERB(*args, **kwargs)``: positional arguments in the declared order, unknown
    keywords into the ``extra`` field (or refused, naming those allowed), every value checked by its kind."""
    params, extra = api_parameters(request)
    positional = [p for p in params if p[2].positional_in_api]
    if len(args) > len(positional):
        raise ExactLensError(f"el.{verb} takes {len(positional)} positional argument(s) "
                             f"({', '.join(p[0] for p in positional) or 'none'}), got {len(args)}")
    given = {p[0]: value for p, value in zip(positional, args, strict=False)}
    for key, value in kwargs.items():
        if key in given:
            raise ExactLensError(f"el.{verb} got {key!r} twice (positionally and as a keyword)")
        given[key] = value
    by_name = {p[0]: p for p in params}
    values: dict[str, Any] = {}
    leftover: dict[str, Any] = {}
    for key, value in given.items():
        if key not in by_name:
            leftover[key] = value
            continue
        _, f, opt = by_name[key]
        if value is None and (not _required(f) and _default(f) is None):
            continue
        values[f.name] = opt.kind.check(key, value)
    if leftover and extra is None:
        raise ExactLensError(f"el.{verb} has no option {', '.join(map(repr, sorted(leftover)))}; its options: "
                             f"{', '.join(p[0] for p in params)}")
    if leftover:
        values[extra] = {**dict(values.get(extra, {})), **leftover}
    missing = [p[0] for p in params if _required(p[1]) and p[1].name not in values]
    if missing:
        raise ExactLensError(f"el.{verb} needs {', '.join(missing)}")
    return request(**values)


# ---- options several verbs share, declared once ------------------------------------------------------------


def device_option(what: str = "", **how: Any) -> Any:
    """``--device`` / ``device=``: cpu, cuda (or cuda:N), mps, or auto (exactlens.devices; a device that is
    not there is an error naming those that are)."""
    return option("auto", kind=Device(), metavar="{cpu,cuda,mps,auto}",
                  help="where models run: cpu, cuda (or cuda:N), mps, or auto (default: CUDA if present, else MPS, "
                       "else the CPU)" + (f"; {what}" if what else ""), **how)


def model_target_option() -> Any:
    """NAME of a verb that takes a construction or a model (verify, precision)."""
    return option(kind=Any_(), positional=True, metavar="NAME | CHECKPOINT_DIR",
                  help="a construction name (see `exactlens list`) or a checkpoint directory; in Python also a model "
                       "(an ExactTransformer, a train result, a TransformerLens HookedTransformer or "
                       "TransformerBridge)")


def task_option() -> Any:
    """``--task``: the task of a model that records none."""
    return option(None, kind=Text(), metavar="NAME",
                  help="the task of a model that records none (a TransformerLens or Hugging Face model; see "
                       "`exactlens task NAME`)")


@dataclass(frozen=True)
class ConstructionRequest:
    """NAME --dtype --seed --param --device: the options of verbs that build one construction (a verb's
    request adds its own fields after these)."""

    name: str = option(help="a construction name (see `exactlens list`)", kind=Text(), positional=True)
    dtype: str = option("float32", kind=DType(), help="float32 or float64 (a name or the torch dtype)")
    seed: int = option(0, kind=Int(0), help="seed of the sampled words")
    params: dict = option({}, kind=Pairs(), flag="--param", dest="param", extra=True,
                          help="construction parameter, e.g. --param c=2 --param eps=0 (repeatable; in Python "
                               "the keyword arguments the verb does not know)")
    device: Any = device_option()
