"""Outputs that are never half-written and never silently replaced.

Every file or directory exactlens writes (a checkpoint, a training run, a report, a diff page, a
JSON file) goes through ``staged``: the target is checked before any work starts, the content is
built in a hidden temporary sibling (``.NAME.partial-...``, same filesystem, so the final move is
one ``rename``), and only a complete result is moved into place. An exception, a full disk or
Ctrl-C while the content is written removes the sibling and leaves the target exactly as it was.

An existing target is refused unless ``overwrite=True`` (CLI: ``--overwrite``), except an empty
directory; with ``overwrite`` the old target is moved aside, the new one moved in, and only then is
the old one deleted (if the move in fails, the old one is put back).

A write error (``OSError``: a full disk, a file-size limit) inside a staged output comes out as one
``OSError`` naming the file at its final path (not the hidden sibling's) and saying that the target
was left as it was; ``write_error`` tells such errors apart from others (a report aborts on them
instead of showing them as a failed section).
"""

from __future__ import annotations

import contextlib
import errno
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
    if not isinstance(path, (str, os.PathLike)):
        raise ExactLensError(f"the {what} path must be a str or a pathlib.Path, got {type(path).__name__} {path!r}")
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


def write_error(err: BaseException) -> OSError | None:
    """The ``OSError`` behind ``err`` (itself, or its cause or context), or None when it is not one."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


@contextlib.contextmanager
def naming(path: str | Path) -> Iterator[None]:
    """Give an ``OSError`` raised inside without a file name (a failed ``write``) the name ``path``."""
    try:
        yield
    except OSError as err:
        if not err.filename:
            err.filename = str(path)
        raise


def failed_write(path: str | Path, err: BaseException) -> OSError:
    """An ``OSError`` for a library's write of ``path`` that failed with another exception (torch.save
    raises RuntimeError): its reason read off the file-size limit and the free space when they explain it."""
    path = Path(path)
    size = path.stat().st_size if path.is_file() else 0
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
        if limit != resource.RLIM_INFINITY and size >= limit:
            return OSError(errno.EFBIG, "File too large (the file-size limit, ulimit -f)", str(path))
    except (ImportError, OSError, ValueError):  # not POSIX
        pass
    with contextlib.suppress(OSError):
        if shutil.disk_usage(path.parent).free < 2**20:
            return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return OSError(errno.EIO, f"write failed ({type(err).__name__}: {first})", str(path))


def _located(err: OSError, staging: Path, target: Path, what: str) -> OSError:
    """``err`` with the file at its final path (inside ``target``, not the staging sibling) and the
    note that the target was left as it was (an output staged inside another one is named by the
    outer one: the output the user asked for)."""
    name = str(err.filename) if err.filename else str(target)
    if name.startswith(str(staging)):
        name = str(target) + name[len(str(staging)):]
    reason = getattr(err, "_exactlens_reason", None) or err.strerror or str(err) or type(err).__name__
    located = OSError(err.errno, f"{reason} while writing the {what} {target} (left as it was)", name)
    located._exactlens_reason = reason  # type: ignore[attr-defined]
    return located


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
    except OSError as err:
        _remove(staging)
        raise _located(err, staging, target, what) from err
    except BaseException:
        _remove(staging)
        raise


def write_text(path: str | Path, text: str, *, overwrite: bool = False, what: str = "output") -> Path:
    """Write a text file in one step (``staged`` with kind "file")."""
    with staged(path, overwrite=overwrite, kind="file", what=what) as tmp, naming(tmp):
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


def save_figure(fig, path: str | Path, *, overwrite: bool = True, **savefig_kwargs) -> Path:
    """``fig.savefig`` in one step (the format from the path's suffix). Figures are building blocks of
    reports and notebooks, which re-draw their own files: they replace an existing file by default
    (atomically); pass ``overwrite=False`` to refuse one."""
    path = Path(path)
    with staged(path, overwrite=overwrite, kind="file", what="figure") as tmp, naming(tmp):
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", **savefig_kwargs)
    return path
