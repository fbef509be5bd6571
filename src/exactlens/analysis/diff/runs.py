"""The two models of a diff, the words they are run on, and what is recorded of each run.

Both models answer the same task (the exact construction's, with the parameters it was built
for). Each is read by its own reader: the construction by its decision rule, the trained model by
the rule its checkpoint records (the task kind's standard one for a trained model). The trained
side may be an ExactTransformer, a checkpoint directory, a construction name (diffing two
constructions), or any model with TransformerLens hook names and a ``cfg`` (e.g. a TransformerLens
4 ``TransformerBridge``), read with the task kind's standard readout.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from exactlens import tasks
from exactlens.constructions.registry import Construction, get_target
from exactlens.constructions.registry import names as construction_names
from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer
from exactlens.model.transformer import CONFIG_FILE
from exactlens.tasks.decisions import Reader

DEFAULT_LENGTHS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)


@dataclass
class Side:
    """One model of the diff with what the diff needs to know about it."""

    model: Any
    info: dict[str, Any]
    reader: Reader
    n_layers: int
    n_heads: int
    d_model: int
    norms: tuple[str, ...]  # per layer: "none" | "post" | "pre"
    readout_position: int
    max_positions: int | None
    sites: list[str] = field(default_factory=list)  # residual-like hook sites, in depth order
    patch_sites: list[str] = field(default_factory=list)  # residual-stream sites used for interventions
    readout: Any = None  # a foreign model's readout (exactlens.interop.readout.Readout), None: the standard one

    @property
    def exact(self) -> bool:
        return isinstance(self.model, ExactTransformer)

    def run(self, tokens: torch.Tensor, names: set[str]) -> tuple[torch.Tensor, dict[str, np.ndarray]]:
        logits, cache = self.model.run_with_cache(tokens, names_filter=lambda n: n in names)
        # the model runs on its device; what the diff compares comes back to the CPU
        return logits.detach().cpu(), {k: cache[k].detach().cpu().double().numpy() for k in names if k in cache}

    def outputs(self, logits: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
        """The task outputs (ExactTransformer.readout's shapes) from full logits [B, pos, out]."""
        if self.exact:
            return self.model.select_readout(logits, n_positions).double()
        task = self.reader.task
        if self.readout is not None:
            return self.readout.apply(task, logits, n_positions).double()
        if task.readout == "per_position":
            return logits.double()
        at = logits[torch.arange(logits.shape[0]), self._row(n_positions)].double()
        return at[:, 0] if task.kind == "membership" and at.shape[-1] == 1 else at

    def _row(self, n_positions: torch.Tensor) -> torch.Tensor:
        pos = self.readout_position
        return torch.full_like(n_positions, pos) if pos >= 0 else n_positions + pos


def _site_names(model: Any, n_layers: int, exact_side: bool) -> list[str]:
    hooks = set(getattr(model, "hook_dict", {}))
    names = ["blocks.0.hook_resid_pre"]
    for layer in range(n_layers):
        names.append(f"blocks.{layer}.hook_resid_mid")
        if not exact_side:
            names.append(f"blocks.{layer}.mlp.hook_post")
        names.append(f"blocks.{layer}.hook_resid_post")
    if not exact_side:
        names.append("ln_final.hook_normalized")
    return [n for n in names if n in hooks]


def make_side(model: Any, info: dict[str, Any], reader: Reader, readout_position: int, exact_side: bool,
              readout_spec: Any = None) -> Side:
    cfg = getattr(model, "cfg", None)
    if cfg is None or not hasattr(model, "run_with_cache"):
        raise ExactLensError(
            f"the trained model must have TransformerLens hooks and a cfg (an ExactTransformer, a checkpoint "
            f"directory, a construction name or a TransformerBridge), got {type(model).__name__}"
        )
    if isinstance(model, ExactTransformer):
        norms = cfg.per_layer("normalization")
        readout = cfg.readout_position
        max_pos = cfg.n_ctx if cfg.learned_positions else None
    else:
        norms = ("none" if getattr(cfg, "normalization_type", None) is None else "pre",) * int(cfg.n_layers)
        readout = readout_position
        max_pos = getattr(cfg, "n_ctx", None)
    side = Side(model, info, reader, int(cfg.n_layers), int(cfg.n_heads), int(cfg.d_model), tuple(norms), readout,
                max_pos, readout=None if isinstance(model, ExactTransformer) else readout_spec)
    side.sites = _site_names(model, side.n_layers, exact_side)
    # Residual-stream sites for interventions. In a TransformerBridge an edit at hook_resid_mid did not
    # reach the output (measured on an exported `first`), so other models are patched at resid_pre/post.
    side.patch_sites = [n for n in side.sites if "hook_resid_" in n and (side.exact or "resid_mid" not in n)]
    if not side.sites:
        raise ExactLensError(f"{type(model).__name__} has no hook blocks.0.hook_resid_pre / resid_mid / resid_post")
    return side


def check_vocab(model: Any, task: tasks.Task, what: str, against: str) -> dict[str, Any]:
    """The same token ids are fed to both models: their vocabularies must be the task's."""
    cfg = model.cfg
    vocab = task.vocab
    own = getattr(cfg, "vocab", None)
    if own is not None:
        if tuple(own) != tuple(vocab):
            raise ExactLensError(
                f"cannot compare {what} with {against}: its vocabulary {list(own)} differs from the task's "
                f"{list(vocab)} ({task_text(task)}); the same token ids are fed to both models"
            )
        return {"vocab": list(vocab), "vocab_check": "names"}
    d_vocab = int(getattr(cfg, "d_vocab", -1))
    if d_vocab != len(vocab):
        raise ExactLensError(
            f"cannot compare {what} with {against}: it has d_vocab={d_vocab} but the task {task!r} has "
            f"{len(vocab)} tokens {list(vocab)}"
        )
    return {"vocab": list(vocab), "vocab_check": "size only (the model names no tokens)"}


def task_text(task: tasks.Task) -> str:
    params = ", ".join(f"{k}={v}" for k, v in task.params.items())
    return f"task {task.name!r} ({task.kind}{', ' + params if params else ''})"


def trained_reader(model: Any, task: tasks.Task, what: str, against: str) -> Reader:
    """The trained side's reader: its recorded task must be the construction's (kinds and parameters)."""
    spec = getattr(getattr(model, "cfg", None), "task", None)
    if spec is not None:
        own = tasks.from_spec(spec)
        if own != task:
            raise ExactLensError(
                f"cannot compare {what} with {against}: they answer different tasks ({task_text(own)} vs "
                f"{task_text(task)}); diff compares two models of one task"
            )
    return tasks.reader(model, task) if isinstance(model, ExactTransformer) else Reader(task, None)


def resolve_trained(trained: Any) -> tuple[Any, dict[str, Any]]:
    """A model and its description from a model, a checkpoint directory or a construction name."""
    if isinstance(trained, (str, Path)):
        path = Path(trained)
        is_directory = path.is_dir()
        if isinstance(trained, str) and is_directory and trained in construction_names():
            # a bare name: the construction, unless a checkpoint of that name is here (then say which)
            if (path / CONFIG_FILE).exists():
                raise ExactLensError(
                    f"{trained!r} is both a construction and a checkpoint directory here; write ./{trained} for the "
                    f"checkpoint, or rename the directory to diff the construction {trained!r}"
                )
            is_directory = False
        if is_directory:
            model = ExactTransformer.load(path)
            model.eval()
            return model, {"kind": "checkpoint", "path": str(path)}
        construction = get_target(trained)
        return construction.make(dtype="float64"), {"kind": "construction", "name": construction.name}
    if not (isinstance(trained, torch.nn.Module) and hasattr(trained, "cfg")):
        raise ExactLensError(f"a model is an ExactTransformer or a TransformerLens model (a torch module with .cfg), "
                             f"a checkpoint directory or a construction name; got {type(trained).__name__} "
                             f"{trained!r:.80}")
    return trained, {"kind": "model"}


def describe(model: Any) -> dict[str, Any]:
    cfg = model.cfg
    out = {
        "class": type(model).__name__,
        "n_layers": int(cfg.n_layers),
        "n_heads": int(cfg.n_heads),
        "d_model": int(cfg.d_model),
        "d_head": int(cfg.d_head),
    }
    if isinstance(model, ExactTransformer):
        out.update(
            dtype=cfg.dtype,
            normalization=cfg.normalization if isinstance(cfg.normalization, str) else list(cfg.normalization),
            normalization_per_layer=list(cfg.per_layer("normalization")),
            d_mlp=cfg.d_mlp,
            attn_length_scale=list(cfg.per_layer("attn_length_scale")),
            attention_weighting=list(cfg.per_layer("attention_weighting")),
            readout=cfg.readout,
            model_name=cfg.model_name,
            task=cfg.task,
            decision_rule=cfg.decision_rule,
        )
    return out


# ----------------------------------------------------------------------------- words and runs


@dataclass
class LengthRun:
    """Everything recorded for the words of one length."""

    length: int
    ids: torch.Tensor  # symbol ids [S, length]
    tokens: torch.Tensor  # [S, n]
    n_positions: torch.Tensor  # [S] (every row is n)
    exhaustive: bool
    truth: torch.Tensor
    trained_outputs: torch.Tensor  # None in an exact-only run (run_exact)
    exact_outputs: torch.Tensor
    trained_acts: dict[str, np.ndarray]
    exact_acts: dict[str, np.ndarray]


def words(task: tasks.Task, length: int, strings: int, gen: torch.Generator) -> tuple[torch.Tensor, bool]:
    """Every word of the length when there are at most ``strings``, else ``strings`` sampled ones plus
    the task's hard words (e.g. FIRST's 1 0^(L-1), where the §5.2 model fails first)."""
    if len(task.alphabet) ** length <= strings:
        return task.all_words(length), True
    return torch.cat([task.sample(length, strings, gen), task.hard_words(length).long()]), False


HARD_WORDS_BOUND = 128  # a task's hard words per length (a bound: PALINDROME has ~100)
DIFF_PASSES = 4  # forward passes per word beyond the first (interventions, ablations), for the work estimate


def check_diff_cost(task: tasks.Task, lengths: Sequence[int], strings: int, trained: Side, exact: Side) -> None:
    """Refuse, before any word is drawn, lengths and strings whose runs cannot fit or finish: every
    length's run of both models is kept, with its residual sites and attention patterns (float64, in
    torch and in numpy)."""
    from exactlens.resources import check_memory, check_work

    kept = operations = 0.0
    k = max(len(task.alphabet), 2)
    for length in lengths:
        n_words = (min(strings, k**length) if length < 64 else strings) + HARD_WORDS_BOUND
        n_pos = length + task.n_specials
        for side in (trained, exact):
            per_word = (len(side.sites) + 2) * n_pos * side.d_model + side.n_layers * side.n_heads * n_pos**2
            kept += 2 * 8.0 * n_words * per_word
            per_layer = 12.0 * side.d_model**2 * n_pos + 2.0 * side.d_model * n_pos**2
            operations += (1 + DIFF_PASSES) * n_words * side.n_layers * per_layer
    span = str(list(lengths)) if len(lengths) <= 6 else f"{min(lengths)}..{max(lengths)}"
    what = f"the diff's runs on {strings} words per length at lengths {span}"
    lower = "use fewer --strings (API strings=) or shorter --lengths"
    check_memory(kept, what, lower)
    check_work(operations, what, lower)


def usable_lengths(
    lengths: Sequence[int] | None, construction: Construction, task: tasks.Task, trained: Side, exact: Side
) -> tuple[list[int], list[dict[str, Any]]]:
    """The lengths both models answer; given explicitly, an unusable length is an error."""
    explicit = lengths is not None
    if explicit and (isinstance(lengths, (str, bytes)) or not hasattr(lengths, "__iter__")):
        raise ExactLensError(f"lengths are a list of integers, got {lengths!r:.80}")
    wanted = list(DEFAULT_LENGTHS if lengths is None else lengths)
    if not wanted:
        raise ExactLensError("lengths must not be empty")
    for length in wanted:  # before sorting: a value of another type must not meet '<'
        if not isinstance(length, int) or isinstance(length, bool) or length < 0:
            raise ExactLensError(f"lengths must be integers >= 0, got {length!r:.80}")
    kept, skipped = [], []
    for length in sorted(set(wanted)):
        reasons = []
        try:
            construction.check_length(length, exact.model)
        except ExactLensError as err:
            reasons.append(str(err))
        for side, what in ((trained, "trained model"), (exact, "construction")):
            if side.max_positions is not None and length + task.n_specials > side.max_positions:
                reasons.append(f"{length + task.n_specials} positions exceed the {what}'s n_ctx={side.max_positions}")
        if reasons and explicit:
            raise ExactLensError(f"length {length}: " + "; ".join(reasons))
        if reasons:
            skipped.append({"length": length, "reason": "; ".join(reasons)})
        else:
            kept.append(length)
    if not kept:
        raise ExactLensError("no length is usable: " + "; ".join(s["reason"] for s in skipped))
    return kept, skipped


def run_both(
    task: tasks.Task, lengths: list[int], strings: int, seed: int, trained: Side, exact: Side
) -> list[LengthRun]:
    """Both models on the same words of every length, with the activations the parts need."""
    return with_trained(run_exact(task, lengths, strings, seed, exact), trained)


def run_exact(task: tasks.Task, lengths: list[int], strings: int, seed: int, exact: Side) -> list[LengthRun]:
    """The words of every length (drawn with ``seed``) and the exact model's run on them; the trained
    fields are empty until :func:`with_trained` (a timeline runs the exact side once for all its models)."""
    gen = torch.Generator().manual_seed(int(seed))
    return [run_exact_words(task, length, *words(task, length, strings, gen), exact) for length in lengths]


def run_exact_words(task: tasks.Task, length: int, ids: torch.Tensor, exhaustive: bool, exact: Side) -> LengthRun:
    """The exact model's run on the words ``ids`` of one length (``exhaustive``: they are every word of it)."""
    e_names = (set(exact.sites) | _attention_hooks(exact.n_layers) | set(post_norm_scales(exact))
               | {writer_site(exact, site) for site in exact.sites}
               | {recorded_hook(hook) for norm in zero_eps_norms(exact) for hook in norm})
    batch = task.encode(ids)
    e_logits, e_acts = exact.run(batch.tokens, e_names)
    return LengthRun(length, ids, batch.tokens, batch.n_positions, exhaustive, task.targets(ids), None,
                     exact.outputs(e_logits, batch.n_positions), {}, e_acts)


def with_trained(runs: list[LengthRun], trained: Side) -> list[LengthRun]:
    """The exact side's runs with the trained model's run on the same words (new records; ``runs`` unchanged)."""
    t_names = set(trained.sites) | _attention_hooks(trained.n_layers)
    out = []
    for run in runs:
        t_logits, t_acts = trained.run(run.tokens, t_names)
        out.append(replace(run, trained_outputs=trained.outputs(t_logits, run.n_positions), trained_acts=t_acts))
    return out


def post_norm_scales(side: Side) -> list[str]:
    """The scale hooks of the side's post-LN layer norms, in depth order (ln1 before resid_mid, ln2 before
    resid_post of each post-LN layer); none for pre-LN or norm-free layers."""
    hooks = set(getattr(side.model, "hook_dict", {}))
    names = [f"blocks.{layer}.{ln}.hook_scale" for layer, norm in enumerate(side.norms) if norm == "post"
             for ln in ("ln1", "ln2")]
    return [n for n in names if n in hooks]


def writer_site(side: Side, site: str) -> str:
    """Where a label settled at ``site`` is patched: the site itself, or, in a post-LN layer, the output of the
    component that writes it (hook_attn_out for resid_mid, hook_mlp_out for resid_post). There the residual is
    normalized after the add, so setting a coordinate of the normalized stream is not what a different write
    would do (its norm, and so every coordinate's scale, would change too), and a trained model's component
    output could only match it approximately (parity-ln's k/n: 0.96 of training pairs)."""
    parts = site.split(".")
    if len(parts) != 3 or not parts[1].isdigit() or side.norms[int(parts[1])] != "post":
        return site
    component = {"hook_resid_mid": "hook_attn_out", "hook_resid_post": "hook_mlp_out"}.get(parts[2])
    writer = f"blocks.{parts[1]}.{component}"
    return writer if component and writer in getattr(side.model, "hook_dict", {}) else site


def _first_norm_after(site: str) -> tuple[int, str] | None:
    """(layer, "ln1" | "ln2") of the first layer norm applied after ``site``, in depth order."""
    layer, hook = int(site.split(".")[1]), site.split(".")[-1]
    return {"hook_resid_pre": (layer, "ln1"), "hook_resid_mid": (layer, "ln2"),
            "hook_resid_post": (layer + 1, "ln1")}.get(hook)


def later_scale(runs: list[LengthRun], side: Side, site: str) -> np.ndarray:
    """[N] per pooled row, the product of the post-LN scales applied after ``site`` (1 where none is). A
    residual coordinate that no later component writes reaches the end divided by exactly this product
    (post-LN divides the whole stream by its scale; in a doubled residual [x; -x] the mean it subtracts is 0),
    so ``value / later_scale`` is the value as the last site holds it."""
    first = _first_norm_after(site)
    product = np.ones(sum(run.tokens.numel() for run in runs))
    for name in post_norm_scales(side) if first is not None else ():
        if (int(name.split(".")[1]), name.split(".")[2]) >= first:
            product = product * pooled(runs, name, "exact")[:, 0]
    return product


ROUNDING_UNITS = 64  # a post-LN input (eps = 0) this many rounding units of its summands' size is zero


def zero_eps_norms(side: Side) -> list[tuple[str, str, str]]:
    """(scale hook, residual hook, component hook) of each post layer norm with eps = 0 of an exact side, in
    depth order: its scale, and the two summands of its input (the residual stream and the component output
    it adds)."""
    model, out = side.model, []
    for name in post_norm_scales(side) if side.exact else []:
        layer, ln = name.split(".")[1], name.split(".")[2]
        if model.blocks[int(layer)].get_submodule(ln).eps != 0:
            continue
        parts = ("hook_resid_pre", "hook_attn_out") if ln == "ln1" else ("hook_resid_mid", "hook_mlp_out")
        hooks = (name, *(f"blocks.{layer}.{part}" for part in parts))
        if all(h in model.hook_dict for h in hooks):
            out.append(hooks)
    return out


def normalizes_rounding(scale: Any, residual: Any, component: Any, dtype: torch.dtype) -> torch.Tensor:
    """[B] bool, the one criterion of a post-LN (eps = 0) that normalized rounding noise: its scale (its input's
    rms) is at most ROUNDING_UNITS rounding units of ``dtype`` of its summands' size (the larger rms of the
    ``residual`` [B, d] and the ``component`` output [B, d] whose sum it normalizes). Such a norm scales noise to
    unit size: what follows it there is decided by rounding, not by the circuit (Chiang & Cholak Prop. 2's
    confidence layer where s = 0). Used on a forward's readout rows (:class:`.alignment.variables.NormWatch`)
    and on every pooled row of the runs (:func:`degenerate_rows`)."""
    def rms(x: Any) -> torch.Tensor:
        return torch.as_tensor(x).double().pow(2).mean(-1).sqrt()

    size = torch.maximum(rms(residual), rms(component))
    return torch.as_tensor(scale).double().reshape(len(size)).abs() <= ROUNDING_UNITS * torch.finfo(dtype).eps * size


def recorded_hook(name: str) -> str:
    """The hook a run records for ``name``: blocks.L.hook_resid_pre is blocks.(L-1).hook_resid_post."""
    parts = name.split(".")
    if parts[-1] == "hook_resid_pre" and int(parts[1]) > 0:
        return f"blocks.{int(parts[1]) - 1}.hook_resid_post"
    return name


def degenerate_rows(runs: list[LengthRun], side: Side, site: str) -> np.ndarray:
    """[N] bool per pooled row: a post-LN norm with eps = 0 before ``site`` divided a stream that was zero up
    to rounding (:func:`normalizes_rounding`; Chiang & Cholak Prop. 2's confidence layer at the positions it
    clears), so what the site holds there is amplified noise."""
    first = _first_norm_after(site)
    out = np.zeros(sum(run.tokens.numel() for run in runs), dtype=bool)
    dtype = side.model.cfg.torch_dtype
    for name, residual, component in zero_eps_norms(side):
        if first is None or (int(name.split(".")[1]), name.split(".")[2]) < first:
            out |= normalizes_rounding(pooled(runs, name, "exact"), pooled(runs, recorded_hook(residual), "exact"),
                                       pooled(runs, component, "exact"), dtype).numpy()
    return out


def _attention_hooks(n_layers: int) -> set[str]:
    names = set()
    for layer in range(n_layers):
        names |= {f"blocks.{layer}.attn.hook_pattern", f"blocks.{layer}.hook_resid_pre",
                  f"blocks.{layer}.ln1.hook_normalized", f"blocks.{layer}.hook_resid_mid"}
    return names


# ----------------------------------------------------------------------------- pooled rows


@dataclass
class Rows:
    """Pooled rows (one per real position) of every length, for probes and alignment maps."""

    sequence: np.ndarray  # [N] sequence index (global over lengths)
    position: np.ndarray  # [N]
    is_readout: np.ndarray  # [N] bool: a position the exact model's readout reads


def pool(runs: list[LengthRun], exact: Side) -> Rows:
    seq, pos, ro = [], [], []
    offset = 0
    for run in runs:
        s, n = run.tokens.shape
        seq.append(np.repeat(np.arange(s) + offset, n))
        p = np.tile(np.arange(n), s)
        pos.append(p)
        rows = exact.model.readout_rows(run.n_positions)
        ro.append(np.ones_like(p, dtype=bool) if rows is None else p == int(rows[0]))
        offset += s
    return Rows(np.concatenate(seq), np.concatenate(pos), np.concatenate(ro))


def pooled(runs: list[LengthRun], name: str, which: str) -> np.ndarray:
    """Activations at hook ``name`` of every position of every word, [N, d] (``which``: trained/exact)."""
    parts = []
    for run in runs:
        a = (run.trained_acts if which == "trained" else run.exact_acts)[name]
        parts.append(a.reshape(a.shape[0] * a.shape[1], -1))
    return np.concatenate(parts)


def same_decisions(task: tasks.Task, a: torch.Tensor, b: torch.Tensor, n_positions: torch.Tensor,
                   tolerance: float, truth: torch.Tensor | None = None) -> torch.Tensor:
    """bool [B]: the two decisions of each word agree (at every target position, ``truth`` leaving
    out undefined ones; regression: within ``tolerance``)."""
    if task.kind in ("membership", "classification"):
        return a == b
    width = min(a.shape[1], b.shape[1])
    valid = task.target_mask(n_positions - task.n_specials, width, truth)
    if task.kind == "regression":
        equal = (a[:, :width].double() - b[:, :width].double()).abs() <= tolerance
    else:
        equal = a[:, :width] == b[:, :width]
    return (equal | ~valid).all(1)
