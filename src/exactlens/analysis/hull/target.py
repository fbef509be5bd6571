"""The hull verb's analysis of a model object (an ExactTransformer, or a foreign model's checked copy): the
checkpoint analysis of exactlens.analysis.hull.model on the model's own words. The ``hull`` verb and the
report's model section both run it."""

from __future__ import annotations

from typing import Any

from exactlens.analysis.hull.request import HullRequest
from exactlens.interop.model_target import ModelTarget, longest_of, on_device

__all__ = ["model_report"]


def model_report(model: Any, request: HullRequest, foreign: dict[str, Any] | None) -> dict[str, Any]:
    """hull_report's checkpoint analysis on a model object (an ExactTransformer, or a foreign model's copy).
    With a known task (the model's cfg.task, or the one named for a foreign model): four of the task's words
    per length, encoded as the model reads them (its token ids, [CLS] at its position), at ``lengths``
    (word lengths; default 3, 7, 15 less the task's special tokens, capped at the longest the model answers);
    without one: uniformly random token ids of its vocabulary at the default numbers of positions."""
    import torch

    from exactlens.analysis.hull.model import unselectable_by_layer
    from exactlens.devices import device_name, resolve_device
    from exactlens.errors import ExactLensError
    from exactlens.model import ExactTransformer

    if not isinstance(model, ExactTransformer):
        raise ExactLensError(f"hull takes a checkpoint directory, a construction name or a model (an "
                             f"ExactTransformer, HookedTransformer or TransformerBridge), got {type(model).__name__}")
    cfg = model.cfg
    where = resolve_device(request.device, cfg.dtype)
    gen = torch.Generator().manual_seed(int(request.seed))
    info = {"kind": "foreign" if foreign else "model", "name": cfg.model_name, "dtype": cfg.dtype,
            "sequences_per_length": 4, "seed": int(request.seed)}
    if cfg.task is not None:
        tokens, n_positions, lengths = _task_words(model, request.lengths, gen)
        info.update(lengths=lengths, positions=sorted({n + _task(model).n_specials for n in lengths}),
                    tokens=f"words of task {cfg.task['name']!r} (its token ids and special tokens)")
    else:
        tokens, n_positions, wanted = _random_ids(model, request.lengths, gen)
        info.update(positions=wanted, tokens="uniform random ids (the model records no task)")
    result = unselectable_by_layer(on_device(model, where), tokens, n_positions=n_positions, tol=request.tol)
    return {"target": info, **result, "device": device_name(where)}


def _task(model: Any) -> Any:
    from exactlens import tasks

    return tasks.from_spec(model.cfg.task)


def _task_words(model: Any, lengths: list | None, gen: Any) -> tuple[Any, Any, list[int]]:
    from exactlens.analysis.hull.model import DEFAULT_CHECKPOINT_POSITIONS, _pad, encoded_words
    from exactlens.errors import ExactLensError

    task = _task(model)
    longest = longest_of(ModelTarget(model, task, "", {}))
    low = max(1, task.min_length)
    if lengths is None:
        wanted = [max(low, n - task.n_specials) for n in DEFAULT_CHECKPOINT_POSITIONS]
        wanted = sorted({n if longest is None else min(n, longest) for n in wanted})
    else:
        wanted = sorted(set(lengths))
        for n in wanted:
            task.check_length(n)
            if longest is not None and n > longest:
                raise ExactLensError(f"length {n} is beyond what the model answers (|w| <= {longest}: its position "
                                     "table or its task)")
    tokens, n_positions = _pad(encoded_words(task, wanted, 4, gen))
    return tokens, n_positions, wanted


def _random_ids(model: Any, lengths: list | None, gen: Any) -> tuple[Any, Any, list[int]]:
    import torch

    from exactlens.analysis.hull.model import DEFAULT_CHECKPOINT_POSITIONS, _pad

    cfg = model.cfg
    wanted = sorted({min(n, cfg.n_ctx) if cfg.learned_positions else n
                     for n in (lengths or DEFAULT_CHECKPOINT_POSITIONS)})
    tokens, n_positions = _pad([torch.randint(0, cfg.d_vocab, (4, n), generator=gen) for n in wanted])
    return tokens, n_positions, wanted
