"""``exactlens train NAME --out DIR [options] [--json]``: train a model with a preset, or of any
construction's task in that construction's shape.

Writes DIR/config.json + DIR/weights.pt (load with ExactTransformer.load(DIR); the config records
the task), DIR/history.jsonl (one record per epoch) and DIR/run.json (preset, seed, options,
timing, final metrics). Options not given keep the preset's value (the paper's setting); a
preset's own options without a flag here go through --option KEY=VALUE. With --json, stdout
carries exactly one JSON object (run.json's content); progress goes to stderr: in a terminal a
bar (rate, time left, the latest training loss and test accuracy), elsewhere (a log, a pipe,
--quiet) one line per evaluation.

--seeds 0:9 (or 0,3,7) trains one run per seed together (exactlens.train.train_many;
each run equals its single --seed run) into DIR/seed{s}/; --json then prints one object
{"runs": [run.json of each seed]}.

The training options' flags are generated from exactlens.train.options.TrainOptions (one flag per
field, default None: the preset's value; collected into the request's ``flags``); in Python they are keyword
arguments (``**options``), checked by the same declaration when the preset resolves them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exactlens.requests import Bool, FlagsOf, Int, IntList, Pairs, Path_, Text, device_option, option
from exactlens.resources import check_run_count
from exactlens.results import Result, View
from exactlens.train.options import TrainOptions
from exactlens.verbs import VerbSpec, register_verb, tell
from exactlens.verbs.common import pyplot

__all__ = ["TrainRequest", "run", "train_text"]


SEEDS = IntList(0, what="LO:HI (inclusive) or a comma list of integers, all >= 0 (a list in Python)",
                count_check=check_run_count)  # 10^8 seeds: refused from the count, before a list is made


@dataclass(frozen=True)
class TrainRequest:
    """The options of ``exactlens train`` / ``el.train``: the run's, then the training options (TrainOptions): flags
    on the command line (``flags``, generated from TrainOptions), keyword arguments in Python (``options``)."""

    task: str = option(kind=Text(), positional=True, metavar="NAME", api_name="name",
                       help="a paper preset or any construction name: its task, trained in the construction's shape "
                            "(exactlens list)")
    out: str | None = option(None, kind=Path_(), required_on_cli=True,
                             help="checkpoint directory (appears when training is complete)")
    overwrite: bool = option(False, kind=Bool(), help="replace an existing --out directory")
    seed: int = option(0, kind=Int(0), group="seeds", help="fixes initialization, training and test data")
    seeds: list | None = option(None, kind=SEEDS, group="seeds",
                                help="LO:HI or a comma list: one run per seed, trained together, into OUT/seed{s}/")
    device: Any = device_option("words and initial weights are drawn on the CPU whatever the device (run.json: device)")
    options: dict = option({}, kind=Pairs(), flag="--option", dest="option", extra=True,
                           help="any option of the preset (repeatable; values parsed as JSON where possible; in Python "
                                "every training option is a keyword argument)")
    flags: dict = option({}, kind=FlagsOf(TrainOptions), api=False,
                         help="the training options given as flags (--epochs 5, ...): one per TrainOptions field, "
                              "default the preset's value")


def _training_options(request: Any) -> dict[str, Any]:
    """--option pairs and the flags given (a switch only when on); an option given both ways with two values
    is refused (neither silently wins)."""
    given = request.flags  # the flags given (a switch only when on; 0 is a value)
    twice = sorted(k for k in set(given) & set(request.options) if given[k] != request.options[k])
    if twice:
        from exactlens.errors import ExactLensError

        flag = "--" + twice[0].replace("_", "-")
        raise ExactLensError(f"{twice[0]} is given twice with two values ({flag} {given[twice[0]]!r:.40} and --option "
                             f"{twice[0]}={request.options[twice[0]]!r:.40}); give it once")
    return {**request.options, **given}


def run(request: Any) -> Result:
    from exactlens.train import train, train_many

    options = _training_options(request)
    common = dict(out=request.out, progress=_evaluation_line, overwrite=request.overwrite, device=request.device,
                  **options)
    if request.seeds is not None:
        runs = train_many(request.task, request.seeds, **common)
        records = [_Record(r.info, r.checkpoint) for r in runs]
        return Result("train_many", {"runs": records}, runs=runs, models=[r.model for r in runs])
    one = train(request.task, seed=request.seed, **common)
    return Result("train", _Record(one.info, one.checkpoint), run=one, model=one.model, history=one.history)


class _Record(dict):
    """run.json's content (the JSON, unchanged) that also knows where its checkpoint is (for the text)."""

    def __init__(self, info: dict[str, Any], checkpoint: Any):
        super().__init__(info)
        self.checkpoint = checkpoint


def _final_text(final: dict[str, Any]) -> str:
    if final.get("test_mse") is not None:
        return f"final test MSE {final['test_mse']:.4g}"
    return (f"final test accuracy {final['test_accuracy']:.4f}, test cross-entropy "
            f"{final['test_loss_bits']:.4f} bits/string")


def _run_line(info: dict[str, Any], steps: bool) -> str:
    where = getattr(info, "checkpoint", None)
    took = f"{info['steps']} steps in {info['wall_s']:.1f} s; " if steps else ""
    return (f"{info['task']} seed {info['seed']}: {took}{_final_text(info['final'])}{_siit_text(info)}"
            + (f"; checkpoint {where}" if where is not None else ""))


def _siit_text(info: dict[str, Any]) -> str:
    """A SIIT run's held-out numbers (exactlens.train.siit): the lowest interchange accuracy of its mapped
    variables and the largest decision change when an unmapped component is resampled."""
    measured = (info.get("siit") or {}).get("measured")
    if not measured:
        return ""
    iias = [v["iia"] for v in measured["interchange"].values() if v["iia"] is not None]
    lowest = f"{min(iias):.3f}" if iias else "n/a"
    change = measured["max_resample_decision_change"]
    return (f"; SIIT held-out: interchange accuracy >= {lowest} over {len(measured['interchange'])} mapped "
            f"variable(s), largest resample change {'n/a' if change is None else format(change, '.3f')}")


def train_text(data: dict[str, Any]) -> str:
    """The text of a train result: one line per run (and, for several seeds, how long they took together)."""
    if "runs" not in data:
        return _run_line(data, steps=True)
    runs = data["runs"]
    lines = [_run_line(r, steps=False) for r in runs]
    return "\n".join([*lines, f"{len(runs)} runs trained together in {runs[0]['wall_s']:.1f} s"])


def _train_rows(info: dict[str, Any]) -> list[tuple[str, Any]]:
    final = info["final"]
    rows = [("task", info["task"]), ("seed", info["seed"]), ("steps", info["steps"]), ("seconds", info["wall_s"])]
    rows += [(k, v) for k, v in final.items() if k.startswith("test_") and v is not None and k != "test_evaluated"]
    return rows


def _plot_history(histories: list[list[dict[str, Any]]], title: str) -> Any:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(5, 3))
    for history in histories:
        tested = [r for r in history if r.get("test_evaluated")]
        key = "test_mse" if tested and tested[0].get("test_mse") is not None else "test_accuracy"
        ax.plot([r["epoch"] for r in tested], [r[key] for r in tested], marker=".")
        ax.set_ylabel(key.replace("_", " "))
    ax.set_xlabel("epoch")
    ax.set_title(title)
    return fig


VIEWS = {
    "train": View(_train_rows, train_text, lambda r: _plot_history([r.history], r["task"])),
    "train_many": View(
        lambda d: [("runs", len(d["runs"]))] + [(f"seed {r['seed']} {k}", v) for r in d["runs"]
                                                 for k, v in _train_rows(r)[4:]],
        train_text,
        lambda r: _plot_history([run.history for run in r.runs], f"{r['runs'][0]['task']}, {len(r.runs)} runs")),
}

register_verb(VerbSpec("train", "train a comparable model: a paper preset or any construction's shape", TrainRequest,
                       run, views=VIEWS, description=__doc__.split("\n\n")[1], order=40))


def _evaluation_line(message: str) -> None:
    """A line per evaluation where no bar shows: a log keeps what a terminal's bar shows."""
    from exactlens.progress import showing

    if not showing():
        tell(message)
