"""Options several verbs share, declared once (exactlens.requests), and the small text helpers of their views."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exactlens.interop.readout import ReadoutKind
from exactlens.requests import Any_, Device, DType, Int, Pairs, Text, option
from exactlens.viz.backend import pyplot

__all__ = ["ConstructionRequest", "device_option", "model_target_option", "num", "per_length_plot", "readout_option",
           "task_option"]


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


def readout_option() -> Any:
    """``--readout``: where a model exactlens did not build answers."""
    return option(None, kind=ReadoutKind(), metavar="POSITION[/OUTPUTS]",
                  help="where such a model answers and which outputs (cls, last, every or a position, optionally "
                       "/K, /A-B, /A:B; in Python also a callable; default: the task's)")


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


def num(value: Any, spec: str = ".3f", missing: str = "-") -> str:
    """A number for a text table (``missing`` for None)."""
    return missing if value is None else format(value, spec)


def per_length_plot(rows: list[dict[str, Any]], field: str, ylabel: str, title: str, log: bool = False) -> Any:
    """One figure: ``field`` of each row against its length |w|."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([r["length"] for r in rows], [r[field] for r in rows], marker=".")
    if log:
        ax.set_xscale("log")
    ax.set_xlabel("|w|")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return fig
