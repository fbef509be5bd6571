"""The readout contract: where a model's answer is read and which of its outputs it is.

A readout is ``POSITION[/OUTPUTS]``:

* POSITION: ``cls`` (the [CLS] token, position 0), ``last`` (each word's last real position: a causal
  model's usual answer), ``every`` (every position: prediction tasks), or an integer (a position; a
  negative one counts from each word's end, ``-1`` = ``last``).
* OUTPUTS (optional; default all the model's outputs): ``K`` (output K only), ``A-B`` (output A minus
  output B: the log-odds of a two-logit membership head, ``1-0``), or ``A:B`` (outputs A..B-1).

In Python a readout may also be a callable ``readout(logits [batch, pos, out], n_positions [batch]) ->
outputs`` in the task's shape. Each task's default is the position of its standard models (``cls`` where
the task has a [CLS] token, else ``last``; ``every`` for prediction tasks) and all outputs.

Light at import (no torch): the command line parses ``--readout`` with it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.requests import Kind, option

__all__ = ["POSITIONS", "Readout", "ReadoutKind", "default_readout", "parse_readout", "readout_option"]

POSITIONS = ("cls", "last", "every")
FORMAT = "POSITION[/OUTPUTS] with POSITION cls, last, every or an integer, OUTPUTS K, A-B or A:B (e.g. last/1-0)"


@dataclass(frozen=True)
class Readout:
    """Where the answer is read (``position``) and which outputs (``outputs``: None = all), or a callable."""

    position: str | int = "cls"
    outputs: tuple[str, int, int] | None = None  # ("index", k, k) | ("diff", a, b) | ("slice", a, b)
    fn: Callable[..., Any] | None = None

    @property
    def text(self) -> str:
        if self.fn is not None:
            return f"callable {getattr(self.fn, '__name__', type(self.fn).__name__)}"
        if self.outputs is None:
            return str(self.position)
        how, a, b = self.outputs
        return f"{self.position}/" + {"index": f"{a}", "diff": f"{a}-{b}", "slice": f"{a}:{b}"}[how]

    def width(self, n_out: int) -> int:
        """The number of outputs read from a model with ``n_out`` outputs (after the check of the indices)."""
        if self.outputs is None:
            return n_out
        how, a, b = self.outputs
        top = max(a, b - 1 if how == "slice" else b)
        if top >= n_out:
            raise ExactLensError(f"readout {self.text!r} reads output {top}, but the model has {n_out} outputs "
                                 f"(0..{n_out - 1})")
        return b - a if how == "slice" else 1

    def rows(self, task: Any, n_positions: Any) -> Any:
        """The position read in each word [batch] (None for ``every``)."""
        import torch

        if self.position == "every":
            return None
        if self.position == "cls":
            if not task.use_cls:
                raise ExactLensError(f"readout 'cls': task {task.name!r} has no [CLS] token; use last or a position")
            return torch.zeros_like(n_positions)
        if self.position == "last":
            return n_positions - 1
        pos = int(self.position)
        return torch.full_like(n_positions, pos) if pos >= 0 else n_positions + pos

    def apply(self, task: Any, logits: Any, n_positions: Any) -> Any:
        """The task's outputs from full logits [batch, pos, out]: [batch] (membership, regression),
        [batch, classes] (classification) or [batch, pos(, classes)] (prediction)."""
        import torch

        if self.fn is not None:
            return self.fn(logits, n_positions)
        rows = self.rows(task, n_positions)
        at = logits if rows is None else logits[torch.arange(logits.shape[0]), rows.clamp(0, logits.shape[1] - 1)]
        self.width(at.shape[-1])
        if self.outputs is not None:
            how, a, b = self.outputs
            at = {"index": lambda x: x[..., a:a + 1], "diff": lambda x: x[..., a:a + 1] - x[..., b:b + 1],
                  "slice": lambda x: x[..., a:b]}[how](at)
        if task.kind in ("membership", "regression"):
            if at.shape[-1] != 1:
                raise ExactLensError(
                    f"output shape: task {task.name!r} ({task.kind}) is answered by one output (a logit"
                    f"{' of acceptance' if task.kind == 'membership' else ''}), but readout {self.text!r} gives "
                    f"{at.shape[-1]}; for a two-logit head (reject, accept) pass readout='{self.position}/1-0', "
                    "or name the output (e.g. /1)")
            at = at[..., 0]
        elif at.shape[-1] != task.n_outputs:
            raise ExactLensError(f"output shape: task {task.name!r} has {task.n_outputs} classes, but readout "
                                 f"{self.text!r} gives {at.shape[-1]} outputs; name the slice (e.g. "
                                 f"{self.position}/0:{task.n_outputs})")
        return at


def _int(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ExactLensError(f"readout: {what} {text!r} is not an integer; the format is {FORMAT}") from None
    return value


def parse_readout(value: Any) -> Readout | None:
    """A Readout from its text (or an int position, a Readout, a callable); None stays None (the task's default)."""
    if value is None or isinstance(value, Readout):
        return value
    if callable(value) and not isinstance(value, str):
        return Readout(position="every", fn=value)
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise ExactLensError(f"readout takes {FORMAT} or a callable, got {value!r}")
    text = str(value).strip().lower()
    where, _, outs = text.partition("/")
    position: str | int = where if where in POSITIONS else _int(where, "position")
    if outs == "":
        if "/" in text:
            raise ExactLensError(f"readout {value!r}: nothing after '/'; the format is {FORMAT}")
        return Readout(position)
    if ":" in outs:
        a, b = (_int(x, "output") for x in outs.split(":", 1))
        how = "slice"
    elif "-" in outs[1:]:
        a, b = (_int(x, "output") for x in outs.split("-", 1))
        how = "diff"
    else:
        a = b = _int(outs, "output")
        how = "index"
    if min(a, b) < 0 or (how == "slice" and b <= a):
        raise ExactLensError(f"readout {value!r}: outputs must be indices >= 0 (a slice A:B with B > A)")
    return Readout(position, (how, a, b))


def default_readout(task: Any) -> Readout:
    """The task's standard readout: every position (prediction), [CLS] where there is one, else the last."""
    if task.readout == "per_position":
        return Readout("every")
    return Readout("cls" if task.use_cls else "last")


@dataclass(frozen=True)
class ReadoutKind(Kind):
    """``--readout`` / ``readout=``: None (the task's default), a readout text, or (Python) a callable."""

    what: str = FORMAT

    def check(self, name: str, value: Any) -> Any:
        parse_readout(value)
        return value


def readout_option() -> Any:
    """``--readout``: where a model exactlens did not build answers."""
    return option(None, kind=ReadoutKind(), metavar="POSITION[/OUTPUTS]",
                  help="where such a model answers and which outputs (cls, last, every or a position, optionally "
                       "/K, /A-B, /A:B; in Python also a callable; default: the task's)")
