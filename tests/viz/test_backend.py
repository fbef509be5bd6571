"""One plotting backend setup: every figure is drawn with matplotlib's file-only Agg backend."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def test_pyplot_is_agg_and_loaded_only_when_asked():
    code = ("import sys; import exactlens.viz.backend as b; assert 'matplotlib' not in sys.modules; "
            "plt = b.pyplot(); import matplotlib; print(matplotlib.get_backend().lower(), plt.__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(SRC), MPLBACKEND="svg"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["agg", "matplotlib.pyplot"], "Agg even where another backend was configured"
