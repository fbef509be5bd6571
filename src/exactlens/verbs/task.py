"""``exactlens task NAME [--param K=V]``: a task's conventions, the contract a model of it must keep.

Its token ids, the special tokens and where they sit, the answer position and the output shape of its
standard readout, whether attention may look ahead, and one example word as tokens: what a model trained
outside exactlens (TransformerLens, Hugging Face) must match for ``diff``, ``discover``, ``hull`` and
``circuit`` to read it (or say otherwise with ``--readout``, exactlens.interop.readout).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from exactlens.requests import Pairs, Text, option
from exactlens.results import Result, View
from exactlens.verbs import VerbSpec, register_verb

__all__ = ["TaskRequest", "conventions", "run"]

_SHAPES = {
    "membership": "one logit per word, [batch] (accept iff > 0; a sigmoid's input); a two-logit head (reject, "
                  "accept) is read with readout POSITION/1-0",
    "classification": "one logit per class per word, [batch, {n}] (the answer is the argmax)",
    "prediction": "one logit per class at every position, [batch, positions, {n}] (the answer at each symbol "
                  "is the argmax)",
    "regression": "one value per position, [batch, positions]",
}


@dataclass(frozen=True)
class TaskRequest:
    name: str = option(kind=Text(), positional=True, help="a task name (see `exactlens list`)")
    params: dict = option({}, kind=Pairs(), flag="--param", dest="param", extra=True,
                          help="task parameter, e.g. --param k=2 (repeatable; in Python keyword arguments)")


def conventions(name: str, **params: Any) -> dict[str, Any]:
    """The task's conventions as a JSON-ready dict (the fields docs/your_model.md lists)."""
    from exactlens import tasks
    from exactlens.interop.readout import default_readout

    task = tasks.get(name, **params)
    specials = []
    if task.use_cls:
        specials.append({"token": task.cls_token, "id": task.token_id(task.cls_token), "position": "first (0)"})
    if task.use_eos:
        specials.append({"token": "[EOS]", "id": task.token_id("[EOS]"), "position": "last (n_positions - 1)"})
    readout = default_readout(task)
    answer = {"every": "every symbol position", "cls": "position 0 ([CLS])",
              "last": "each word's last position"}[str(readout.position)]
    example_word = task.decode(task.sample(max(task.min_length, 3), 1, _generator())[0:1])[0]
    batch = task.tokenize([example_word])
    return {
        "task": task.spec(), "kind": task.kind,
        "token_ids": {tok: i for i, tok in enumerate(task.vocab)}, "d_vocab": len(task.vocab),
        "alphabet": list(task.alphabet), "special_tokens": specials,
        "positions": f"a word of length L has L + {task.n_specials} positions; symbols at "
                     f"{task.symbol_offset}..{task.symbol_offset}+L-1",
        "readout": readout.text, "answer_position": answer,
        "outputs": _SHAPES[task.kind].format(n=task.n_outputs), "d_vocab_out": task.n_outputs,
        "classes": list(task.classes),
        "attention": ("a bidirectional model may answer at [CLS] (it sees the whole word); a causal one sees only "
                      "earlier positions, so read it at the last position (readout last)") if task.use_cls and
        readout.position == "cls" else "causal or bidirectional; the answer at each position may look ahead only "
                                       "in a bidirectional model",
        "lengths": {"min": task.min_length, "max": task.max_length},
        "padding": "words of one length need no padding; padded batches pass n_positions (padding is masked)",
        "example": {"word": example_word, "tokens": batch.tokens[0].tolist(),
                    "target": _example_target(task, example_word)},
    }


def _generator() -> Any:
    import torch

    return torch.Generator().manual_seed(0)


def _example_target(task: Any, word: str) -> Any:
    """The word's target as plain values, None where it has none (e.g. a RASP program's undefined output)."""
    import torch

    target = task.targets_of([word])
    if target.ndim < 2:
        return _plain(target[0])
    width = target.shape[1]
    defined = task.target_mask(torch.full((1,), width), width, target)[0].tolist()
    return [value if ok else None for value, ok in zip(_plain(target[0]), defined, strict=True)]


def _plain(value: Any) -> Any:
    return value.tolist() if hasattr(value, "tolist") else value


def run(request: TaskRequest) -> Result:
    return Result("task", conventions(request.name, **request.params))


def text(d: dict[str, Any]) -> str:
    lines = [f"task {d['task']['name']} ({d['kind']}{', ' + str(d['task']['params']) if d['task']['params'] else ''})",
             "  token ids:      " + ", ".join(f"{t}={i}" for t, i in d["token_ids"].items()),
             "  special tokens: " + (", ".join(f"{s['token']} at {s['position']}" for s in d["special_tokens"])
                                     or "none"),
             f"  positions:      {d['positions']}",
             f"  answer:         {d['answer_position']} (readout {d['readout']})",
             f"  outputs:        {d['outputs']}",
             f"  attention:      {d['attention']}",
             f"  padding:        {d['padding']}",
             f"  example:        {d['example']['word']!r} -> tokens {d['example']['tokens']}, target "
             f"{d['example']['target']}"]
    return "\n".join(lines)


register_verb(VerbSpec("task", "a task's conventions: token ids, special tokens, answer position, output shape",
                       TaskRequest, run, views={"task": View(lambda d: [("task", d["task"]["name"]),
                                                                        ("readout", d["readout"])], text)},
                       description=__doc__.split("\n\n")[0], order=5))
