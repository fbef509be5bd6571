"""Shared test settings, and the order in which pytest-xdist hands out the tests.

`make test` runs the suite in two workers with ``--dist loadgroup``: the tests of one
``xdist_group`` go together to one worker (the largest groups first), every other test is handed
out one at a time in collection order. Three things here make that schedule short:

* every test that uses a shared artefact (a module- or session-scoped fixture of tests/, e.g. the
  quick report, a trained run, an installed plug-in) is put in that artefact's group, so one
  worker builds it once while the other runs other tests (scattered, both workers built it, or
  one waited for the other's build);
* every test with a compiled RASP program in its parameters (``tracr-NAME`` in its id, e.g.
  ``[tracr-sort_freq]``) is put in the group ``tracr-NAME``, the group of that program's tests in
  tests/interop: compiling takes seconds and is cached per process (exactlens.interop.tracr.library),
  so each program is compiled by one worker only;
* the group names work at all: pytest-xdist 3.8 renames ``item._nodeid`` to add ``@group``, which
  pytest 9.2 no longer reads (it keeps the node id in ``item._id``), so without the repair below
  every group was silently ignored;
* the slowest single tests (measured: ``--durations`` of CI runs) are collected first, so the two
  workers share the long ones early and the run ends on many short tests, not on one long test
  while the other worker waits idle.

The order changes nothing a test checks: tests do not depend on one another (shared artefacts are
fixtures built on first use).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

# Tiny forwards dominate the suite; with pytest-xdist (-n 2) one thread per worker
# avoids oversubscribing the 2 cores (a busy machine makes 2-thread forwards ~50x slower).
torch.set_num_threads(1)

# Node-id prefixes of the slowest tests, slowest first (CI --durations, 2026-11-28); a test of a
# prefix keeps its place among the others of that prefix. A stale entry costs only schedule time.
SLOWEST_FIRST = (
    "tests/test_docs_code.py::test_every_page_code_runs",
    "tests/interop/test_tracr_catalogue.py::test_self_diff_runs_with_undefined_outputs",
    "tests/test_benchmarks.py::test_runner_prints_one_table_of_every_number_beside_its_goal",
    "tests/test_notebooks.py::test_notebook_executes",
    "tests/interop/test_tracr.py::test_model_matches_tracr_on_every_word",
    "tests/test_reliability.py::test_cli_filesystem_errors_are_one_line",
    "tests/test_compat.py::test_old_checkpoint_through_the_commands",
)
SCOPES = ("session", "package", "module")  # the shared ones, widest first
COMPILED = re.compile(r"(?<![\w-])tracr-(\w+)")  # a compiled program's construction name in a parameter id


def shared_fixture(item: pytest.Item) -> str | None:
    """The widest-scoped fixture of tests/ that ``item`` uses and that outlives one test, as
    'where.name' (where: the module's or the conftest folder's last part, e.g. 'viz.quick_report'), or None."""
    found = []
    for name, defs in getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}).items():
        if not defs or name not in item.fixturenames:
            continue
        fixturedef = defs[-1]  # the definition in effect for this item
        where = getattr(fixturedef, "baseid", "") or ""
        if fixturedef.scope in SCOPES and where.startswith("tests"):
            found.append((SCOPES.index(fixturedef.scope), f"{Path(where).stem}.{name}"))
    return min(found)[1] if found else None


def compiled_program(item: pytest.Item) -> str | None:
    """'tracr-NAME' when a parameter of ``item`` names the compiled program tracr-NAME, else None."""
    callspec = getattr(item, "callspec", None)
    found = COMPILED.search(callspec.id) if callspec is not None else None
    return f"tracr-{found[1]}" if found else None


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = shared_fixture(item) or compiled_program(item)
        if group is not None and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))


class _AfterXdist:
    """Hooks that must run after pytest-xdist's own pytest_collection_modifyitems (and pytest's
    fixture-based reordering): a conftest can hold one implementation of a hook, so this is a plugin."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            renamed = item.__dict__.get("_nodeid")  # set by pytest-xdist (--dist loadgroup) on grouped tests
            current = getattr(item, "_id", None)  # pytest >= 9.2 reads the node id from here
            if renamed is not None and current is not None and str(current) != renamed:
                item._id = type(current).parse(renamed)
        items.sort(key=lambda item: _rank(item.nodeid))  # stable: the rest keeps pytest's order


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(_AfterXdist(), "exactlens-after-xdist")
    from exactlens.allocator import tune_for_large_tensors

    tune_for_large_tensors()  # as the exactlens program does (speed only); xdist's workers start with it


def _rank(nodeid: str) -> int:
    for rank, prefix in enumerate(SLOWEST_FIRST):
        if nodeid.startswith(prefix):
            return rank
    return len(SLOWEST_FIRST)
