"""The ``exactlens`` command. With --json, stdout carries exactly one JSON object; progress and
messages go to stderr. Verbs are registered with ``register_verb`` (exactlens.cli.registry): the
core's here, a plug-in's from its ``register()``; bad input gives exit status 2 and one line
naming the problem.

``exactlens --help`` and ``exactlens list`` answer without importing torch: a verb module imports
only argparse and exactlens's light modules at its top (its ``run``, and its ``add_arguments`` where
they need more, import the rest), only the verb being run gets its arguments added, and plug-ins
register names and light facts (exactlens.plugins.lazy)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys

from exactlens.cli.registry import VERBS, Verb, register_verb
from exactlens.errors import ExactLensError
from exactlens.progress import set_quiet
from exactlens.version import __version__

__all__ = ["Verb", "build_parser", "main", "register_verb"]


CORE_VERB_MODULES = (
    "exactlens.cli.listing",
    "exactlens.cli.verify",
    "exactlens.cli.precision",
    "exactlens.cli.train",
    "exactlens.cli.diff",
    "exactlens.cli.hull",
    "exactlens.cli.circuit",
    "exactlens.cli.discover",
    "exactlens.cli.report",
)
"""The core's verb modules; each registers its verb when imported. A verb module must stay light at
import (tests/test_cli.py checks that ``--help`` and ``list`` import no torch)."""


def _load_core_verbs() -> None:
    """The core's verbs register themselves when their modules are imported (here, not at import of
    exactlens.cli, so that ``exactlens --version`` answers without loading anything)."""
    for module in CORE_VERB_MODULES:
        importlib.import_module(module)


def _chosen_verb(argv: list[str] | None) -> str | None:
    """The verb named in argv (the first word that is not an option: the global options take no value)."""
    if argv is None:
        return None
    return next((word for word in argv if not word.startswith("-")), None)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every verb; given ``argv``, only the verb it names gets its arguments (a verb's
    arguments may import what the verb needs: ``exactlens --help`` imports none of them)."""
    _load_core_verbs()
    chosen = _chosen_verb(argv)
    parser = argparse.ArgumentParser(prog="exactlens", description=__doc__.split("\n\n")[0])
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks (for bug reports)")
    parser.add_argument("--version", action="version", version=f"exactlens {__version__}")
    parser.add_argument("--quiet", action="store_true", help="no progress bars (they go to stderr, only to a terminal)")
    sub = parser.add_subparsers(dest="command", required=True)
    for verb in sorted(VERBS.values(), key=lambda v: (v.order, v.name)):
        p = sub.add_parser(verb.name, help=verb.help, description=verb.description or verb.help)
        if argv is None or verb.name == chosen:
            verb.add_arguments(p)
        p.set_defaults(func=verb.run)
    return parser


EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
_OUT_OF_MEMORY = ("can't allocate memory", "out of memory", "not enough memory")


def _one_line(err: BaseException) -> str | None:
    """The one-line message for an error the CLI answers without a traceback (None: a bug)."""
    if isinstance(err, ExactLensError):
        return str(err)
    if isinstance(err, MemoryError) or (
        isinstance(err, RuntimeError) and any(text in str(err).lower() for text in _OUT_OF_MEMORY)
    ):
        return ("out of memory; lower the request (fewer --strings, shorter lengths, a smaller model) or raise "
                "EXACTLENS_MEMORY_LIMIT only if the machine has the memory")
    if isinstance(err, OSError):
        where = f": {err.filename}" if err.filename else ""
        return f"{err.strerror or type(err).__name__}{where}" if err.strerror else f"{type(err).__name__}: {err}"
    return None


def _on_late_interrupt(signum: int, frame: object) -> None:
    """reliability (issue 31): a Ctrl-C after the verb returned (while Python shuts down) would kill the
    process by the signal (status -2); it exits 130 instead, its output flushed."""
    import os

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(EXIT_INTERRUPTED)


def main(argv: list[str] | None = None) -> int:
    """Run one verb. Exit status 0 on success, 2 with one line on stderr for bad input, a filesystem error
    or memory that is not there, 130 on Ctrl-C (outputs left as they were); ``--debug`` shows tracebacks."""
    if argv is None:  # a program, not a call: a Ctrl-C while Python shuts down also exits 130
        import signal

        try:
            return _main(sys.argv[1:])
        finally:
            with contextlib.suppress(ValueError):  # not the main thread
                signal.signal(signal.SIGINT, _on_late_interrupt)
    return _main(argv)


def _main(argv: list[str]) -> int:
    if argv == ["--version"]:  # before any heavy import
        print(f"exactlens {__version__}")
        return 0
    debug = "--debug" in argv
    try:
        args = build_parser(argv).parse_args(argv)
        set_quiet(args.quiet)
        args.func(args)
    except KeyboardInterrupt:
        if debug:
            raise
        print("exactlens: interrupted; outputs left as they were", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # stdout closed early (e.g. piped into head): not an error of ours
        sys.stderr.close()
        return 0
    except (ExactLensError, MemoryError, RuntimeError, OSError) as err:
        message = _one_line(err)
        if debug or message is None:
            raise
        print(f"exactlens: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
