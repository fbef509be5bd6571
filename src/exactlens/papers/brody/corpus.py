"""A character-level English corpus that ships with Python: the docstrings of standard-library modules.

Brody et al. (2023, §4.2, App. E.2) train their d = 8 language model on Wikipedia; nothing may be
downloaded here, so the text is the documentation that every Python installation carries in its
standard library. :func:`stdlib_docstrings` collects, for each module of ``modules`` in the given
order, the module docstring and then the docstrings of the public classes and functions *defined in
that module* (``__module__`` equal to the module's name; re-exports are skipped), sorted by name.
Each docstring is taken from ``__doc__`` itself (never inherited) and normalised by
:func:`inspect.cleandoc` (indentation removed); docstrings are separated by a blank line.

The text is deterministic for a given Python version (the docstrings change between releases):
:class:`CharCorpus` records the Python version and the SHA-256 of the text so that a measurement
can name the exact corpus it used. Nothing is replaced or dropped: the vocabulary is the sorted set
of characters that occur (non-ASCII ones included).
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from exactlens.errors import ExactLensError

__all__ = ["STDLIB_MODULES", "CharCorpus", "char_corpus", "stdlib_docstrings"]

STDLIB_MODULES: tuple[str, ...] = (
    "abc",
    "argparse",
    "bisect",
    "calendar",
    "collections",
    "contextlib",
    "copy",
    "csv",
    "dataclasses",
    "datetime",
    "decimal",
    "difflib",
    "enum",
    "fractions",
    "functools",
    "heapq",
    "inspect",
    "ipaddress",
    "itertools",
    "json",
    "logging",
    "math",
    "os",
    "pathlib",
    "pickle",
    "pprint",
    "queue",
    "random",
    "re",
    "shutil",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "textwrap",
    "threading",
    "typing",
    "unittest",
    "urllib.parse",
    "uuid",
    "zipfile",
)
"""Pure documentation-rich modules present in every CPython >= 3.10 (about 270k characters on 3.11)."""

MIN_CHARACTERS = 10_000  # below this the interpreter was probably run with -OO (docstrings stripped)


def _own_doc(obj: object) -> str | None:
    doc = getattr(obj, "__doc__", None)
    if not isinstance(doc, str) or not doc.strip():
        return None
    return inspect.cleandoc(doc)


def stdlib_docstrings(modules: Sequence[str] = STDLIB_MODULES) -> list[str]:
    """The docstrings of ``modules`` (module first, then its public classes and functions by name), read
    in a fresh interpreter: a package imported here may have patched the standard library (importing Ray
    replaces ``inspect.isgenerator``, which would drop its docstring and change the corpus by 751
    characters), so the text depends only on the Python version, never on what this process imported."""
    if isinstance(modules, str) or not modules:
        raise ExactLensError(f"modules must be a non-empty sequence of module names, got {modules!r}")
    if any(not isinstance(m, str) for m in modules):
        raise ExactLensError(f"modules must be module names (strings), got {modules!r}")
    package_root = str(Path(__file__).resolve().parents[3])
    script = ("import json, sys; sys.path.insert(0, sys.argv[1]); from exactlens.papers.brody.corpus import "
              "_collect; print(json.dumps(_collect(sys.argv[2:])))")
    done = subprocess.run([sys.executable, "-c", script, package_root, *modules], capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ExactLensError(last.removeprefix("exactlens.errors.ExactLensError: "))
    return json.loads(done.stdout)


def _collect(modules: Sequence[str]) -> list[str]:
    """stdlib_docstrings in this process (run by it in a fresh interpreter)."""
    docs: list[str] = []
    for name in modules:
        try:
            module = importlib.import_module(name)
        except ImportError as err:
            raise ExactLensError(f"standard-library module {name!r} cannot be imported: {err}") from err
        own = _own_doc(module)
        if own:
            docs.append(own)
        for attr, obj in sorted(vars(module).items()):
            if attr.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
                continue
            if inspect.isclass(obj) or inspect.isfunction(obj):
                own = _own_doc(obj)
                if own:
                    docs.append(own)
    return docs


@dataclass(frozen=True)
class CharCorpus:
    """Text, its character vocabulary and the text as token ids, split into train/validation."""

    text: str
    vocab: tuple[str, ...]
    ids: torch.Tensor  # int64 [len(text)]
    n_train: int  # ids[:n_train] is the training part, ids[n_train:] the validation part
    sha256: str
    python_version: str
    modules: tuple[str, ...]

    @property
    def train_ids(self) -> torch.Tensor:
        return self.ids[: self.n_train]

    @property
    def validation_ids(self) -> torch.Tensor:
        return self.ids[self.n_train :]

    def encode(self, text: str) -> torch.Tensor:
        index = {c: i for i, c in enumerate(self.vocab)}
        unknown = sorted({c for c in text if c not in index})
        if unknown:
            raise ExactLensError(f"characters {unknown!r} are not in the corpus vocabulary ({len(self.vocab)} chars)")
        return torch.tensor([index[c] for c in text], dtype=torch.long)

    def decode(self, ids: torch.Tensor | Sequence[int]) -> str:
        return "".join(self.vocab[int(i)] for i in ids)

    def info(self) -> dict[str, object]:
        """JSON-ready description (sizes, hash, Python version)."""
        return {
            "source": "docstrings of Python standard-library modules",
            "modules": list(self.modules),
            "characters": len(self.text),
            "vocab_size": len(self.vocab),
            "train_characters": self.n_train,
            "validation_characters": len(self.text) - self.n_train,
            "sha256": self.sha256,
            "python_version": self.python_version,
        }


def char_corpus(modules: Sequence[str] = STDLIB_MODULES, validation_fraction: float = 0.1) -> CharCorpus:
    """The docstring corpus as characters; the last ``validation_fraction`` of the text is held out."""
    if not 0.0 < validation_fraction < 1.0:
        raise ExactLensError(f"validation_fraction must lie in (0, 1), got {validation_fraction!r}")
    text = "\n\n".join(stdlib_docstrings(modules))
    if len(text) < MIN_CHARACTERS:
        raise ExactLensError(
            f"the docstring corpus has only {len(text)} characters (at least {MIN_CHARACTERS} needed); "
            "is Python running with -OO, which strips docstrings?"
        )
    vocab = tuple(sorted(set(text)))
    index = {c: i for i, c in enumerate(vocab)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    n_train = int(round(len(text) * (1.0 - validation_fraction)))
    return CharCorpus(
        text=text,
        vocab=vocab,
        ids=ids,
        n_train=n_train,
        sha256=hashlib.sha256(text.encode("utf-8")).hexdigest(),
        python_version=".".join(map(str, sys.version_info[:3])),
        modules=tuple(modules),
    )
