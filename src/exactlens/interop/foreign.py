"""A researcher's own model as an exactlens model: a TransformerLens 3 ``HookedTransformer``, a TransformerLens 4
``TransformerBridge`` (``boot_native`` or over a Hugging Face model) or any model with TransformerLens weight
names (``W_E``, ``W_pos``, ``blocks[l].attn.W_Q`` ...).

:func:`family` names what a model is; :func:`facts` reads its shape from its config (layers, heads, widths,
vocabulary, causal or not, normalization); :func:`to_exact` copies its weights into an ExactTransformer of the
task, with the readout (exactlens.interop.readout) folded into its unembedding, and checks on random tokens
that both give the same outputs (else it refuses, saying by how much they differ): every verb then runs on
the copy. :func:`resolve_model` is what the verbs call on a target that may be a foreign model.
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from exactlens.errors import ExactLensError
from exactlens.interop.readout import Readout, default_readout, parse_readout

__all__ = ["facts", "family", "is_foreign", "resolve_model", "to_exact", "untrained_copy"]

CHECK_TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-9}  # relative to the logits' scale


def family(model: Any) -> str | None:
    """'exact' | 'hooked_transformer' | 'bridge' | 'hooked' (another model with TL weight names) | None."""
    from exactlens.model import ExactTransformer

    if isinstance(model, ExactTransformer):
        return "exact"
    names = [c.__name__ for c in type(model).__mro__]
    if "TransformerBridge" in names:
        return "bridge"
    if "HookedTransformer" in names:
        return "hooked_transformer"
    if hasattr(model, "cfg") and hasattr(model, "run_with_cache") and hasattr(model, "blocks"):
        return "hooked"
    return None


def is_foreign(model: Any) -> bool:
    return family(model) in ("hooked_transformer", "bridge", "hooked")


def _source(model: Any) -> str:
    fam = family(model)
    if fam == "bridge":
        original = type(getattr(model, "original_model", None)).__name__
        how = "boot_native" if original == "NativeModel" else f"over Hugging Face {original}"
        return f"TransformerLens 4 TransformerBridge ({how})"
    return {"hooked_transformer": "TransformerLens HookedTransformer", "hooked": type(model).__name__}.get(
        fam, type(model).__name__)


def facts(model: Any) -> dict[str, Any]:
    """The model's shape and conventions as its config states them."""
    cfg = model.cfg
    n_heads = int(cfg.n_heads)
    d_model = int(cfg.d_model)
    d_mlp = getattr(cfg, "d_mlp", None)
    return {
        "class": type(model).__name__, "source": _source(model), "n_layers": int(cfg.n_layers), "n_heads": n_heads,
        "d_model": d_model, "d_head": int(getattr(cfg, "d_head", None) or d_model // n_heads),
        "d_mlp": 0 if getattr(cfg, "attn_only", False) or not d_mlp else int(d_mlp),
        "d_vocab": int(cfg.d_vocab), "d_vocab_out": int(getattr(cfg, "d_vocab_out", None) or cfg.d_vocab),
        "n_ctx": int(cfg.n_ctx) if getattr(cfg, "n_ctx", None) else None,
        "causal": getattr(cfg, "attention_dir", "causal") == "causal",
        "normalization_type": getattr(cfg, "normalization_type", None),
        "act_fn": getattr(cfg, "act_fn", None),
        "positional_embedding_type": getattr(cfg, "positional_embedding_type", "standard"),
        "eps": float(getattr(cfg, "eps", 1e-5)),
        "attn_scale": _attn_scale(cfg, d_model // n_heads),
    }


def _attn_scale(cfg: Any, d_head: int) -> float:
    """The divisor of the attention scores (TransformerLens: sqrt(d_head) unless a positive attn_scale is set)."""
    if not getattr(cfg, "use_attn_scale", True):
        return 1.0
    scale = getattr(cfg, "attn_scale", None)
    return float(scale) if scale is not None and scale > 0 else float((getattr(cfg, "d_head", None) or d_head) ** 0.5)


def _problems(f: dict[str, Any], model: Any) -> list[str]:
    cfg = model.cfg
    out = []
    if f["positional_embedding_type"] != "standard":
        out.append(f"positional_embedding_type={f['positional_embedding_type']!r} (only a learned table, 'standard')")
    if f["normalization_type"] not in (None, "LN"):
        out.append(f"normalization_type={f['normalization_type']!r} (only 'LN' or None)")
    if f["d_mlp"] and f["act_fn"] not in ("relu", "gelu"):
        out.append(f"act_fn={f['act_fn']!r} (only 'relu' or 'gelu')")
    for flag in ("gated_mlp", "parallel_attn_mlp", "use_local_attn", "final_rms", "post_embedding_ln"):
        if getattr(cfg, flag, False):
            out.append(f"{flag}=True")
    if f["n_ctx"] is None:
        out.append("no n_ctx")
    return out


def _param(module: Any, *names: str) -> torch.Tensor | None:
    for name in names:
        value = getattr(module, name, None)
        if isinstance(value, torch.Tensor):
            return value.detach()
    return None


def _ln(module: Any, d: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    w = _param(module, "w", "weight")
    b = _param(module, "b", "bias")
    return (torch.ones(d, dtype=dtype) if w is None else w.to(dtype).cpu(),
            torch.zeros(d, dtype=dtype) if b is None else b.to(dtype).cpu())


def _unembed(model: Any, readout: Readout, n_out: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    w_u = model.W_U.detach().to(dtype).cpu()
    b_u = model.b_U.detach().to(dtype).cpu() if getattr(model, "b_U", None) is not None else torch.zeros(n_out)
    readout.width(w_u.shape[1])
    if readout.outputs is None:
        return w_u, b_u
    how, a, b = readout.outputs
    if how == "index":
        return w_u[:, a:a + 1], b_u[a:a + 1]
    if how == "diff":
        return w_u[:, a:a + 1] - w_u[:, b:b + 1], b_u[a:a + 1] - b_u[b:b + 1]
    return w_u[:, a:b], b_u[a:b]


def _dtype(model: Any) -> torch.dtype:
    param = next(iter(model.parameters()), None)
    return torch.float64 if param is not None and param.dtype == torch.float64 else torch.float32


def to_exact(model: Any, task: Any, readout: Any = None, name: str | None = None) -> Any:
    """An ExactTransformer of ``task`` computing ``model``'s outputs read by ``readout`` (default: the task's).

    Refuses (ExactLensError naming each reason) what an ExactTransformer cannot hold: another positional
    scheme, RMS norm, gated or parallel MLPs, a vocabulary other than the task's, a callable readout; and a
    copy whose outputs differ from the model's on random tokens."""
    from exactlens.model import ExactConfig, ExactTransformer

    readout = parse_readout(readout) or default_readout(task)
    f = facts(model)
    problems = _problems(f, model)
    if f["d_vocab"] != len(task.vocab):
        problems.append(f"d_vocab={f['d_vocab']}, but task {task.name!r} has {len(task.vocab)} token ids "
                        f"{dict(enumerate(task.vocab))} (see `exactlens task {task.name}`)")
    if readout.fn is None and readout.position == "cls" and not task.use_cls:
        problems.append(f"readout 'cls', but task {task.name!r} has no [CLS]")
    if problems:
        raise ExactLensError(f"cannot read {f['source']} as a model of task {task.name!r}: " + "; ".join(problems))
    dtype = _dtype(model)
    called = readout.fn is not None  # a callable reads the full logits: kept whole, applied by the copy
    w_u, b_u = _unembed(model, Readout("every") if called else readout, f["d_vocab_out"], dtype)
    if not called and task.readout == "per_position" and readout.position != "every":
        raise ExactLensError(f"task {task.name!r} ({task.kind}) is answered at every position: readout 'every'")
    if not called and task.readout != "per_position" and readout.position == "every":
        raise ExactLensError(f"task {task.name!r} ({task.kind}) is answered at one position: readout cls, last "
                             "or an index")
    if not called:  # outputs of the wrong shape for the task: said as the readout says it, before any copy
        readout.apply(task, torch.zeros(1, f["n_ctx"], int(model.W_U.shape[1])), torch.tensor([f["n_ctx"]]))
    position = 0 if called else {"cls": 0, "last": -1, "every": 0}.get(readout.position, readout.position)
    cfg = ExactConfig(
        d_model=f["d_model"], n_layers=f["n_layers"], d_vocab=f["d_vocab"], n_heads=f["n_heads"], d_head=f["d_head"],
        d_mlp=f["d_mlp"], d_vocab_out=int(w_u.shape[1]), attention_mask="causal" if f["causal"] else "none",
        attn_scale=f["attn_scale"], normalization="pre" if f["normalization_type"] == "LN" else "none",
        ln_eps=f["eps"], act_fn=f["act_fn"] if f["d_mlp"] else "relu", positional_features=("learned",),
        n_ctx=f["n_ctx"], readout="per_position" if called else task.readout, readout_position=int(position),
        vocab=tuple(task.vocab),
        task=task.spec(), dtype="float64" if dtype == torch.float64 else "float32",
        model_name=name or f"{f['class']} ({task.name}, readout {readout.text})",
        metadata={"imported_from": f["source"], "readout": readout.text})
    if called:
        from exactlens.interop.called import CalledReadout

        exact = CalledReadout(cfg, readout.fn)
    else:
        exact = ExactTransformer(cfg)
    state = exact.state_dict()
    state["embed.W_E"] = model.W_E.detach()
    state["pos_embed.W_pos"] = model.W_pos.detach()
    for layer, block in enumerate(model.blocks):
        pre = f"blocks.{layer}."
        for key in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
            value = _param(block.attn, key)
            if value is None:
                raise ExactLensError(f"cannot read {f['source']}: block {layer}'s attention has no {key}")
            state[pre + "attn." + key] = value
        if f["d_mlp"]:
            for key in ("W_in", "b_in", "W_out", "b_out"):
                state[pre + "mlp." + key] = _param(block.mlp, key)
        if cfg.uniform("normalization") == "pre":
            state[pre + "ln1.w"], state[pre + "ln1.b"] = _ln(block.ln1, f["d_model"], dtype)
            if f["d_mlp"]:
                state[pre + "ln2.w"], state[pre + "ln2.b"] = _ln(block.ln2, f["d_model"], dtype)
    if cfg.final_ln:
        state["ln_final.w"], state["ln_final.b"] = _ln(model.ln_final, f["d_model"], dtype)
    state["unembed.W_U"], state["unembed.b_U"] = w_u, b_u
    exact.load_state_dict({k: v.to(dtype).cpu().reshape(state[k].shape) for k, v in state.items()}, strict=True)
    exact.eval()
    _check_same(model, exact, task, readout, f)
    return exact


@torch.no_grad()
def _check_same(model: Any, exact: Any, task: Any, readout: Readout, f: dict[str, Any]) -> None:
    """Both give the same outputs on random tokens of the task's vocabulary (full rows, no padding); with a
    callable readout, the same full logits (and the callable's outputs have the task's shape)."""
    gen = torch.Generator().manual_seed(0)
    n = min(f["n_ctx"], 8)
    tokens = torch.randint(0, f["d_vocab"], (8, n), generator=gen)
    n_pos = torch.full((8,), n)
    device = next(iter(model.parameters())).device
    training = model.training
    model.eval()  # dropout off (a Hugging Face model is built in training mode)
    try:
        logits = model(tokens.to(device)).detach().cpu().to(exact.cfg.torch_dtype)
    finally:
        model.train(training)
    if readout.fn is not None:
        _check_called_shape(exact, task, f)
        theirs, ours = logits, exact(tokens)
    else:
        theirs, ours = readout.apply(task, logits, n_pos), exact.select_readout(exact(tokens), n_pos)
    if ours.shape != theirs.shape:
        raise ExactLensError(f"cannot read {f['source']}: its outputs have shape {tuple(theirs.shape)}, the copy's "
                             f"{tuple(ours.shape)}")
    gap = float((ours - theirs).abs().max())
    scale = max(float(theirs.abs().max()), 1.0)
    if not gap <= CHECK_TOLERANCE[exact.cfg.torch_dtype] * scale:
        raise ExactLensError(
            f"cannot read {f['source']} as an ExactTransformer: the copy's outputs differ from the model's by up "
            f"to {gap:.3g} on random tokens (a feature its config does not state, e.g. another attention scale, "
            "activation or normalization)")


def _check_called_shape(exact: Any, task: Any, f: dict[str, Any]) -> None:
    """A callable readout gives the task's outputs on a few of its words: [batch] (membership, regression),
    [batch, classes] (classification) or [batch, pos, ...] (prediction)."""
    length = max(task.min_length, min(2, f["n_ctx"] - task.n_specials))
    batch = task.encode(task.words(length, 4, torch.Generator().manual_seed(0), exhaustive_limit=4)[0])
    try:
        out = exact.select_readout(exact(batch.tokens), batch.n_positions)
    except Exception as err:  # the user's function: its own error, said as it is
        raise ExactLensError(f"the readout callable failed on task {task.name!r}'s words: {type(err).__name__}: "
                             f"{err}") from err
    rows = batch.tokens.shape[0]
    want = {"membership": (rows,), "regression": (rows,), "classification": (rows, task.n_outputs)}.get(task.kind)
    shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
    per_position_ok = isinstance(out, torch.Tensor) and tuple(out.shape[:2]) == tuple(batch.tokens.shape)
    if (want is not None and shape != want) or (want is None and not per_position_ok):
        expected = want if want is not None else "(batch, positions, ...)"
        raise ExactLensError(f"the readout callable gives shape {shape} on {rows} words of task {task.name!r} "
                             f"({task.kind}); it must give {expected}")


def resolve_model(target: Any, task: Any = None, readout: Any = None) -> tuple[Any, dict[str, Any] | None]:
    """The target itself (not foreign), or its ExactTransformer copy and a description of the import.

    ``task``: a task name or Task (needed when the model records none)."""
    if not is_foreign(target):
        if readout is not None:
            raise ExactLensError("readout= applies to a model exactlens did not build (a HookedTransformer or a "
                                 "TransformerBridge); an exactlens model reads its own readout")
        return target, None
    task = foreign_task(target, task)
    exact = to_exact(target, task, readout)
    return exact, {"kind": "foreign", **facts(target), "task": task.spec(), "readout": exact.cfg.metadata["readout"],
                   "imported": "weights copied into an ExactTransformer; outputs checked equal on random tokens"}


def foreign_task(model: Any, task: Any) -> Any:
    """The task of a foreign model: the one given (a name or a Task), else its cfg.task, else refused."""
    from exactlens import tasks

    if task is None:
        spec = getattr(model.cfg, "task", None)
        if spec is None:
            raise ExactLensError(
                f"{_source(model)} records no task: name it (task='first', --task first; `exactlens task NAME` "
                "shows its token ids, answer position and output shape)")
        return tasks.from_spec(spec)
    return tasks.get(task) if isinstance(task, str) else task


def untrained_copy(model: Any) -> tuple[Any | None, str]:
    """A copy of a foreign model re-initialized by its own initializer, or None and why not."""
    fresh = copy.deepcopy(model)
    original = getattr(fresh, "original_model", None)
    hf_init = getattr(original, "_init_weights", None)
    if callable(hf_init):  # a bridge over a Hugging Face model: the model's own _init_weights, module by module
        original.apply(hf_init)
        return fresh, f"{type(original).__name__}._init_weights"
    init = getattr(fresh, "init_weights", None)
    if callable(init):
        try:
            init()
        except RuntimeError as err:
            return None, f"{type(model).__name__}.init_weights refused: {err}"
        return fresh, f"{type(model).__name__}.init_weights"
    return None, f"{type(model).__name__} has no initializer (init_weights or a Hugging Face _init_weights)"


CHANCE_MARGIN = 0.1  # accuracy within this of the majority answer's rate counts as chance
WARN_WORDS = 64  # words per length of the quick check


@torch.no_grad()
def readout_warning(model: Any, exact: Any, task: Any, readout: Any, lengths: list[int], seed: int = 0) -> str | None:
    """A warning when ``model`` (read by ``readout``) is near chance on a few words while the construction
    ``exact`` is right (``exact`` None: whenever it is near chance), naming what most likely does not
    match (the answer position, the output shape, the token ids), with the accuracy of the readouts that do
    better. None when nothing is wrong; an exactlens model (read by its own readout) is not checked."""
    if not is_foreign(model) or task.kind not in ("membership", "classification"):
        return None
    readout = parse_readout(readout) or default_readout(task)
    gen = torch.Generator().manual_seed(seed)
    device = next(iter(model.parameters())).device
    model.eval()  # the diff runs it in eval mode too
    rows = []
    for length in lengths[-3:]:
        ids = task.words(length, WARN_WORDS, gen, exhaustive_limit=WARN_WORDS)[0]
        batch = task.encode(ids)
        rows.append((batch, task.targets(ids), model(batch.tokens.to(device)).detach().cpu().double()))
    truth = torch.cat([t for _, t, _ in rows])
    base = float(max((truth == v).double().mean() for v in truth.unique()))
    exact_ok = True  # without a construction (verify), a model near chance is said all the same
    if exact is not None:
        exact_right = torch.cat([tasks_reader(exact, task).decide(exact.select_readout(exact(b.tokens.to(
            next(exact.parameters()).device)).cpu(), b.n_positions), b.n_positions) == t for b, t, _ in rows])
        exact_ok = float(exact_right.double().mean()) >= 0.99

    def accuracy(spec: Readout) -> float | None:
        try:
            right = [tasks_reader(None, task).decide(spec.apply(task, logits, b.n_positions), b.n_positions) == t
                     for b, t, logits in rows]
        except ExactLensError:
            return None
        return float(torch.cat(right).double().mean())

    own = accuracy(readout)
    if own is None:  # the outputs do not fit the task's shape: refused now, with the readouts that do
        try:
            readout.apply(task, rows[0][2], rows[0][0].n_positions)
        except ExactLensError as err:
            fits = [(a, accuracy(a)) for a in _alternatives(task, readout)]
            fits = [f"{a.text!r} (accuracy {acc:.3f})" for a, acc in fits if acc is not None]
            raise ExactLensError(f"{err}" + (f"; readouts that fit: {', '.join(fits)}" if fits else "")) from None
    if not exact_ok or (own is not None and own > base + CHANCE_MARGIN):
        return None
    better = sorted(((a, accuracy(a)) for a in _alternatives(task, readout)), key=lambda x: -(x[1] or 0))
    better = [(a, acc) for a, acc in better if acc is not None and acc > base + CHANCE_MARGIN][:2]
    shown = "n/a (the outputs do not fit the task's shape)" if own is None else f"{own:.3f}"
    head = (f"the model's accuracy with readout {readout.text!r} is {shown} on {len(truth)} words, near chance "
            f"({base:.3f}: the most common answer)" + (", while the construction is right" if exact is not None
                                                        else ""))
    if better:
        tried = ", ".join(f"{a.text!r} gives {acc:.3f}" for a, acc in better)
        return f"{head}; readout {tried}: likely an answer-position or output-shape mismatch (pass readout=)"
    return (f"{head}, and no other readout does better: check the token ids and special tokens "
            f"(`exactlens task {task.name}`), the answer position and the output shape")


def _alternatives(task: Any, readout: Readout) -> list[Readout]:
    outputs = (None, ("diff", 1, 0), ("index", 0, 0))
    return [Readout(p, o) for p in ("cls", "last") for o in outputs
            if (p != "cls" or task.use_cls) and Readout(p, o) != readout]


def tasks_reader(model: Any, task: Any) -> Any:
    from exactlens import tasks

    return tasks.reader(model, task)


def untrained_foreign(model: Any, task: Any, readout: Readout, seed: int) -> tuple[Any | None, str]:
    """The untrained baseline of a foreign model: a copy re-initialized by its own initializer (seeded),
    read as an ExactTransformer; None and why where it has none or its copy cannot be read."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        fresh, how = untrained_copy(model)
    if fresh is None:
        return None, how
    try:
        return to_exact(fresh, task, readout), f"re-initialized by {how} (seed {seed})"
    except ExactLensError as err:
        return None, f"re-initialized by {how}, but the copy cannot be read: {err}"
