"""Every dtype= takes the name or the torch dtype (as TransformerLens does); anything else is one clear error."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from exactlens.dtypes import dtype_name
from exactlens.errors import ExactLensError


def test_names_and_torch_dtypes_give_the_name():
    assert dtype_name("float32") == "float32" and dtype_name("float64") == "float64"
    assert dtype_name(torch.float32) == "float32" and dtype_name(torch.float64) == "float64"
    assert dtype_name(torch.double) == "float64", "torch.double is torch.float64"


@pytest.mark.parametrize("bad", [torch.float16, torch.bfloat16, torch.int64, "float16", "torch.float32", "fp32", None,
                                 32, float])
def test_other_values_are_refused_naming_what_is_allowed(bad):
    with pytest.raises(ExactLensError, match=r"dtype=.* is not allowed; choose one of float32, float64"):
        dtype_name(bad)


def test_light_module_imports_no_torch():
    code = "import sys, exactlens.dtypes as d; print(d.dtype_name('float64'), 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["float64", "False"]


def test_every_dtype_argument_takes_torch_dtypes():
    from exactlens.analysis.verify import precision, verify
    from exactlens.constructions import build, get
    from exactlens.model import ExactConfig

    assert ExactConfig(d_model=2, n_layers=1, d_vocab=3, dtype=torch.float64).dtype == "float64"
    model = get("parity").make(dtype=torch.float64)
    assert model.cfg.dtype == "float64" and model.W_E.dtype == torch.float64
    assert build("parity", dtype=torch.float32).cfg.dtype == "float32"
    result = verify("parity", [2, 3], strings=8, dtype=torch.float64)
    assert result["dtype"] == "float64"
    json.dumps(result, allow_nan=False)  # the JSON records the name
    assert precision("parity", dtype=torch.float64, max_length=4, strings=4)["dtype"] == "float64"
    with pytest.raises(ExactLensError, match="choose one of float32, float64"):
        get("parity").make(dtype=torch.float16)


def test_paper_settings_take_a_torch_dtype():
    from exactlens.papers.brody.lm import LMSettings
    from exactlens.papers.shin_matzinger.training import PairTrainConfig

    assert LMSettings(dtype=torch.float64).dtype == "float64"
    assert PairTrainConfig(dtype=torch.float64).dtype == "float64"
    with pytest.raises(ExactLensError, match="choose one of float32, float64"):
        PairTrainConfig(dtype="half")


def test_training_takes_a_torch_dtype():
    from exactlens.train import train

    run = train("first", epochs=1, strings_per_epoch=4, test_strings=4, dtype=torch.float64)
    assert run.model.cfg.dtype == "float64" and run.info["options"]["dtype"] == "float64"
    with pytest.raises(ExactLensError, match="choose one of float32, float64"):
        train("first", epochs=1, strings_per_epoch=4, test_strings=4, dtype=torch.float16)


def test_from_tracr_takes_a_torch_dtype():
    pytest.importorskip("tracr")
    from exactlens.interop.tracr import from_tracr
    from exactlens.interop.tracr.programs import compiled

    model = from_tracr(compiled("hist", 4), dtype=torch.float32)
    assert model.cfg.dtype == "float32"
