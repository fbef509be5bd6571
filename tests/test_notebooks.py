"""Every notebook under notebooks/ runs top to bottom with small settings, and is stored clean.

The notebooks read EXACTLENS_NOTEBOOK_QUICK=1 to pick tiny lengths and string counts.
The kernel is this test's own interpreter: a temporary "python3" kernelspec whose argv is
sys.executable is put first on JUPYTER_PATH, so a user-level or system kernelspec named
python3 (which may point at another Python) cannot be picked up, and nothing has to be
installed into the environment. PYTHONPATH gets src/, so the kernel imports this checkout's
exactlens even without an editable install. OMP_NUM_THREADS=1 keeps the kernel's torch from
oversubscribing the CPUs that the pytest-xdist workers use.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("**/*.ipynb"))
NOTEBOOKS = [p for p in NOTEBOOKS if ".ipynb_checkpoints" not in p.parts]


def _ids(paths: list[Path]) -> list[str]:
    return [str(p.relative_to(ROOT / "notebooks")) for p in paths]


@pytest.fixture
def kernel_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A python3 kernelspec running sys.executable, and the environment the notebooks expect."""
    spec_dir = tmp_path / "jupyter" / "kernels" / "python3"
    spec_dir.mkdir(parents=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (exactlens test)",
        "language": "python",
    }
    (spec_dir / "kernel.json").write_text(json.dumps(spec))
    jupyter_path = [str(tmp_path / "jupyter")] + [p for p in [os.environ.get("JUPYTER_PATH")] if p]
    monkeypatch.setenv("JUPYTER_PATH", os.pathsep.join(jupyter_path))
    python_path = [str(ROOT / "src")] + [p for p in [os.environ.get("PYTHONPATH")] if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(python_path))
    monkeypatch.setenv("EXACTLENS_NOTEBOOK_QUICK", "1")
    # One intra-op thread: the quick-mode models are tiny, and a kernel spinning torch threads
    # next to pytest-xdist workers on a small machine runs 10-30x slower (oversubscription).
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYDEVD_DISABLE_FILE_VALIDATION", "1")  # silence the debugger warning of ipykernel


def test_there_are_notebooks() -> None:
    assert NOTEBOOKS, f"no notebooks under {ROOT / 'notebooks'}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_is_stored_without_outputs(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [
        index
        for index, cell in enumerate(nb.cells)
        if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count") is not None)
    ]
    assert not dirty, f"{path.name}: code cells {dirty} have stored outputs or execution counts; clear them"


@pytest.mark.notebook
def test_kernel_runs_this_python(kernel_env: None) -> None:
    """The kernel is this environment's interpreter (the venv's), and imports exactlens from this src/."""
    nb = nbformat.v4.new_notebook()
    source = "import sys, exactlens\nprint(sys.prefix)\nprint(exactlens.__file__)"
    nb.cells.append(nbformat.v4.new_code_cell(source))
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    stdout = "".join(o["text"] for o in nb.cells[0].outputs if o.get("name") == "stdout")
    prefix, module = stdout.splitlines()
    assert Path(prefix) == Path(sys.prefix), f"the kernel runs {prefix}, the tests run {sys.prefix}"
    assert Path(module).resolve().is_relative_to(ROOT / "src"), f"the kernel imports exactlens from {module}"


@pytest.mark.notebook
@pytest.mark.parametrize("path", NOTEBOOKS, ids=_ids(NOTEBOOKS))
def test_notebook_executes(path: Path, kernel_env: None) -> None:
    nb = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
    )
    start = time.perf_counter()
    client.execute()  # raises CellExecutionError with the failing cell and traceback
    elapsed = time.perf_counter() - start
    errors = [o for cell in nb.cells for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors, f"{path.name}: error outputs {errors}"
    print(f"{path.name}: executed in {elapsed:.1f} s (quick mode)")
