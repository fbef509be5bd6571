"""Float64 training is bit for bit what main's loop trained before the speed work (issue 44).

The reference (tests/train/data/main_float64_runs.json) was recorded by tests/train/fingerprints.py with
main's code; each run here must give the same SHA-256 of its weights and of its history. Where this machine's
kernels round differently from the recording machine's (the canary differs), the comparison means nothing and
the test skips saying so. Float32 training is not pinned: its attention projections are one fused product
(components.Attention._fused_products), which rounds differently from three einsums.
"""

from __future__ import annotations

import json
from pathlib import Path

import fingerprints  # tests/train/fingerprints.py: this directory is on sys.path under pytest
import pytest
import torch

REFERENCE = json.loads((Path(__file__).parent / "data" / "main_float64_runs.json").read_text())


@pytest.fixture(scope="module")
def comparable():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        if torch.__version__ != REFERENCE["torch"] or fingerprints.canary() != REFERENCE["canary"]:
            pytest.skip(f"the reference was recorded with torch {REFERENCE['torch']} on kernels that round differently "
                        f"from this machine's (torch {torch.__version__}); bit-for-bit comparison is not possible")
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("name", sorted(fingerprints.RUNS))
def test_float64_training_is_bit_identical_to_main(comparable, name):
    assert fingerprints.run_fingerprint(name) == REFERENCE["runs"][name], (
        f"{name}: float64 weights or history differ from main's recorded run ({REFERENCE['recorded']})")


def test_the_fingerprint_sees_one_changed_bit():
    """The digest is of the exact bytes: the smallest change of one weight changes it."""
    w = torch.randn(4, 4, dtype=torch.float64)
    changed = w.clone()
    changed[1, 2] = torch.nextafter(changed[1, 2], torch.tensor(float("inf"), dtype=torch.float64))
    assert fingerprints.digest([w]) != fingerprints.digest([changed])
    assert fingerprints.digest([w]) == fingerprints.digest([w.clone()])
