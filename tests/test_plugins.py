"""Plug-ins: the example package in examples/plugin installs with pip and adds a working construction
to the command line; a plug-in that fails to load is an ExactLensError that names it.

The example is installed (offline, no build isolation) into a temporary directory that the
subprocesses get on PYTHONPATH: exactlens finds it through its entry point, as it would find any
installed package's. Both command-line runs start together, since each pays the interpreter, torch
and TransformerLens start-up.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import EntryPoint
from pathlib import Path

import pytest
import torch

from exactlens import plugins, tasks
from exactlens.constructions import REGISTRY
from exactlens.errors import ExactLensError

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "plugin"
NAME = "example-first-hard"
LENGTHS = "1,2,3,8"
RUNS = {
    "list": ["list", "--json"],
    "verify": ["verify", NAME, "--lengths", LENGTHS, "--json"],
}


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict[str, tuple[int, str, str]]:
    tmp = tmp_path_factory.mktemp("plugin")
    source = tmp / "source"  # a copy: building writes build/ and *.egg-info next to the sources
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    site = tmp / "site"
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index",
           "--disable-pip-version-check", "--quiet", "--no-compile", "--target", str(site), str(source)]
    done = subprocess.run(pip, cwd=tmp, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(ROOT / "src")]), OMP_NUM_THREADS="1")
    procs = {
        key: subprocess.Popen([sys.executable, "-m", "exactlens.cli", *argv], cwd=tmp, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for key, argv in RUNS.items()
    }
    out = {}
    for key, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        out[key] = (proc.returncode, stdout, stderr)
    return out


def test_example_plugin_is_listed(installed):
    code, stdout, stderr = installed["list"]
    assert code == 0, stderr
    rows = {row["name"]: row for row in json.loads(stdout)["constructions"]}
    assert NAME in rows, sorted(rows)
    row = rows[NAME]
    assert row["task"] == {"name": "first", "kind": "membership"}
    assert row["paper"] == "exactlens example plug-in"
    assert row["parameters"] == {}
    assert {"parity", "first", "one"} <= set(rows)  # exactlens's own plug-ins load alongside it


def test_example_plugin_verifies_exactly(installed):
    code, stdout, stderr = installed["verify"]
    assert code == 0, stderr
    result = json.loads(stdout)
    assert result["name"] == NAME
    assert result["task"]["name"] == "first"
    assert [r["length"] for r in result["results"]] == [int(n) for n in LENGTHS.split(",")]
    for r in result["results"]:
        assert r["accuracy"] == 1.0, r
        assert r["min_abs_logit"] == pytest.approx(0.5), r  # s = +-1/2 at every length


def test_example_construction_is_exact_on_every_word(monkeypatch):
    """The example's builder, imported from the sources (not registered): every word up to length 8."""
    monkeypatch.syspath_prepend(str(EXAMPLE / "src"))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no __pycache__ in examples/
    try:
        from exactlens_example_plugin import first_hard
    finally:
        sys.modules.pop("exactlens_example_plugin", None)

    model = first_hard(dtype="float64")
    task = tasks.get("first")
    assert model.cfg.vocab == task.vocab
    for length in range(9):
        ids = task.all_words(length)
        batch = task.encode(ids)
        logits = model.readout(batch.tokens, batch.n_positions)
        want = task.membership(ids)
        assert torch.equal(logits > 0, want), length
        assert torch.equal(logits.abs(), torch.full_like(logits, 0.5)), length


# ---- plug-ins that fail to load ---------------------------------------------------------------


@pytest.fixture
def fake_plugins(monkeypatch, tmp_path):
    """Replace the installed plug-ins by modules written here; the real state is restored afterwards."""
    plugins.load_plugins()  # the real plug-ins first, so that the state restored afterwards is "loaded"
    (tmp_path / "fake_broken_plugin.py").write_text(
        "def register():\n    raise RuntimeError('boom: this plug-in is broken')\n"
    )
    (tmp_path / "fake_good_plugin.py").write_text(
        "from exactlens.constructions import Construction, register as add\n"
        "from exactlens_test_builders import build\n"
        "def register():\n"
        "    add(Construction('fake-good', 'first', build, 'test', 'registered by a fake plug-in',\n"
        "                     task_params=lambda params: {}))  # a new object at every call, as papers write it\n"
    )
    (tmp_path / "exactlens_test_builders.py").write_text("def build(dtype='float32'):\n    raise NotImplementedError\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(plugins._state, "loaded", False)
    monkeypatch.setitem(plugins._state, "failure", None)
    monkeypatch.setattr(plugins, "_loaded", [])

    def use(*entries: tuple[str, str]) -> None:
        points = [EntryPoint(name, value, plugins.GROUP) for name, value in entries]
        monkeypatch.setattr(plugins, "entry_points", lambda group: points if group == plugins.GROUP else [])

    yield use
    dict.pop(REGISTRY, "fake-good", None)
    for module in ("fake_broken_plugin", "fake_good_plugin", "exactlens_test_builders"):
        sys.modules.pop(module, None)


def test_a_plugin_whose_register_raises_is_named(fake_plugins):
    fake_plugins(("broken", "fake_broken_plugin:register"))
    with pytest.raises(ExactLensError, match=r"plug-in 'broken' \(fake_broken_plugin:register\) failed to load") as err:
        plugins.load_plugins()
    assert "RuntimeError: boom: this plug-in is broken" in str(err.value)
    assert isinstance(err.value.__cause__, RuntimeError)
    assert plugins.loaded_plugins() == []
    # every registry read goes through the plug-ins, and says the same
    from exactlens import constructions

    with pytest.raises(ExactLensError, match="plug-in 'broken'"):
        constructions.names()


def test_a_plugin_that_cannot_be_imported_is_named(fake_plugins):
    fake_plugins(("missing", "no_such_module_for_exactlens:register"))
    with pytest.raises(ExactLensError, match=r"plug-in 'missing' .*ModuleNotFoundError"):
        plugins.load_plugins()


def test_plugins_load_in_name_order_and_once(fake_plugins):
    fake_plugins(("zzz-good", "fake_good_plugin:register"))
    assert plugins.load_plugins() == ["zzz-good"]
    assert plugins.load_plugins() == ["zzz-good"]  # once: a second read registers nothing again
    assert REGISTRY["fake-good"].summary == "registered by a fake plug-in"


def test_a_failed_load_is_reported_the_same_way_twice(fake_plugins):
    fake_plugins(("a-good", "fake_good_plugin:register"), ("b-broken", "fake_broken_plugin:register"))
    for _ in range(2):
        with pytest.raises(ExactLensError, match="plug-in 'b-broken'"):
            plugins.load_plugins()



# ---- registering without importing (exactlens.plugins.lazy) ------------------------------------


def test_the_declared_facts_are_the_objects_facts():
    """Everything the papers registered lazily (or with declared facts) is imported and compared."""
    checked = plugins.check_declared_facts()
    assert {"first", "parity", "one", "majority", "majority-per-position", "pairs"} <= set(checked["training presets"])
    assert {"parity", "dyck", "stdlib-chars", "majority-margin", "pairs"} <= set(checked["tasks"])
    assert {"abs-below-2^-n", "dyck-zero-check"} <= set(checked["decision rules"])


def test_the_listing_is_what_the_objects_say():
    """`exactlens list --json` (from declared facts) against the same fields computed from the imported
    builders, tasks and presets."""
    import inspect

    from exactlens.train import get_preset
    from exactlens.verbs.listing import catalog

    rows = catalog()
    for row in rows["constructions"]:
        construction = REGISTRY[row["name"]]
        task = construction.task_of()
        signature = inspect.signature(construction.builder).parameters
        assert row["parameters"] == {k: p.default for k, p in signature.items() if k != "dtype"}, row["name"]
        assert row["task"] == {"name": task.name, "kind": task.kind}, row["name"]
        assert row["min_length"] == max(construction.min_length, task.min_length), row["name"]
    assert rows["tasks"] == [{"name": n, "kind": tasks.get(n).kind} for n in tasks.names()]
    for row in rows["presets"]:
        preset = get_preset(row["name"])
        assert row == {"name": preset.name, "task": preset.task, "paper": preset.paper, "summary": preset.summary}


@pytest.fixture
def lazy_plugin(monkeypatch, tmp_path, fake_plugins):
    """A plug-in that registers a construction, a task, a preset and a section lazily."""
    (tmp_path / "fake_lazy_heavy.py").write_text(
        "from exactlens.tasks import First\n"
        "from exactlens.train.presets import Preset\n"
        "from exactlens.papers.chiang_cholak.presets import FIRST\n"
        "import dataclasses\n"
        "PRESET = dataclasses.replace(FIRST, name='fake-lazy-preset', summary='a lazily registered preset')\n"
        "class LazyFirst(First):\n"
        "    name = 'fake-lazy-task'\n"
        "def build(c: float = 1.0, dtype: str = 'float32'):\n"
        "    from exactlens.constructions import build as make\n"
        "    return make('first', dtype=dtype, c=c)\n"
    )
    (tmp_path / "fake_lazy_plugin.py").write_text(
        "from exactlens import tasks\n"
        "from exactlens.constructions import Construction, register\n"
        "from exactlens.plugins import lazy\n"
        "from exactlens.train import register_preset\n"
        "def register_all():\n"
        "    tasks.register(lazy('fake_lazy_heavy:LazyFirst', kind='membership', min_length=0),\n"
        "                   name='fake-lazy-task')\n"
        "    register(Construction('fake-lazy', 'first', 'fake_lazy_heavy:build', 'test', 'lazy',\n"
        "                          parameters={'c': 1.0}))\n"
        "    register(Construction('fake-lazy-wrong', 'first', 'fake_lazy_heavy:build', 'test', 'declared wrong',\n"
        "                          parameters={'c': 2.0}))\n"
        "    register_preset(lazy('fake_lazy_heavy:PRESET', task='first', paper='Chiang & Cholak 2022, §5.1/§5.3, "
        "Fig. 4', summary='a lazily registered preset'), name='fake-lazy-preset')\n"
    )
    fake_plugins(("lazy", "fake_lazy_plugin:register_all"))
    yield
    from exactlens.train import PRESETS

    dict.pop(PRESETS, "fake-lazy-preset", None)
    dict.pop(tasks.TASKS, "fake-lazy-task", None)
    for name in ("fake-lazy", "fake-lazy-wrong"):
        dict.pop(REGISTRY, name, None)
    for module in ("fake_lazy_heavy", "fake_lazy_plugin"):
        sys.modules.pop(module, None)


def test_lazy_entries_are_listed_without_importing_and_imported_when_read(lazy_plugin):
    from exactlens.train import PRESETS, get_preset
    from exactlens.verbs.listing import catalog

    rows = catalog()
    assert "fake_lazy_heavy" not in sys.modules  # listed from the declared facts alone
    listed = {r["name"]: r for r in rows["constructions"]}
    assert listed["fake-lazy"]["parameters"] == {"c": 1.0}
    assert {"name": "fake-lazy-task", "kind": "membership"} in rows["tasks"]
    assert PRESETS.info("fake-lazy-preset")["summary"] == "a lazily registered preset"
    assert get_preset("fake-lazy-preset").summary == "a lazily registered preset"  # read: imported now
    assert "fake_lazy_heavy" in sys.modules
    assert tasks.get("fake-lazy-task").name == "fake-lazy-task"
    assert REGISTRY["fake-lazy"].make(dtype="float64").cfg.model_name == "fake-lazy"
    with pytest.raises(ExactLensError, match=r"fake-lazy-wrong.*declares the parameters \{'c': 2.0\}.*'c': 1.0"):
        REGISTRY["fake-lazy-wrong"].make()


def test_lazy_registration_mistakes_are_named():
    from exactlens.plugins import import_target, lazy
    from exactlens.train import register_preset

    with pytest.raises(ExactLensError, match="kind and min_length"):
        tasks.register(lazy("exactlens.tasks.binary:First", kind="membership"), name="half-declared")
    with pytest.raises(ExactLensError, match="needs name="):
        register_preset(lazy("exactlens.papers.nowak.presets:ONE", task="one", paper="p", summary="s"))
    with pytest.raises(ExactLensError, match="package.module:attribute"):
        import_target("no_colon_here")
    with pytest.raises(ExactLensError, match="has no attribute 'NOPE'"):
        import_target("exactlens.errors:NOPE")


def test_a_wrong_declared_fact_is_found(monkeypatch):
    import dataclasses
    import types

    from exactlens.papers.nowak.presets import ONE
    from exactlens.plugins import lazy
    from exactlens.train import PRESETS

    module = types.ModuleType("fake_wrong_facts")
    module.PRESET = dataclasses.replace(ONE, name="fake-wrong-facts")
    monkeypatch.setitem(sys.modules, "fake_wrong_facts", module)
    monkeypatch.setitem(PRESETS, "fake-wrong-facts",
                        lazy("fake_wrong_facts:PRESET", task="one", paper="Nowak", summary="not it"))
    with pytest.raises(ExactLensError, match=r"'fake-wrong-facts' was registered with facts .*registered 'Nowak'"):
        PRESETS.check_facts()
