"""exactlens.allocator: the exactlens program's glibc settings (large tensors from the heap, freed pages kept), for
the program and its workers, never over the user's own settings. Each case runs in a fresh interpreter whose
environment has none of the variables (the suite's own processes have them: tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from exactlens.allocator import ENVIRONMENT, TRIM_BYTES

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's settings: Linux only")

NAMES = (*ENVIRONMENT, "MALLOC_MMAP_THRESHOLD_", "EXACTLENS_SYSTEM_MALLOC")


def _glibc() -> bool:
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").mallopt  # noqa: B018
    except (OSError, AttributeError):
        return False
    return True


def _run(code: str, **env: str) -> dict:
    """``code`` (which prints one JSON object) in a fresh interpreter with only ``env`` of NAMES set."""
    clean = {k: v for k, v in os.environ.items() if k not in NAMES}
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


TUNE = f"""
import json, os, subprocess, sys
from exactlens.allocator import tune_for_large_tensors
names = {list(NAMES)!r}
applied = tune_for_large_tensors()
show = "import json, os; print(json.dumps({{k: os.environ.get(k) for k in %r}}))" % (names,)
child = subprocess.run([sys.executable, "-c", show], capture_output=True, text=True, check=True).stdout
print(json.dumps({{"applied": applied, "env": {{k: os.environ.get(k) for k in names}}, "child": json.loads(child)}}))
"""


@pytest.mark.skipif(not _glibc(), reason="not glibc")
def test_the_settings_apply_here_and_reach_child_processes():
    out = _run(TUNE)
    assert out["applied"] is True
    assert out["env"]["MALLOC_MMAP_MAX_"] == "0" and out["env"]["MALLOC_TRIM_THRESHOLD_"] == str(TRIM_BYTES)
    assert out["child"] == out["env"]  # a worker started later (spawn, forkserver) reads them at its start


@pytest.mark.parametrize("env", [{"MALLOC_MMAP_MAX_": "7"}, {"MALLOC_TRIM_THRESHOLD_": "123"},
                                 {"MALLOC_MMAP_THRESHOLD_": "65536"}, {"EXACTLENS_SYSTEM_MALLOC": "1"}],
                         ids=lambda e: next(iter(e)))
def test_the_users_own_settings_win_and_the_switch_turns_it_off(env):
    out = _run(TUNE, **env)
    assert out["applied"] is False
    expected = {k: env.get(k) for k in NAMES}
    assert out["env"] == expected and out["child"] == expected  # nothing added, nothing changed


@pytest.mark.skipif(not _glibc(), reason="not glibc")
def test_the_program_tunes_itself_and_a_call_of_main_does_not():
    code = ("import json, os, sys; from exactlens.cli import main; sys.argv = ['exactlens', '--version']; "
            "{call}; print(json.dumps({{'mmap_max': os.environ.get('MALLOC_MMAP_MAX_')}}))")
    assert _run(code.format(call="main()"))["mmap_max"] == "0"  # the program (argv from sys.argv)
    assert _run(code.format(call="main(['--version'])"))["mmap_max"] is None  # a call from Python: untouched


def test_a_library_import_leaves_the_allocator_alone():
    code = ("import json, os; import exactlens; exactlens.build('first'); "
            f"print(json.dumps({{'env': {{k: os.environ.get(k) for k in {list(NAMES)!r}}}}}))")
    assert _run(code)["env"] == dict.fromkeys(NAMES)


WORKER = f"""
import json, os
from exactlens.processes import environment_initializer, pool_context

def noop():
    pass

def env_of_worker(_):
    return {{k: os.environ.get(k) for k in {list(NAMES)!r}}}

if __name__ == "__main__":
    initializer, initargs = environment_initializer(noop)
    with pool_context().Pool(1, initializer=initializer, initargs=initargs) as pool:
        worker = pool.map(env_of_worker, [0])[0]
    print(json.dumps({{"here": os.environ.get("MALLOC_MMAP_MAX_"), "worker": worker}}))
"""


@pytest.mark.skipif(not _glibc(), reason="not glibc")
def test_exactlens_worker_processes_tune_themselves_and_leave_the_caller_alone(tmp_path):
    script = tmp_path / "pool.py"
    script.write_text(WORKER)
    out = _run(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')")
    assert out["here"] is None  # the caller (a library user's process) is untouched
    assert out["worker"]["MALLOC_MMAP_MAX_"] == "0"
    off = _run(f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')", EXACTLENS_SYSTEM_MALLOC="1")
    assert off["worker"]["MALLOC_MMAP_MAX_"] is None


@pytest.mark.parametrize("value", ["true", "yes", "2"])
def test_a_bad_switch_value_is_one_line_and_changes_nothing(value):
    clean = {k: v for k, v in os.environ.items() if k not in NAMES}
    out = subprocess.run([sys.executable, "-m", "exactlens", "list"], env={**clean, "EXACTLENS_SYSTEM_MALLOC": value},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines() == [
        f"exactlens: error: EXACTLENS_SYSTEM_MALLOC is 1 (glibc's allocator as it is) or 0 (exactlens's settings "
        f"for large tensors); got {value!r}"]
    from exactlens.errors import ExactLensError
    from exactlens.processes import environment_initializer

    os.environ["EXACTLENS_SYSTEM_MALLOC"] = value
    try:  # a pool of the API refuses it in the caller, before any worker starts
        with pytest.raises(ExactLensError, match="EXACTLENS_SYSTEM_MALLOC is 1"):
            environment_initializer(lambda: None)
    finally:
        del os.environ["EXACTLENS_SYSTEM_MALLOC"]
