"""Outputs that are never half-written and never silently replaced.

Every file or directory exactlens writes (a checkpoint, a training run, a report, a diff page, a
JSON file) goes through ``staged``: the target is checked before any work starts, the content is
built in a hidden temporary sibling (``.NAME.partial-...``, same filesystem, so the final move is
one ``rename``), and only a complete result is moved into place. An exception, a full disk or
Ctrl-C while the content is written removes the sibling and leaves the target exactly as it was.

An existing target is refused unless ``overwrite=True`` (CLI: ``--overwrite``), except an empty
directory; with ``overwrite`` the old target is moved aside, the new one moved in, and only then is
the old one deleted (if the move in fails, the old one is put back).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

from exactlens.errors import ExactLensError

KINDS = ("directory", "file")
PARTIAL_TAG = ".partial-"


def _nearest_existing(path: Path) -> Path:
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")


def _occupied(target: Path) -> bool:
    """Whether writing to ``target`` would replace something (an empty directory does not count)."""
    if target.is_symlink() or target.is_file():
        return True
    if target.is_dir():
        return any(target.iterdir())
    return target.exists()


def check_output(path: str | Path, *, overwrite: bool = False, kind: str = "directory", what: str = "output") -> Path:
    """Check, before any work, that ``path`` can receive a new ``kind`` (directory or file): its
    nearest existing ancestor is a writable directory, and it does not hold something already
    (unless ``overwrite``). Returns the path (absolute). Raises ExactLensError naming the problem."""
    if kind not in KINDS:
        raise ExactLensError(f"output kind must be one of {KINDS}, got {kind!r}")
    if str(path) == "":
        raise ExactLensError(f"the {what} path is empty")
    target = Path(path).expanduser().absolute()
    if target.name in ("", ".", ".."):
        raise ExactLensError(f"{what} {str(path)!r} must name a {kind}, not {target.name or '/'!r}")
    base = _nearest_existing(target.parent)
    if not base.is_dir():
        raise ExactLensError(f"cannot write {what} {path}: {base} is a file, not a directory")
    if not os.access(base, os.W_OK | os.X_OK):
        raise ExactLensError(f"cannot write {what} {path}: {base} is not writable")
    if target.exists() or target.is_symlink():
        if kind == "file" and target.is_dir():
            raise ExactLensError(f"{what} {path} is a directory; give a file name")
        if _occupied(target) and not overwrite:
            held = "a non-empty directory" if target.is_dir() else "a file"
            raise ExactLensError(
                f"{what} {path} already exists ({held}); pass --overwrite (API: overwrite=True) to replace it "
                "(the old one is replaced only once the new one is complete), or choose another path"
            )
    return target


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _sibling(target: Path, tag: str) -> Path:
    return target.parent / f".{target.name}{tag}{os.getpid()}-{secrets.token_hex(4)}"


def _commit(staging: Path, target: Path, overwrite: bool, what: str) -> None:
    """Move the complete ``staging`` into ``target`` (see the module docstring)."""
    if not (target.exists() or target.is_symlink()):
        os.replace(staging, target)
        return
    if _occupied(target) and not overwrite:  # appeared while we worked
        raise ExactLensError(f"{what} {target} appeared while exactlens was writing it; left it alone "
                             "(pass --overwrite to replace it)")
    if target.is_dir() and not target.is_symlink() and not _occupied(target):
        target.rmdir()
        os.replace(staging, target)
        return
    old = _sibling(target, ".replaced-")
    os.replace(target, old)
    try:
        os.replace(staging, target)
    except BaseException:
        os.replace(old, target)
        raise
    _remove(old)


@contextlib.contextmanager
def staged(path: str | Path, *, overwrite: bool = False, kind: str = "directory",
           what: str = "output") -> Iterator[Path]:
    """Yield a temporary sibling of ``path`` to write into (a new empty directory, or a file path
    that does not exist yet); on normal exit move it into place, on any exception (Ctrl-C included)
    delete it and leave ``path`` as it was."""
    target = check_output(path, overwrite=overwrite, kind=kind, what=what)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = _sibling(target, PARTIAL_TAG)
    try:
        if kind == "directory":
            staging.mkdir()
        yield staging
        if kind == "file" and not staging.exists():
            raise ExactLensError(f"internal error: nothing was written for {what} {path}")
        _commit(staging, target, overwrite, what)
    except BaseException:
        _remove(staging)
        raise


def write_text(path: str | Path, text: str, *, overwrite: bool = False, what: str = "output") -> Path:
    """Write a text file in one step (``staged`` with kind "file")."""
    with staged(path, overwrite=overwrite, kind="file", what=what) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def save_figure(fig, path: str | Path, *, overwrite: bool = True, **savefig_kwargs) -> Path:
    """``fig.savefig`` in one step (the format from the path's suffix). Figures are building blocks of
    reports and notebooks, which re-draw their own files: they replace an existing file by default
    (atomically); pass ``overwrite=False`` to refuse one."""
    path = Path(path)
    with staged(path, overwrite=overwrite, kind="file", what="figure") as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", **savefig_kwargs)
    return path
