"""The notebook-first API: the CLI's verbs as functions (``import exactlens as el``).

``el.build``, ``el.verify``, ``el.precision``, ``el.train``, ``el.diff``, ``el.hull``, ``el.report``
(and a plug-in's verbs, e.g. ``el.pairlogic`` from Shin & Matzinger, through ``register_api``) take the
CLI's options as keyword arguments, ``device`` included (``"auto"``, the default as on the command line:
CUDA if present, else MPS, else the CPU; ``"cpu"``, ``"cuda"``, ``"mps"``; see exactlens.devices). Each
returns a :class:`Result`: a read-only mapping holding exactly the CLI's ``--json`` object
(``.to_dict()``), which shows itself in Jupyter as a compact table of its headline figures with a small
plot (``_repr_html_``), prints as the CLI's text, and draws ``.plot()`` (a matplotlib Figure). Long work
shows progress bars (exactlens.progress).
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exactlens.errors import ExactLensError
from exactlens.jsonio import jsonable


@dataclass(frozen=True)
class View:
    """How one kind of result shows itself: headline rows (label, value), a text, a plot."""

    headline: Callable[[dict[str, Any]], list[tuple[str, Any]]]
    text: Callable[[dict[str, Any]], str]
    plot: Callable[[Result], Any] | None = None  # gets the Result (its mapping and extras, e.g. .history)


VIEWS: dict[str, View] = {}
API: dict[str, Callable[..., Any]] = {}


def register_view(kind: str, view: View) -> None:
    VIEWS[kind] = view


def register_api(name: str, function: Callable[..., Any]) -> None:
    """Make ``exactlens.<name>`` a verb of the API (a plug-in calls this from its ``register()``)."""
    API[name] = function


class Result(Mapping):
    """One verb's result: a mapping over the CLI's JSON object, plus extras (a trained model, a path)."""

    def __init__(self, kind: str, data: dict[str, Any], **extras: Any):
        self.kind = kind
        self._data = data
        for name, value in extras.items():
            setattr(self, name, value)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def to_dict(self) -> dict[str, Any]:
        """Exactly the CLI's ``--json`` object (strict JSON types; non-finite numbers as null)."""
        return jsonable(self._data)

    def __repr__(self) -> str:
        view = VIEWS.get(self.kind)
        return view.text(self._data) if view else f"Result({self.kind!r}, keys={list(self._data)})"

    def plot(self) -> Any:
        """A matplotlib Figure of the result (ExactLensError where this kind has none)."""
        view = VIEWS.get(self.kind)
        figure = view.plot(self) if view is not None and view.plot is not None else None
        if figure is None:
            raise ExactLensError(f"a {self.kind} result has no plot")
        return figure

    def _repr_html_(self) -> str:
        view = VIEWS.get(self.kind)
        if view is None:
            return f"<pre>{html.escape(repr(self))}</pre>"
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>"
                       for k, v in view.headline(self._data))
        picture = getattr(self, "svg", "")  # a drawing the result carries (a circuit)
        figure = view.plot(self) if view.plot is not None else None
        if figure is not None:
            buffer = io.BytesIO()
            figure.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
            import matplotlib.pyplot as plt

            plt.close(figure)
            encoded = base64.b64encode(buffer.getvalue()).decode("ascii")
            picture += f'<img src="data:image/png;base64,{encoded}" style="max-width:480px">'
        return (f"<div><b>exactlens {html.escape(self.kind)}</b><table>{rows}</table>{picture}"
                "<div style='color:#666;font-size:.85em'>.to_dict() for the data, .plot() for the figure</div></div>")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def _lengths(lengths: str | Sequence[int] | None) -> list[int] | None:
    from exactlens.analysis.verify import parse_lengths

    if lengths is None or isinstance(lengths, (list, tuple, range)):
        return None if lengths is None else list(lengths)
    if isinstance(lengths, str):
        return parse_lengths(lengths)
    raise ExactLensError(f"lengths are 'A:B[:STEP]', 'a,b,c' or a list of integers, got {lengths!r}")


# ---- the verbs ---------------------------------------------------------------------------------


def build(name: str, dtype: str = "float32", device: Any = "auto", **params: Any) -> Any:
    """The construction as an ExactTransformer (``exactlens list`` names them), on ``device``."""
    from exactlens.constructions import get

    return get(name).make(dtype=dtype, device=device, **params)


def verify(name: str, lengths: str | Sequence[int] | None = None, strings: int = 1000, dtype: str = "float32",
           seed: int = 0, device: Any = "auto", **params: Any) -> Result:
    """``exactlens verify``: accuracy, cross-entropy and margin per length (default 1..12, up to the
    construction's longest)."""
    from exactlens.analysis.verify import verify as run
    from exactlens.constructions import get

    if lengths is None:
        construction = get(name)
        lengths = construction.default_lengths(construction.make(dtype=dtype, **params))
    return Result("verify", run(name, _lengths(lengths), strings=strings, dtype=dtype, seed=seed, params=params,
                                device=device))


def precision(name: str, dtype: str = "float32", max_length: int | None = None, strings: int = 64, seed: int = 0,
              device: Any = "auto", **params: Any) -> Result:
    """``exactlens precision``: the largest length at which the construction is still exact in a dtype
    (scanned up to 1000, or the construction's longest)."""
    from exactlens.analysis.verify import precision as run
    from exactlens.constructions import get

    if max_length is None:
        construction = get(name)
        max_length = construction.default_max_length(construction.make(dtype=dtype, **params))

    return Result("precision", run(name, dtype=dtype, max_length=max_length, strings=strings, seed=seed,
                                   params=params, device=device))


def train(name: str, *, out: str | Path | None = None, seed: int = 0, seeds: Sequence[int] | None = None,
          overwrite: bool = False, device: Any = "auto", **options: Any) -> Result:
    """``exactlens train``: a paper preset or any construction's task in its shape. The result holds
    run.json's object (``{"runs": [...]}`` with ``seeds``); ``.model`` (``.models``) and ``.run``
    (``.runs``) are the trained models (on ``device``) and TrainRuns."""
    from exactlens.train import train as one
    from exactlens.train import train_many

    if seeds is not None:
        # reliability (issue 31): seeds go through as given; train_many checks them (count first, then types)
        runs = train_many(name, seeds, out=out, overwrite=overwrite, device=device, **options)
        return Result("train_many", {"runs": [r.info for r in runs]}, runs=runs, models=[r.model for r in runs])
    run = one(name, out=out, seed=seed, overwrite=overwrite, device=device, **options)
    return Result("train", run.info, run=run, model=run.model, history=run.history)


def diff(trained: Any, against: str, *, lengths: str | Sequence[int] | None = None, strings: int = 64,
         html: str | Path | None = None, overwrite: bool = False, device: Any = "auto", **options: Any) -> Result:
    """``exactlens diff``: a trained model (a Result of ``train``, a model, a checkpoint or a name) against
    an exact construction; ``html`` also writes the page. Both models run on ``device`` (a model passed in
    is copied there, not moved)."""
    from exactlens.analysis.diff import diff as run

    if isinstance(trained, Result):
        if not hasattr(trained, "model"):
            raise ExactLensError(f"el.diff takes one trained model; this {trained.kind} result has "
                                 f"{'.models (pick one: result.models[i])' if hasattr(trained, 'models') else 'none'}")
        trained = trained.model
    model = trained
    result = run(model, against, lengths=_lengths(lengths), strings=strings, device=device, **options)
    if html is not None:
        from exactlens.viz.diff_page import write_diff_page

        write_diff_page(result, html, trained=model, overwrite=overwrite)
    return Result("diff", result)


def hull(target: str | Path | None = None, *, tol: float = 1e-9, seed: int = 0, device: Any = "auto") -> Result:
    """``exactlens hull``: unselectable keys per layer and head (no target: Brody Fig. 1c/1d random keys,
    linear programs on the CPU whatever the device)."""
    from exactlens.analysis.hull_model import hull_report
    from exactlens.analysis.hull_random import random_keys
    from exactlens.devices import resolve_device

    if target is None:
        resolve_device(device)  # a device that is not there is refused here too
        return Result("hull", {**random_keys(seed=seed, tol=tol), "device": "cpu"})
    return Result("hull", hull_report(target, tol=tol, seed=seed, device=device))


def report(names: Sequence[str] | None = None, out: str | Path = "report", *, quick: bool = False,
           overwrite: bool = False, device: Any = "auto") -> Result:
    """``exactlens report``: the offline HTML report; the result holds the index's path."""
    from exactlens.viz.page import build_report

    # reliability (issue 31): names go through as given; build_report takes one name as a str, never its letters
    index = build_report(names or None, out, quick=quick, overwrite=overwrite, device=device)
    return Result("report", {"index": str(index)}, path=index)


def circuit(target: Any, *, granularity: str = "head", lengths: str | Sequence[int] | None = None, words: int = 64,
            seed: int = 0, ablation: str = "resample", check: bool = True) -> Result:
    """``exactlens circuit``: the ground-truth circuit read off a construction's weights, with its
    constant edges and the ablation check (``.svg`` draws it)."""
    from exactlens.analysis.circuit.evaluate import circuit_report
    from exactlens.viz.circuit import circuit_svg

    data = circuit_report(target, granularity=granularity, lengths=_lengths(lengths), words=words, seed=seed,
                          ablation=ablation, check=check)

    return Result("circuit", data, svg=circuit_svg(data))


def discover(target: Any, method: str = "acdc", *, granularity: str = "head", against: str | None = None,
             threshold: float | None = None, lengths: str | Sequence[int] | None = None, words: int = 64,
             seed: int = 0, ablation: str = "resample") -> Result:
    """``exactlens discover``: a circuit-discovery method (patching, eap, acdc) scored against the
    ground truth (a construction's own circuit, or ``against``'s for a trained model)."""
    from exactlens.analysis.circuit.evaluate import discover_report

    return Result("discover", discover_report(target, method, granularity=granularity, against=against,
                                              threshold=threshold, lengths=_lengths(lengths), words=words,
                                              seed=seed, ablation=ablation))


for _verb in (build, verify, precision, train, diff, hull, report, circuit, discover):
    register_api(_verb.__name__, _verb)


# ---- how each result shows itself --------------------------------------------------------------


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _per_length(rows: list[dict[str, Any]], field: str, ylabel: str, title: str, log: bool = False) -> Any:
    """One figure: ``field`` of each row against its length |w|."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3))
    ax.plot([r["length"] for r in rows], [r[field] for r in rows], marker=".")
    if log:
        ax.set_xscale("log")
    ax.set_xlabel("|w|")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    return fig


def _plot_verify(data: Mapping[str, Any]) -> Any:
    fig = _per_length(data["results"], "accuracy", "accuracy", f"{data['name']} ({data['dtype']})")
    fig.axes[0].set_ylim(-0.02, 1.02)
    return fig


def _verify_text(data: dict[str, Any]) -> str:
    lines = [f"{data['name']} {data['dtype']}: length strings accuracy cross_entropy_bits"]
    lines += [f"  {r['length']:6d} {r['strings']:7d} {_fmt(r['accuracy']):>8s} {_fmt(r['cross_entropy_bits'])}"
              for r in data["results"]]
    return "\n".join(lines)


def _accuracies(data: dict[str, Any]) -> list[float]:
    return [r["accuracy"] for r in data["results"] if r["accuracy"] is not None]


register_view("verify", View(
    lambda d: [("construction", d["name"]), ("dtype", d["dtype"]), ("lengths", len(d["results"])),
               ("min accuracy", min(_accuracies(d), default=None)),
               ("all exact", all(a == 1.0 for a in _accuracies(d)) and len(_accuracies(d)) == len(d["results"]))],
    _verify_text, _plot_verify))


def _plot_precision(data: Mapping[str, Any]) -> Any:
    return _per_length(data["checked"], "errors", "wrong words",
                       f"{data['name']} ({data['dtype']}): exact up to {data['max_exact_length']}", log=True)


register_view("precision", View(
    lambda d: [("construction", d["name"]), ("dtype", d["dtype"]), ("max exact length", d["max_exact_length"]),
               ("first failure", d["first_failure_length"]), ("lengths checked", len(d["checked"]))],
    lambda d: f"{d['name']} {d['dtype']}: exact up to |w| = {d['max_exact_length']}, first failure at "
              f"{d['first_failure_length']}", _plot_precision))


def _train_rows(info: dict[str, Any]) -> list[tuple[str, Any]]:
    final = info["final"]
    rows = [("task", info["task"]), ("seed", info["seed"]), ("steps", info["steps"]), ("seconds", info["wall_s"])]
    rows += [(k, v) for k, v in final.items() if k.startswith("test_") and v is not None and k != "test_evaluated"]
    return rows


def _plot_history(histories: list[list[dict[str, Any]]], title: str) -> Any:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3))
    for history in histories:
        tested = [r for r in history if r.get("test_evaluated")]
        key = "test_mse" if tested and tested[0].get("test_mse") is not None else "test_accuracy"
        ax.plot([r["epoch"] for r in tested], [r[key] for r in tested], marker=".")
        ax.set_ylabel(key.replace("_", " "))
    ax.set_xlabel("epoch")
    ax.set_title(title)
    return fig


register_view("train", View(_train_rows, lambda d: "\n".join(f"{k}: {_fmt(v)}" for k, v in _train_rows(d)),
                            lambda r: _plot_history([r.history], r["task"])))
register_view("train_many", View(
    lambda d: [("runs", len(d["runs"]))] + [(f"seed {r['seed']} {k}", v) for r in d["runs"]
                                             for k, v in _train_rows(r)[4:]],
    lambda d: "\n".join(f"seed {r['seed']}: " + ", ".join(f"{k} {_fmt(v)}" for k, v in _train_rows(r)[4:])
                        for r in d["runs"]),
    lambda r: _plot_history([run.history for run in r.runs], f"{r['runs'][0]['task']}, {len(r.runs)} runs")))


def _plot_diff(data: dict[str, Any]) -> Any:
    import numpy as np

    plt = _pyplot()
    rows = data.get("alignment") or []
    variables = list(dict.fromkeys(f"{r['origin']}:{r['variable']}" for r in rows))
    sites = list(dict.fromkeys(f"{r['site']} ({r['position']})" for r in rows))
    fig, ax = plt.subplots(figsize=(1.2 + 0.45 * max(len(sites), 1), 1.0 + 0.4 * max(len(variables), 1)))
    grid = np.full((max(len(variables), 1), max(len(sites), 1)), np.nan)
    for r in rows:
        value = r["iia_changed"]
        i, j = variables.index(f"{r['origin']}:{r['variable']}"), sites.index(f"{r['site']} ({r['position']})")
        grid[i, j] = np.nan if value is None else max(value, np.nan_to_num(grid[i, j], nan=-1.0))
    ax.imshow(grid, vmin=0, vmax=1, cmap="viridis", aspect="auto")
    ax.set_xticks(range(len(sites)), [s.replace("blocks.", "").replace("hook_", "") for s in sites], rotation=90,
                  fontsize=7)
    ax.set_yticks(range(len(variables)), variables, fontsize=7)
    ax.set_title("DAS: IIA on changed pairs", fontsize=9)
    return fig


def _diff_text(data: dict[str, Any]) -> str:
    from exactlens.cli.diff import format_diff_text

    return format_diff_text(data)


register_view("diff", View(
    lambda d: [("against", d["exact"]["name"]), ("lengths", len(d["settings"]["lengths"]))]
    + [(k, v) for k, v in d["summary"].items() if v is not None],
    _diff_text, _plot_diff))


def _plot_hull(data: dict[str, Any]) -> Any:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3))
    if "layers" in data:
        layers = data["layers"]
        ax.bar([f"layer {layer['layer']}" for layer in layers],
               [layer["before_ln"]["fraction_unselectable"] for layer in layers])
        ax.set_ylabel("unselectable fraction")
    else:
        for name in ("without_ln", "with_ln"):
            ax.plot(data["ds"], data[name][-1], marker=".", label=f"{name}, n = {data['ns'][-1]}")
        ax.set_xlabel("d")
        ax.legend(fontsize=7)
    return fig


def _hull_text(data: dict[str, Any]) -> str:
    from exactlens.cli.hull import format_hull_text

    return format_hull_text(data)


register_view("hull", View(
    lambda d: ([(f"layer {layer['layer']} unselectable", layer["before_ln"]["fraction_unselectable"])
                for layer in d["layers"]] if "layers" in d else [("random keys, trials", d["trials"])]),
    _hull_text, _plot_hull))
register_view("report", View(lambda d: [("index", d["index"])], lambda d: f"report: {d['index']}"))


def _circuit_text(data: dict[str, Any]) -> str:
    from exactlens.cli.circuit import format_circuit_text

    return format_circuit_text(data)


def _discover_text(data: dict[str, Any]) -> str:
    from exactlens.cli.discover import format_discover_text

    return format_discover_text(data)


def _plot_roc(result: Result) -> Any:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(3.6, 3.2))
    roc = result["score"]["roc"]
    ax.plot([p[0] for p in roc], [p[1] for p in roc], drawstyle="steps-post", marker=".")
    ax.plot([0, 1], [0, 1], color="#bbb", lw=0.8)
    ax.set_xlabel("false-positive rate")
    ax.set_ylabel("true-positive rate")
    ax.set_title(f"{result['method']} on {result['model']}: AUROC {_fmt(result['score']['edge_auroc'])}", fontsize=9)
    return fig


register_view("circuit", View(
    lambda d: [("circuit edges", f"{d['n_circuit_edges']} of {d['n_edges']}"),
               ("constant edges", sum(1 for e in d["edges"] if e["constant"])),
               *([("decisions changed, outside ablated", d["check"]["outside_changed"]),
                  ("unnecessary circuit edges", ", ".join(d["check"]["unnecessary"]) or "none")]
                 if "check" in d else [])],
    _circuit_text))
register_view("discover", View(
    lambda d: [("method", d["method"]), ("selected edges", f"{len(d['selected'])} of {len(d['edges'])}"),
               *([("edge AUROC", d["score"]["edge_auroc"]), ("node AUROC", d["score"]["node_auroc"]),
                  ("precision", d["score"]["precision"]), ("recall", d["score"]["recall"])] if "score" in d else []),
               *([("against", d["overlap"]["against"]), ("edge jaccard", d["overlap"]["jaccard"]),
                  ("jaccard between components", d["overlap"]["edges"]["between_components"]["jaccard"]),
                  ("node jaccard", d["overlap"]["nodes"]["jaccard"])]
                 if d.get("overlap", {}).get("comparable") else
                 [("against", d["overlap"]["reason"])] if "overlap" in d else []),
               ("seconds", d["seconds"])],
    _discover_text, lambda r: _plot_roc(r) if "score" in r else None))
