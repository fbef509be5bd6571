"""The ``exactlens`` command, generated from the verbs' declarations (exactlens.verbs): each verb's flags
come from its request (exactlens.requests), its output from its result's view. With --json, stdout
carries exactly one JSON object; progress and messages go to stderr; bad input gives exit status 2 and
one line naming the problem. The global options (--quiet, --debug) may stand before or after the verb.

``exactlens --help`` and ``exactlens list`` answer without importing torch: verb modules are light at
import (their ``run`` imports the rest), only the verb being run gets its arguments added, and plug-ins
register names and light facts (exactlens.plugins.lazy)."""

from __future__ import annotations

import argparse
import contextlib
import sys

from exactlens.errors import ExactLensError, one_line
from exactlens.progress import set_quiet
from exactlens.verb_registry import VERBS, VerbSpec, load_core_verbs, messages_on
from exactlens.version import __version__

__all__ = ["build_parser", "main"]

GLOBAL_FLAGS = ("--quiet", "--debug")
"""Options of ``exactlens`` itself that take no value: accepted before or after the verb."""


def _chosen_verb(argv: list[str] | None) -> str | None:
    """The verb named in argv (the first word that is not an option: the global options take no value)."""
    if argv is None:
        return None
    return next((word for word in argv if not word.startswith("-")), None)


def _add_verb(sub: argparse._SubParsersAction, verb: VerbSpec, with_arguments: bool) -> None:
    p = sub.add_parser(verb.name, help=verb.help, description=verb.description or verb.help)
    if with_arguments:
        from exactlens.requests import add_arguments

        add_arguments(p, verb.request)
        if verb.json:
            p.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    for flag in GLOBAL_FLAGS:  # also after the verb; stripped from argv before parsing
        p.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    p.set_defaults(func=lambda args, spec=verb: _run_spec(spec, args))


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    """The parser of every verb; given ``argv``, only the verb it names gets its arguments (a verb's
    arguments may need registries that load plug-ins: ``exactlens --help`` adds none of them)."""
    load_core_verbs()
    chosen = _chosen_verb(argv)
    parser = argparse.ArgumentParser(prog="exactlens", description=__doc__.split("\n\n")[0])
    parser.add_argument("--debug", action="store_true", help="show Python tracebacks (for bug reports; also after "
                        "the verb)")
    parser.add_argument("--version", action="version", version=f"exactlens {__version__}")
    parser.add_argument("--quiet", action="store_true", help="no progress bars (they go to stderr, only to a "
                        "terminal; also after the verb)")
    sub = parser.add_subparsers(dest="command", required=True)
    for verb in sorted((v for v in VERBS.values() if v.cli), key=lambda v: (v.order, v.name)):
        _add_verb(sub, verb, argv is None or verb.name == chosen)
    return parser


def _run_spec(spec: VerbSpec, args: argparse.Namespace) -> None:
    """One verb from its declaration: the request from the flags, the work, the result printed (JSON or
    text), then the verb's ``after`` (a page to write); a result's ``failure`` exits 2 after printing."""
    from exactlens.cli.common import emit
    from exactlens.requests import from_namespace

    request = from_namespace(spec.request, args)
    result = spec.run(request)
    emit(result.to_dict(), getattr(args, "json", False), result.text())
    sys.stdout.flush()
    if spec.after is not None:
        spec.after(request, result, True)
    if getattr(result, "failure", None):
        raise ExactLensError(result.failure)


EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130
_OUT_OF_MEMORY = ("can't allocate memory", "out of memory", "not enough memory")


def _one_line(err: BaseException) -> str | None:
    """The one-line message for an error the CLI answers without a traceback (None: a bug)."""
    if isinstance(err, ExactLensError):  # one line, whatever the message holds (a subclass's str included)
        return one_line(str(err))
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
    """A Ctrl-C after the verb returned (while Python shuts down) would kill the
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

        from exactlens.allocator import tune_for_large_tensors
        from exactlens.interrupts import on_terminate_unwind

        try:
            tune_for_large_tensors()  # large tensors reuse freed pages (exactlens.allocator), workers' too
        except ExactLensError as err:  # a bad value of its switch
            print(f"exactlens: error: {one_line(str(err))}", file=sys.stderr)
            return EXIT_BAD_INPUT
        on_terminate_unwind()  # a kill (SIGTERM) cleans up as Ctrl-C does (exit 143)
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
    quiet = "--quiet" in argv
    argv = [word for word in argv if word not in GLOBAL_FLAGS]
    from exactlens.interrupts import EXIT_TERMINATED, Terminated

    try:
        args = build_parser(argv).parse_args(argv)
        set_quiet(quiet)
        messages_on(True)
        args.func(args)
    except KeyboardInterrupt as err:
        if debug:
            raise
        killed = isinstance(err, Terminated)
        print(f"exactlens: {'terminated' if killed else 'interrupted'}; outputs left as they were", file=sys.stderr)
        return EXIT_TERMINATED if killed else EXIT_INTERRUPTED
    except BrokenPipeError:  # stdout closed early (e.g. piped into head): not an error of ours
        sys.stderr.close()
        return 0
    except (ExactLensError, MemoryError, RuntimeError, OSError) as err:
        message = _one_line(err)
        if debug or message is None:
            raise
        print(f"exactlens: error: {message}", file=sys.stderr)
        return EXIT_BAD_INPUT
    finally:
        messages_on(False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
