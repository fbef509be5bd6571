"""Compatibility with the interface before the task / plug-in refactor (commit 0cb9ec5).

The project's rule: public names, every CLI verb and option and every JSON field of before keep
working ("add, never rename without an alias"). Everything old pinned here was read off the
0cb9ec5 tree (its modules' public names, its argparse parsers, the JSON its commands printed, the
checkpoints its ``ExactTransformer.save`` wrote), so this file needs no git at test time.

Modules and Python names the refactor moved on purpose (``MOVED``; the README's "Moved in the
task / plug-in refactor" lists them) are not pinned; everything else is.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from exactlens.cli import build_parser, main

XFAIL = pytest.mark.xfail


def xfail(reason: str):
    return XFAIL(strict=True, reason=reason)


def run_cli(capsys, argv: list[str]) -> dict:
    """exactlens.cli.main in-process; exit status 0 and exactly one JSON object on stdout."""
    capsys.readouterr()
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


# ---- 1. Python names ----------------------------------------------------------------------

# Every module of the 0cb9ec5 tree and its public names (``__all__`` where the module had one,
# else the names it defined). ``exactlens`` itself: the package's __all__.
OLD_MODULES: dict[str, list[str]] = {
    "exactlens": ["ExactConfig", "ExactLensError", "ExactTransformer", "__version__"],
    "exactlens.analysis": [],
    "exactlens.analysis.brody_figures": ["DEFAULT_DS", "DEFAULT_NS", "fig1_data", "plot_fig1", "plot_tables"],
    "exactlens.analysis.brody_lm": [
        "LMRun", "LMSettings", "LN_VARIANTS", "PAPER_TABLE1", "PAPER_TABLE2", "as_float64", "brody_tables",
        "lm_config", "lm_unselectable", "quick_settings", "summarize_layers", "train_char_lm", "validation_windows"
    ],
    "exactlens.analysis.brody_majority": [
        "BENCH_OPTIONS", "majority_data", "plot_majority", "report_options", "steps_to"
    ],
    "exactlens.analysis.chiang_figures": [
        "DEFAULT_ETA", "FIG2_CURVES", "FIG2_STYLE", "FIG3_INDEX", "FIG3_PARAMETER", "Fig2Curve", "LANGUAGES", "NAMES",
        "Prop2Tail", "class_keys", "curve_model", "default_fig3_values", "fig2_data", "fig2_rows", "fig3_data",
        "logits_and_cls", "plot_fig2", "plot_fig3", "prop2_model", "representatives", "weighted_scores"
    ],
    "exactlens.analysis.diff": [
        "BEST_TOLERANCE", "DEFAULT_LENGTHS", "LengthRun", "Rows", "SETTLE_TOLERANCE", "Side", "behaviour_table",
        "diff", "pooled", "probe_table", "resolve_trained"
    ],
    "exactlens.analysis.diff_attention": [
        "TIE_BREAK", "attention_diff", "distance_matrix", "heads_of", "match_heads", "readout_to_first"
    ],
    "exactlens.analysis.diff_causal": ["intervention_table"],
    "exactlens.analysis.diff_probe": [
        "ALPHAS", "CONSTANT_TOLERANCE", "LinearMap", "ProbeResult", "feature_direction", "fit_ridge", "is_constant",
        "probe", "r2_score", "row_space_projector", "split_sequences"
    ],
    "exactlens.analysis.diff_weights": ["TOP_SINGULAR_VALUES", "ZERO_NORM", "head_weights", "weights_table"],
    "exactlens.analysis.hull": [
        "KeyCertificate", "METHODS", "SelectabilityResult", "layer_norm_geometric", "layer_norm_projection",
        "selectable_keys"
    ],
    "exactlens.analysis.hull_model": ["hull_report", "query_space", "unselectable_by_layer"],
    "exactlens.analysis.nowak_figures": [
        "FIG2_CONSTRUCTIONS", "FIG2_DTYPES", "PAPER_LAST_EXACT", "STYLE", "fig2_data", "plot_fig2",
        "signal_and_rounding"
    ],
    "exactlens.analysis.pairlogic": [
        "VERDICTS", "VERDICT_RULE", "ablations", "analyse", "category_qk", "check_construction", "consensus",
        "signatures", "summarize_runs", "verdict"
    ],
    "exactlens.analysis.verify": [
        "ATTENTION_MEMORY_BUDGET", "GAP_SCAN_LIMIT", "check_model_length", "cross_entropy_bits", "decisions",
        "evaluate_words", "language_of", "log_grid", "margins", "parse_lengths", "precision", "readout_logits",
        "verify", "words_for_length"
    ],
    "exactlens.cli": [
        "SUBCOMMAND_MODULES", "build_parser", "cmd_list", "cmd_precision", "cmd_report", "cmd_verify", "main"
    ],
    "exactlens.cli_diff": ["add_diff_parser", "cmd_diff", "format_diff_text"],
    "exactlens.cli_hull": ["add_hull_parser", "cmd_hull", "format_hull_text"],
    "exactlens.cli_pairlogic": ["add_pairlogic_parser", "cmd_pairlogic"],
    "exactlens.cli_train": ["add_train_parser", "cmd_train", "parse_length", "parse_seeds"],
    "exactlens.constructions": ["Construction", "REGISTRY", "build", "get", "names", "register"],
    "exactlens.constructions.builder": ["LabelledModel"],
    "exactlens.constructions.catalog": [],
    "exactlens.constructions.catalog_chiang_cholak": ["CC"],
    "exactlens.constructions.catalog_cookbook": ["TC"],
    "exactlens.constructions.catalog_nowak": ["NOWAK"],
    "exactlens.constructions.catalog_shin_matzinger": ["RegressionConstruction", "SM"],
    "exactlens.constructions.chiang_cholak": [
        "FIRST_LABELS", "FLAWED_FIRST_LABELS", "PARITY_LABELS", "first", "first_closed_form", "first_flawed",
        "first_flawed_closed_form", "first_ln", "first_ln_eta", "first_log", "first_log_closed_form", "first_log_ln",
        "parity", "parity_closed_form", "parity_ln", "parity_ln_eta", "with_layer_norm"
    ],
    "exactlens.constructions.cookbook": [
        "FFN", "Head", "Layer", "Program", "Readout", "Selector", "attention", "compile", "ffn", "layer_norm",
        "layer_norm_hash", "parallel", "read", "rename", "residual_tensor", "run_on_residual", "serial"
    ],
    "exactlens.constructions.cookbook.attention": [
        "almost_orthogonal_dimension", "almost_orthogonal_vectors", "break_ties", "first_position", "identity",
        "lemma_5_3_bound", "lookup_one_hot", "lookup_quadratic", "match", "predecessor", "round_to_bit",
        "softmax_scale_for_hard", "split_heads", "successor", "uniform_average"
    ],
    "exactlens.constructions.cookbook.ffn": [
        "INV_SQRT_2PI", "boolean", "cancel_residual", "clip", "conditional", "cpwl", "equal_zero", "equal_zero_by",
        "greater_equal", "greater_equal_by", "greater_than", "greater_than_by", "identity", "join", "linear",
        "maximum", "minimum", "multiply", "multiply_error_bounds", "without_residual", "zero"
    ],
    "exactlens.constructions.cookbook.layer_norm": ["amplify", "negated_label", "pair_for_layer_norm"],
    "exactlens.constructions.cookbook.layer_norm_hash": [
        "F64", "gap", "hash_labels", "hash_layer", "lookup", "lookup_scale", "phi", "predecessor_program", "score"
    ],
    "exactlens.constructions.cookbook.program": [
        "ACTIVATIONS", "F64", "FFN", "Head", "LENGTH_SCALES", "Layer", "MASKS", "Program", "Readout", "Selector",
        "WEIGHTINGS", "compile", "parallel", "read", "rename", "residual_tensor", "run_on_residual", "serial"
    ],
    "exactlens.constructions.cookbook_examples": [
        "CLS", "NONUNIFORM", "UNIFORM", "argmax_class", "dyck1", "dyck1_depth2", "dyck_decide", "dyck_kd",
        "dyck_margin", "induction_frequent", "induction_recent", "majority"
    ],
    "exactlens.constructions.layer_norm": ["append_confidence_layer", "confidence_scale", "double_for_post_ln"],
    "exactlens.constructions.nowak": [
        "NOWAK", "ONE_LABELS", "PALINDROME_C", "PALINDROME_LABELS", "decide_palindrome", "one", "palindrome",
        "palindrome_signal", "palindrome_tolerance"
    ],
    "exactlens.constructions.palindrome_hash": [
        "CLS", "EOS", "KEY_HASH", "LOOKUP_LAYER", "QUERY_HASH", "palindrome_hash", "palindrome_hash_program"
    ],
    "exactlens.constructions.palindrome_robust": [
        "LOOKUPS", "ROBUST_LABELS", "UNDERFLOW_GAP_SCALE", "palindrome_robust"
    ],
    "exactlens.constructions.registry": [
        "Construction", "REGISTRY", "accept_positive_logit", "build", "get", "names", "register"
    ],
    "exactlens.constructions.shin_matzinger": [
        "PAPER", "build_solution1", "build_solution2", "build_solution3", "check_large", "large_constant_bound",
        "pair_config", "predict", "residual_labels", "set_one_hot_inputs", "shift_down", "solution1",
        "solution1_pairs", "solution1_readout", "solution2", "solution3"
    ],
    "exactlens.data": [],
    "exactlens.data.stdlib_docs": ["CharCorpus", "STDLIB_MODULES", "char_corpus", "stdlib_docstrings"],
    "exactlens.errors": ["ExactLensError"],
    "exactlens.languages": [
        "CLS", "Dyck", "EOS", "First", "InductionFrequent", "InductionRecent", "LANGUAGES", "Language", "Majority",
        "One", "Palindrome", "Parity", "TokenBatch", "get", "register"
    ],
    "exactlens.languages.base": ["CLS", "EOS", "Language", "TokenBatch", "check_length"],
    "exactlens.languages.binary": ["First", "Parity"],
    "exactlens.languages.dyck": ["BRACKETS", "Dyck", "count_members"],
    "exactlens.languages.induction": ["InductionFrequent", "InductionRecent", "MAX_SYMBOLS"],
    "exactlens.languages.majority": ["MAX_CLASSES", "Majority", "SAMPLE_ROUNDS"],
    "exactlens.languages.nowak": ["ONE_POISSON_RATE", "One", "Palindrome"],
    "exactlens.languages.pairs": [
        "PairBatch", "PairGenerator", "Pairs", "Q_KINDS", "check_categories", "check_positions", "check_q", "make_q",
        "normal_q", "pair_code", "pair_targets", "target_mask"
    ],
    "exactlens.model": ["ExactConfig", "ExactTransformer"],
    "exactlens.model.components": [
        "Attention", "Block", "Embed", "HookPoint", "LayerNorm", "MLP", "PosEmbed", "Unembed", "hard_weights",
        "visible_keys"
    ],
    "exactlens.model.config": [
        "ACTIVATIONS", "DTYPES", "ExactConfig", "LENGTH_SCALES", "MASKS", "NORMALIZATIONS", "PER_LAYER_SWITCHES",
        "READOUTS", "WEIGHTINGS"
    ],
    "exactlens.model.export": [
        "TARGETS", "TARGET_NAMES", "export_problems", "exported_state_dict", "to_bridge", "to_hooked_transformer",
        "transformer_lens_major"
    ],
    "exactlens.model.positional": [
        "check_feature_names", "evaluate_features", "known_features", "register_position_feature",
        "sinusoidal_features"
    ],
    "exactlens.model.transformer": ["CONFIG_FILE", "ExactTransformer", "WEIGHTS_FILE"],
    "exactlens.train": [
        "HISTORY_FIELDS", "OPTION_DOCS", "PRESETS", "Preset", "TrainRun", "evaluate", "train", "train_many"
    ],
    "exactlens.train.data": [
        "Batch", "PAD_ID", "assemble", "check_lengths", "is_task", "sample_batch", "split", "targets_of"
    ],
    "exactlens.train.fastpath": [
        "cls_logits", "model_parameters", "stack_parameters", "stacked_cls_logits", "supports", "unstack_into"
    ],
    "exactlens.train.init": ["pytorch_default_init"],
    "exactlens.train.loop": [
        "EVAL_SCORE_BUDGET", "HISTORY_FIELDS", "HISTORY_FILE", "LN2", "PAD_ID", "RUN_FILE", "TrainRun", "evaluate",
        "loss_and_correct", "readout", "run_losses", "seed_generators", "stack_batches", "train", "train_many"
    ],
    "exactlens.train.presets": ["LAYER_NORMS", "OPTION_DOCS", "PRESETS", "Preset", "get_preset", "resolve_options"],
    "exactlens.train.shin_matzinger": [
        "DEGENERATE_POINTS", "ESCAPE_VARIANTS", "FLAVOURS", "GRID", "NORMALIZATIONS", "PairRun", "PairTrainConfig",
        "SYSTEMS", "WEIGHTINGS", "allowed_weights", "attention_gradients", "escape_runs", "fast_predict",
        "lean_penalty", "masked_mse", "new_model", "run_label", "train_grid", "train_pairs"
    ],
    "exactlens.viz": [],
    "exactlens.viz.attention": ["attention_heatmap", "attention_patterns", "attention_view", "token_labels"],
    "exactlens.viz.diff_page": ["attention_views", "diff_html", "probe_heatmap", "write_diff_page"],
    "exactlens.viz.report": [
        "CSS", "FIG2_SHORT", "FULL", "QUICK", "ReportContext", "ReportSettings", "SECTION_BUILDERS", "Section",
        "build_report", "chiang_figures_sections", "construction_section", "construction_sections", "esc", "figure",
        "fmt", "overview_sections", "progress", "render_page", "slug", "table", "torch_threads"
    ],
    "exactlens.viz.report_brody": ["FIG1", "brody_sections"],
    "exactlens.viz.report_diff": ["FULL_SETTINGS", "QUICK_SETTINGS", "diff_sections"],
    "exactlens.viz.report_examples": ["CHECK_LENGTHS", "EXAMPLES", "examples_sections"],
    "exactlens.viz.report_nowak": ["NOWAK_NAMES", "nowak_sections"],
    "exactlens.viz.report_shin_matzinger": ["FULL", "PAPER", "QUICK", "shin_matzinger_sections"],
}

# Old modules that no longer import, or lack some of their old names: old path -> where it went.
MOVED: dict[str, str] = {
    "exactlens.analysis.brody_figures": "module gone; names in exactlens.papers.brody.figures",
    "exactlens.analysis.brody_lm": "module gone; now exactlens.papers.brody.lm",
    "exactlens.analysis.brody_majority": "module gone; now exactlens.papers.brody.majority_training",
    "exactlens.analysis.chiang_figures": "module gone; now exactlens.papers.chiang_cholak.figures",
    "exactlens.analysis.diff": "BEST_TOLERANCE, SETTLE_TOLERANCE moved to analysis.diff.probes; LengthRun, Rows, "
    "Side, pooled to analysis.diff.runs; no longer importable from exactlens.analysis.diff",
    "exactlens.analysis.diff_attention": "module gone; now exactlens.analysis.diff.attention",
    "exactlens.analysis.diff_causal": "module gone; now exactlens.analysis.diff.interventions",
    "exactlens.analysis.diff_probe": "module gone; now exactlens.analysis.diff.probes",
    "exactlens.analysis.hull_model": "module gone; now exactlens.analysis.hull.model (analysis/hull/ is a "
    "package; exactlens.analysis.hull keeps its names)",
    "exactlens.data": "package gone; its one corpus is the Brody plug-in's",
    "exactlens.data.stdlib_docs": "module gone; now exactlens.papers.brody.corpus",
    "exactlens.analysis.diff_weights": "module gone; now exactlens.analysis.diff.weights",
    "exactlens.analysis.nowak_figures": "module gone; now exactlens.papers.nowak.figures",
    "exactlens.analysis.pairlogic": "module gone; now exactlens.papers.shin_matzinger.pairlogic",
    "exactlens.analysis.verify": "check_model_length, decisions, language_of, margins removed; cross_entropy_bits "
    "now exactlens.tasks.kinds.cross_entropy_bits(task, outputs, targets, n_positions)",
    "exactlens.cli": "SUBCOMMAND_MODULES, cmd_list, cmd_verify, cmd_precision, cmd_report removed (verbs are "
    "exactlens.cli.<verb>.run, registered with register_verb)",
    "exactlens.cli_diff": "module gone; exactlens.verbs.diff (run, format_diff_text); add_diff_parser/cmd_diff gone",
    "exactlens.cli_hull": "module gone; exactlens.cli.hull (run, format_hull_text); add_hull_parser/cmd_hull gone",
    "exactlens.cli_pairlogic": "module gone; exactlens.papers.shin_matzinger.cli (run, arguments)",
    "exactlens.cli_train": "module gone; the verb is declared in exactlens.verbs.train (its flags generated from "
    "exactlens.train.options.TrainOptions); parse_length, parse_seeds removed (the options' kinds parse)",
    "exactlens.constructions.catalog": "module gone (plug-ins register the built-ins)",
    "exactlens.constructions.catalog_chiang_cholak": "module gone (papers.chiang_cholak registers)",
    "exactlens.constructions.catalog_cookbook": "module gone; TC in exactlens.papers.cookbook.examples",
    "exactlens.constructions.catalog_nowak": "module gone; NOWAK in exactlens.papers.nowak.constructions",
    "exactlens.constructions.catalog_shin_matzinger": "module gone; RegressionConstruction, SM removed",
    "exactlens.constructions.chiang_cholak": "module gone; now exactlens.papers.chiang_cholak.constructions",
    "exactlens.constructions.cookbook_examples": "module gone; now exactlens.papers.cookbook.examples "
    "(majority -> papers.brody.majority; argmax_class removed)",
    "exactlens.constructions.nowak": "module gone; now exactlens.papers.nowak.constructions",
    "exactlens.constructions.palindrome_hash": "module gone; now exactlens.papers.nowak.palindrome_hash",
    "exactlens.constructions.palindrome_robust": "module gone; now exactlens.papers.nowak.palindrome_robust",
    "exactlens.constructions.layer_norm": "module removed (issue 42); now exactlens.constructions.cookbook.layer_norm",
    "exactlens.constructions.registry": "accept_positive_logit removed",
    "exactlens.constructions.shin_matzinger": "module gone; now exactlens.papers.shin_matzinger.constructions",
    "exactlens.languages": "alias removed (issue 42); now exactlens.tasks (LANGUAGES is TASKS, Language is Task)",
    "exactlens.languages.base": "module gone; now exactlens.tasks.base",
    "exactlens.languages.binary": "module gone; now exactlens.tasks.binary",
    "exactlens.languages.dyck": "module gone; now exactlens.tasks.dyck",
    "exactlens.languages.induction": "module gone; now exactlens.tasks.induction",
    "exactlens.languages.majority": "module gone; now exactlens.tasks.majority",
    "exactlens.languages.nowak": "module gone; One, ONE_POISSON_RATE in tasks.binary, Palindrome in tasks.palindrome",
    "exactlens.languages.pairs": "module gone; now exactlens.papers.shin_matzinger.task",
    "exactlens.train.data": "is_task, targets_of removed",
    "exactlens.train.fastpath": "module removed (replaced by exactlens.model.stacked.StackedRuns)",
    "exactlens.train.init": "module gone; exactlens.model.init (initialize), pytorch_default_init removed",
    "exactlens.train.loop": "loss_and_correct, readout removed",
    "exactlens.train.shin_matzinger": "module gone; now exactlens.papers.shin_matzinger.training "
    "(fast_predict, masked_mse removed; new_model is exactlens.train.loop.new_model with another signature)",
    "exactlens.viz.report": "module gone; now exactlens.viz.page + exactlens.viz.sections + papers' report modules "
    "(SECTION_BUILDERS removed)",
    "exactlens.viz.report_brody": "module gone; now exactlens.papers.brody.report",
    "exactlens.viz.report_diff": "module gone; diff_sections in papers.chiang_cholak.report, FULL_/QUICK_SETTINGS gone",
    "exactlens.viz.report_examples": "module gone; now exactlens.papers.cookbook.report",
    "exactlens.viz.report_nowak": "module gone; now exactlens.papers.nowak.report",
    "exactlens.viz.report_shin_matzinger": "module gone; now exactlens.papers.shin_matzinger.report",
}


@pytest.mark.parametrize(
    "module",
    [m for m in OLD_MODULES if m not in MOVED],  # MOVED: the refactor's deliberate moves (see the README)
)
def test_old_module_keeps_its_names(module):
    mod = importlib.import_module(module)
    missing = [n for n in OLD_MODULES[module] if not hasattr(mod, n)]
    assert not missing, f"{module} lacks {missing}"


OLD_CONSTRUCTION_TASKS = {
    "dyck-k-D": "dyck", "dyck1": "dyck", "dyck1-depth2": "dyck", "first": "first", "first-flawed": "first",
    "first-ln": "first", "first-ln-eta": "first", "first-log": "first", "first-log-ln": "first",
    "induction-frequent": "induction-frequent", "induction-recent": "induction-recent", "majority": "majority",
    "one": "one", "palindrome": "palindrome", "palindrome-hash": "palindrome", "palindrome-robust": "palindrome",
    "parity": "parity", "parity-ln": "parity", "parity-ln-eta": "parity", "sm-solution1": "pairs",
    "sm-solution2": "pairs", "sm-solution3": "pairs",
}
OLD_LANGUAGE_VOCABS = {
    "dyck": ("(", ")", "[CLS]"), "first": ("0", "1", "[CLS]"), "induction-frequent": ("a", "b", "c", "[CLS]"),
    "induction-recent": ("a", "b", "c", "[CLS]"), "majority": (*"abcdefghijklmnopqrst", "[CLS]"),
    "one": ("0", "1", "[CLS]"), "pairs": tuple("0123456789"), "palindrome": ("0", "1", "[CLS]", "[EOS]"),
    "parity": ("0", "1", "[CLS]"),
}


def test_constructions_build_names_get():
    from exactlens.constructions import REGISTRY, build, get, names

    assert set(OLD_CONSTRUCTION_TASKS) <= set(names())
    for name, language in OLD_CONSTRUCTION_TASKS.items():
        c = get(name)
        assert c.name == name and c.language == language
        assert name in REGISTRY
        row = c.describe()
        assert {"name", "language", "paper", "summary", "parameters", "min_length", "max_length"} <= set(row)
        assert row["language"] == language
    model = build("parity", dtype="float64", c=1.0)
    assert model.cfg.dtype == "float64" and model.cfg.model_name == "parity"


def test_languages_get_and_registry():
    import exactlens.tasks as languages  # exactlens.languages until issue 42 (docs/upgrading.md)

    assert set(OLD_LANGUAGE_VOCABS) <= set(languages.TASKS)
    for name, vocab in OLD_LANGUAGE_VOCABS.items():
        assert tuple(languages.get(name).vocab) == vocab, name
    assert languages.get("majority", num_classes=5).vocab == (*"abcde", "[CLS]")
    lang = languages.get("parity")
    assert isinstance(lang, languages.Language)
    batch = lang.tokenize(["0110", "1"])
    assert isinstance(batch, languages.TokenBatch) and batch.n_positions.tolist() == [5, 2]
    assert lang.membership(lang.all_words(3)).tolist() == [sum(w) % 2 == 1 for w in lang.all_words(3).tolist()]


def test_languages_register_as_class_decorator():
    import exactlens.tasks as languages

    try:
        @languages.register
        class CompatAllOnes(languages.Language):
            name = "compat-all-ones"
            alphabet = ("a",)

            def contains(self, word):
                return True

            def membership(self, symbol_ids):
                return torch.ones(symbol_ids.shape[0], dtype=torch.bool)

        assert isinstance(languages.get("compat-all-ones"), CompatAllOnes)
    finally:
        dict.pop(languages.TASKS, "compat-all-ones", None)


def test_readme_tour_of_0cb9ec5():
    from exactlens.constructions import build
    from exactlens.tasks import get as language

    model = build("parity", dtype="float64", c=1.0)
    batch = language("parity").tokenize(["0110", "111"])
    logits, cache = model.run_with_cache(batch.tokens, n_positions=batch.n_positions)
    s = model.readout_logits(batch.tokens, batch.n_positions)
    assert s.shape == (2,) and torch.equal(s, logits[:, 0, 0])
    assert "k/n" in model.cfg.residual_labels
    assert cache["blocks.1.attn.hook_pattern"].shape[:2] == (2, model.cfg.n_heads)
    assert model.QK is not None and model.OV is not None


def test_construction_check_length_and_lang():
    from exactlens.constructions import get

    c = get("parity")
    c.check_length(3)
    assert tuple(c.lang().vocab) == ("0", "1", "[CLS]")
    assert get("sm-solution1").tags == ("regression",)


OLD_OPTION_DOCS = {
    "epochs", "strings_per_epoch", "batch_size", "train_length", "test_length", "test_strings", "eval_every", "lr",
    "lr_schedule", "scaled", "dtype", "d_model", "d_mlp", "ln_eps", "layer_norm", "positions", "num_classes",
    "threads",
}
OLD_HISTORY_FIELDS = (
    "epoch", "step", "strings_seen", "lr", "train_loss_bits", "train_accuracy", "test_loss_bits", "test_accuracy",
    "test_attn_first", "test_query_angle_deg", "wall_s",
)


def test_option_docs_keep_old_options():
    from exactlens.train import OPTION_DOCS

    assert OLD_OPTION_DOCS <= set(OPTION_DOCS)


def test_train_python_api_and_reproducibility():
    """The README's train call; the same seed and options give the run 0cb9ec5 gave (its numbers)."""
    from exactlens.model import ExactTransformer
    from exactlens.train import PRESETS, TrainRun, train, train_many

    assert {"first", "parity", "one", "majority"} <= set(PRESETS)
    run = train("first", seed=0, epochs=2, strings_per_epoch=20, test_strings=10, train_length=10, test_length=20)
    assert isinstance(run, TrainRun) and isinstance(run.model, ExactTransformer) and run.checkpoint is None
    final = run.final
    assert final["train_loss_bits"] == pytest.approx(1.0383469056176553, rel=1e-6)
    assert final["test_loss_bits"] == pytest.approx(1.0012203916383577, rel=1e-6)
    assert final["test_attn_first"] == pytest.approx(0.1162313014268875, rel=1e-6)
    assert (final["train_accuracy"], final["test_accuracy"], run.info["n_parameters"]) == (0.55, 0.5, 6641)
    runs = train_many("first", seeds=[0, 1], epochs=1, strings_per_epoch=8, test_strings=4, train_length=5,
                      test_length=5)
    assert [r.seed for r in runs] == [0, 1]


def test_presets_filled_at_import():
    code = "from exactlens.train import PRESETS; print(','.join(sorted(PRESETS.copy())), repr(PRESETS) != '{}')"
    import exactlens

    src = Path(exactlens.__file__).resolve().parents[1]  # the tree under test
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    names, filled = out.stdout.split()
    assert {"first", "parity", "one", "majority"} <= set(names.split(",")) and filled == "True"


@pytest.mark.parametrize("option", [{"positions": "paper"}, {"num_classes": None}])
def test_train_accepts_old_generic_options(option):
    from exactlens.train import train

    train("first", epochs=1, strings_per_epoch=4, test_strings=2, train_length=3, test_length=3, **option)


# ---- 2. The command line: verbs and options -----------------------------------------------

# Every option of every verb at 0cb9ec5: option -> (dest, default, choices).
OLD_CLI: dict[str, dict[str, tuple]] = {
    "diff": {
        "target": ("target", None, None), "--against": ("against", None, None), "--html": ("html", None, None),
        "--json": ("json", False, None), "--lengths": ("lengths", None, None), "--param": ("param", None, None),
        "--seed": ("seed", 0, None), "--strings": ("strings", 64, None),
    },
    "hull": {
        "target": ("target", None, None), "--json": ("json", False, None), "--seed": ("seed", 0, None),
        "--tol": ("tol", 1e-09, None),
    },
    "list": {"--json": ("json", False, None)},
    "pairlogic": {
        "--batch": ("batch", 1000, None), "--categories": ("categories", 10, None), "--check": ("check", None, None),
        "--checkpoint": ("checkpoint", None, None), "--dtype": ("dtype", "float32", ("float32", "float64")),
        "--flavour": ("flavour", "unconstrained", ("solution1", "solution2", "solution3", "unconstrained")),
        "--iterations": ("iterations", 50, None), "--json": ("json", False, None),
        "--positions": ("positions", 50, None), "--q": ("q", "normal", ("normal", "code")),
        "--q-seed": ("q_seed", 0, None), "--save": ("save", None, None), "--seed": ("seed", 0, None),
        "--seeds": ("seeds", 1, None),
        "--system": ("system", "combined", ("solution1", "solution2", "solution3", "combined")),
    },
    "precision": {
        "name": ("name", None, None), "--dtype": ("dtype", "float32", ("float32", "float64")),
        "--json": ("json", False, None), "--max-length": ("max_length", None, None), "--param": ("param", None, None),
        "--seed": ("seed", 0, None), "--strings": ("strings", 64, None),
    },
    "report": {"names": ("names", None, None), "--out": ("out", None, None), "--quick": ("quick", False, None)},
    "train": {
        "task": ("task", None, ("first", "parity", "one", "majority")),
        "--batch-size": ("batch_size", None, None), "--d-mlp": ("d_mlp", None, None),
        "--d-model": ("d_model", None, None), "--dtype": ("dtype", None, ("float32", "float64")),
        "--epochs": ("epochs", None, None), "--eval-every": ("eval_every", None, None),
        "--json": ("json", False, None), "--layer-norm": ("layer_norm", None, ("full", "scale_only", "none")),
        "--ln-eps": ("ln_eps", None, None), "--lr": ("lr", None, None),
        "--lr-schedule": ("lr_schedule", None, ("constant", "linear")), "--num-classes": ("num_classes", None, None),
        "--out": ("out", None, None), "--positions": ("positions", None, ("paper", "first")),
        "--scaled": ("scaled", False, None), "--seed": ("seed", 0, None), "--seeds": ("seeds", None, None),
        "--strings-per-epoch": ("strings_per_epoch", None, None), "--test-length": ("test_length", None, None),
        "--test-strings": ("test_strings", None, None), "--threads": ("threads", None, None),
        "--train-length": ("train_length", None, None),
    },
    "verify": {
        "name": ("name", None, None), "--dtype": ("dtype", "float32", ("float32", "float64")),
        "--json": ("json", False, None), "--lengths": ("lengths", None, None), "--param": ("param", None, None),
        "--seed": ("seed", 0, None), "--strings": ("strings", 1000, None),
    },
}


def _verb_parsers() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("verb", sorted(OLD_CLI))
def test_cli_verb_keeps_its_options(verb):
    parsers = _verb_parsers()
    assert verb in parsers, f"verb {verb!r} is gone"
    actions = {("/".join(a.option_strings) or a.dest): a for a in parsers[verb]._actions}
    for option, (dest, default, choices) in OLD_CLI[verb].items():
        assert option in actions, f"{verb} {option} is gone"
        a = actions[option]
        assert a.dest == dest and a.default == default, (verb, option, a.dest, a.default)
        if choices is None:
            continue
        if option == "task":  # train: a preset name, now any registered preset
            from exactlens.train import PRESETS

            assert set(choices) <= set(PRESETS)
        else:
            assert set(choices) <= set(a.choices), (verb, option, a.choices)


def test_cli_module_entry_point():
    """``python -m exactlens.cli`` (a module then, a package with __main__ now)."""
    spec = importlib.util.find_spec("exactlens.cli")
    assert spec is not None
    if spec.submodule_search_locations is not None:
        assert importlib.util.find_spec("exactlens.cli.__main__") is not None


# ---- 3. JSON output ------------------------------------------------------------------------

# The fields the 0cb9ec5 commands printed with --json, as PATH:TYPE ("/" separates keys, "[]" is a
# list's first element; num = int or float, any = was null). Read off: list --json; verify parity
# --lengths 1:3 --strings 4; precision parity --max-length 8 --strings 2; train first (below);
# train first --seeds 0:1; diff first-flawed --against first --lengths 2 --strings 4; hull first;
# pairlogic --check sm-solution1 / a one-iteration pairlogic run (N=3, M=4, batch 8).
OLD_JSON_PATHS = {
    "list": """
        constructions[]/name:str constructions[]/language:str constructions[]/paper:str constructions[]/summary:str
        constructions[]/parameters/k:num constructions[]/parameters/D:num constructions[]/parameters/max_length:any
        constructions[]/parameters/weighting:str constructions[]/min_length:num constructions[]/max_length:any
    """,
    "verify": """
        name:str dtype:str seed:num params:obj results[]/length:num results[]/strings:num results[]/accuracy:num
        results[]/cross_entropy_bits:num results[]/min_abs_logit:num results[]/exhaustive:bool
    """,
    "precision": """
        name:str dtype:str params:obj max_exact_length:num first_failure_length:any checked[]/length:num
        checked[]/strings:num checked[]/errors:num checked[]/min_abs_logit:num checked[]/exhaustive:bool
    """,
    "train": """
        task:str paper:str seed:num options/batch_size:num options/eval_every:num options/lr_schedule:str
        options/scaled:bool options/dtype:str options/layer_norm:str options/positions:str options/num_classes:any
        options/threads:any options/epochs:num options/strings_per_epoch:num options/test_strings:num options/lr:num
        options/d_model:num options/d_mlp:num options/ln_eps:num options/train_length:list options/test_length:list
        steps:num wall_s:num threads:num torch:str python:str n_parameters:num trained_with/seeds:list
        trained_with/stacked:bool final/epoch:num final/step:num final/strings_seen:num final/lr:num
        final/train_loss_bits:num final/train_accuracy:num final/test_loss_bits:num final/test_accuracy:num
        final/test_attn_first:num final/test_query_angle_deg:any final/wall_s:num
    """,
    "train_seeds": """
        runs[]/task:str runs[]/paper:str runs[]/seed:num runs[]/options/batch_size:num runs[]/options/eval_every:num
        runs[]/options/lr_schedule:str runs[]/options/scaled:bool runs[]/options/dtype:str
        runs[]/options/layer_norm:str runs[]/options/positions:str runs[]/options/num_classes:any
        runs[]/options/threads:any runs[]/options/epochs:num runs[]/options/strings_per_epoch:num
        runs[]/options/test_strings:num runs[]/options/lr:num runs[]/options/d_model:num runs[]/options/d_mlp:num
        runs[]/options/ln_eps:num runs[]/options/train_length:list runs[]/options/test_length:list runs[]/steps:num
        runs[]/wall_s:num runs[]/threads:num runs[]/torch:str runs[]/python:str runs[]/n_parameters:num
        runs[]/trained_with/seeds:list runs[]/trained_with/stacked:bool runs[]/final/epoch:num runs[]/final/step:num
        runs[]/final/strings_seen:num runs[]/final/lr:num runs[]/final/train_loss_bits:num
        runs[]/final/train_accuracy:num runs[]/final/test_loss_bits:num runs[]/final/test_accuracy:num
        runs[]/final/test_attn_first:num runs[]/final/test_query_angle_deg:any runs[]/final/wall_s:num
    """,
    "diff": """
        trained/kind:str trained/name:str trained/class:str trained/n_layers:num trained/n_heads:num
        trained/d_model:num trained/d_head:num trained/dtype:str trained/normalization:str trained/d_mlp:num
        trained/attn_length_scale:list trained/model_name:str trained/vocab:list trained/vocab_check:str
        exact/name:str exact/paper:str exact/params:obj exact/class:str exact/n_layers:num exact/n_heads:num
        exact/d_model:num exact/d_head:num exact/dtype:str exact/normalization:str exact/d_mlp:num
        exact/attn_length_scale:list exact/model_name:str settings/lengths:list settings/skipped_lengths:list
        settings/strings:num settings/seed:num settings/exact_dtype:str settings/test_fraction:num
        settings/intervention_pairs:num settings/parts:list residual_labels:list behaviour/rows[]/length:num
        behaviour/rows[]/strings:num behaviour/rows[]/exhaustive:bool behaviour/rows[]/exact_accuracy:num
        behaviour/rows[]/trained_accuracy:num behaviour/rows[]/agreement:num behaviour/exact_accuracy:num
        behaviour/trained_accuracy:num behaviour/agreement:num probes/sites:list probes/exact_sites:list
        probes/test_fraction:num probes/rows:num probes/sequences:num probes/held_out_sequences:num
        probes/features[]/label:str probes/features[]/index:num probes/features[]/positions:str
        probes/features[]/exact_site:str probes/features[]/constant:bool
        probes/features[]/r2/blocks.0.hook_resid_pre:num probes/features[]/r2/blocks.0.hook_resid_mid:num
        probes/features[]/r2/blocks.0.mlp.hook_post:num probes/features[]/r2/blocks.0.hook_resid_post:num
        probes/features[]/best_site:str probes/features[]/best_r2:num probes/features[]/best_residual_site:str
        probes/features[]/best_residual_r2:num attention/distance:str attention/trained_heads[]:list
        attention/exact_heads[]:list attention/distances[]:list attention/matching[]/trained_layer:num
        attention/matching[]/trained_head:num attention/matching[]/exact_layer:num
        attention/matching[]/exact_head:num attention/matching[]/distance:num
        attention/cls_to_first/query_position:num attention/cls_to_first/key_position:num
        attention/cls_to_first/rows[]/length:num attention/cls_to_first/rows[]/trained[]:list
        attention/cls_to_first/rows[]/exact[]:list attention/cls_to_first/rows[]/trained_summed:num
        attention/cls_to_first/rows[]/exact_summed:num weights/method:str weights/pairs[]/trained_layer:num
        weights/pairs[]/trained_head:num weights/pairs[]/exact_layer:num weights/pairs[]/exact_head:num
        weights/pairs[]/qk_cosine:num weights/pairs[]/qk_relative_error:num weights/pairs[]/qk_norm_trained:num
        weights/pairs[]/qk_norm_exact:num weights/pairs[]/ov_cosine:num weights/pairs[]/ov_relative_error:num
        weights/pairs[]/ov_norm_trained:num weights/pairs[]/ov_norm_exact:num
        weights/pairs[]/length_scale/trained:str weights/pairs[]/length_scale/exact:str
        weights/pairs[]/qk_singular_values/trained:list weights/pairs[]/qk_singular_values/exact:list
        weights/pairs[]/qk_singular_values/trained_aligned:list
        weights/pairs[]/qk_singular_values/exact_aligned:list weights/pairs[]/ov_singular_values/trained:list
        weights/pairs[]/ov_singular_values/exact:list weights/pairs[]/ov_singular_values/trained_aligned:list
        weights/pairs[]/ov_singular_values/exact_aligned:list weights/pairs[]/qk_trained_in_exact_basis[]:list
        weights/pairs[]/qk_exact[]:list interventions/features[]/label:str interventions/features[]/trained_site:str
        interventions/features[]/exact_site:str interventions/features[]/r2:num
        interventions/features[]/positions:str interventions/features[]/pairs:num interventions/features[]/iia:num
        interventions/features[]/exact_changed:num interventions/features[]/iia_changed:num
        interventions/skipped[]/label:str interventions/skipped[]/reason:str interventions/iia:num
        interventions/iia_changed:num summary/agreement:num summary/trained_accuracy:num summary/exact_accuracy:num
        summary/mean_best_r2:num summary/mean_best_r2_computed:num summary/mean_matched_attention_distance:num
        summary/mean_qk_cosine:num summary/mean_ov_cosine:num summary/mean_iia:num summary/mean_iia_changed:num
        seconds:num
    """,
    "hull": """
        target/kind:str target/name:str target/paper:str target/dtype:str target/word_lengths:list
        target/sequences_per_length:num target/seed:num model/class:str model/n_layers:num model/n_heads:num
        model/d_model:num model/d_head:num model/normalization:str model/normalization_source:str n_sequences:num
        n_positions:list tolerance:num method:str attention_input:str attention_input_note:str query_space_note:str
        layers[]/layer:num layers[]/before_ln/hook:str layers[]/before_ln/dim:num
        layers[]/before_ln/fraction_unselectable:num layers[]/before_ln/fraction_per_sequence:list
        layers[]/before_ln/n_unselectable_per_sequence:list layers[]/before_ln/n_selectable_per_sequence:list
        layers[]/attention_input:str layers[]/after_ln:any layers[]/per_head[]/head:num layers[]/per_head[]/hook:str
        layers[]/per_head[]/query_rank:num layers[]/per_head[]/query_bias_outside_span:bool
        layers[]/per_head[]/dim:num layers[]/per_head[]/fraction_unselectable:num
        layers[]/per_head[]/fraction_per_sequence:list layers[]/per_head[]/n_unselectable_per_sequence:list
        layers[]/per_head[]/n_selectable_per_sequence:list
    """,
    "pairlogic_check": """
        name:str dtype:str categories:num positions:num q:str q_seed:num max_abs_error:num tolerance:num exact:bool
        strings:num exhaustive_length:num
    """,
    "pairlogic": """
        categories:num positions:num q:str q_seed:num system:str flavour:str runs[]/seed:num runs[]/train_mse:num
        runs[]/test_mse:num runs[]/seconds:num runs[]/ablations/mse:num runs[]/ablations/mse_without_attention:num
        runs[]/ablations/mse_linear_ffn:num runs[]/ablations/target_variance:num runs[]/signatures/qk_category_q:num
        runs[]/signatures/ov_category_q:num runs[]/signatures/qk_position_shift:num
        runs[]/signatures/ov_position_shift:num runs[]/signatures/ov_category_identity:num runs[]/verdict:str
        consensus:str verdict_rule/attention_q:num verdict_rule/ffn_q:num verdict_rule/used:num
    """,
}


def _kind(value) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, (int, float)):
        return "num"
    return {str: "str", list: "list", dict: "obj"}.get(type(value), type(value).__name__)


def missing_fields(obj, spec: str, skip: tuple[str, ...] = ()) -> list[str]:
    """The PATH:TYPE entries of spec that obj lacks or holds with another type (null is accepted)."""
    problems = []
    for entry in spec.split():
        path, kind = entry.rsplit(":", 1)
        if path in skip:
            continue
        node, where = obj, ""
        for part in path.split("/"):
            key, *lists = part.split("[]")
            if not isinstance(node, dict) or key not in node:
                problems.append(f"{where}/{key}: missing")
                break
            node, where = node[key], f"{where}/{key}"
            for _ in lists:
                if not isinstance(node, list):
                    problems.append(f"{where}: a list before, now {_kind(node)}")
                    break
                node = node[0] if node else None
            else:
                continue
            break
        else:
            if kind != "any" and node is not None and _kind(node) != kind:
                problems.append(f"{where}: {kind} before, now {_kind(node)} ({node!r:.60})")
    return problems


# Fields whose loss or change has its own xfail test below (the checks here guard everything else).
TRAIN_SKIP = ("options/positions", "options/num_classes", "final/test_query_angle_deg")
DIFF_SKIP = ("trained/normalization", "exact/normalization")
TINY_TRAIN = ["--epochs", "2", "--strings-per-epoch", "20", "--test-strings", "10", "--train-length", "10",
              "--test-length", "20"]
SMALL = ["--epochs", "1", "--strings-per-epoch", "8", "--test-strings", "4", "--train-length", "5",
         "--test-length", "5"]


def test_list_json(capsys):
    result = run_cli(capsys, ["list", "--json"])
    rows = {r["name"]: r for r in result["constructions"]}
    assert set(OLD_CONSTRUCTION_TASKS) <= set(rows)
    assert missing_fields({"constructions": [rows["dyck-k-D"]]}, OLD_JSON_PATHS["list"]) == []
    assert {name: rows[name]["language"] for name in OLD_CONSTRUCTION_TASKS} == OLD_CONSTRUCTION_TASKS


def test_verify_json(capsys):
    result = run_cli(capsys, ["verify", "parity", "--lengths", "1:3", "--strings", "4", "--json"])
    assert missing_fields(result, OLD_JSON_PATHS["verify"]) == []
    result = run_cli(capsys, ["verify", "first-flawed", "--param", "c=3", "--lengths", "2,5", "--strings", "8",
                              "--dtype", "float64", "--seed", "1", "--json"])
    assert result["params"] == {"c": 3} and [r["length"] for r in result["results"]] == [2, 5]


def test_precision_json(capsys):
    result = run_cli(capsys, ["precision", "parity", "--max-length", "8", "--strings", "2", "--json"])
    assert missing_fields(result, OLD_JSON_PATHS["precision"]) == []
    assert result["max_exact_length"] == 8


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """exactlens train --json for the old presets, with tiny settings: {name: (stdout object, out dir)}."""
    import contextlib
    import io

    root = tmp_path_factory.mktemp("train")
    argvs = {
        "first": ["train", "first", *TINY_TRAIN],
        "one": ["train", "one", "--positions", "first", "--layer-norm", "scale_only", *SMALL],
        "majority": ["train", "majority", "--num-classes", "5", "--layer-norm", "none", "--scaled", *SMALL],
        "seeds": ["train", "first", "--seeds", "0:1", *SMALL],
    }
    out = {}
    for name, argv in argvs.items():
        stdout = io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
            code = main([*argv, "--out", str(root / name), "--json"])
        assert code == 0, name
        out[name] = (json.loads(stdout.getvalue()), root / name)
    return out


def test_train_json_and_run_json(trained):
    result, out = trained["first"]
    assert missing_fields(result, OLD_JSON_PATHS["train"], skip=TRAIN_SKIP) == []
    assert json.loads((out / "run.json").read_text()) == result
    assert result["final"]["train_loss_bits"] == pytest.approx(1.0383469056176553, rel=1e-6)  # 0cb9ec5's value
    for name in ("one", "majority"):  # test_attn_first: see test_history_records_keep_old_keys
        skip = (*TRAIN_SKIP, "final/test_attn_first")
        assert missing_fields(trained[name][0], OLD_JSON_PATHS["train"], skip=skip) == [], name


def test_train_seeds_json(trained):
    result, out = trained["seeds"]
    skip = tuple(f"runs[]/{p}" for p in TRAIN_SKIP)
    assert missing_fields(result, OLD_JSON_PATHS["train_seeds"], skip=skip) == []
    assert [r["trained_with"]["seeds"] for r in result["runs"]] == [[0, 1], [0, 1]]
    assert all((out / f"seed{s}" / "run.json").is_file() for s in (0, 1))


@pytest.mark.parametrize("preset", ["first", "one", "majority"])
def test_train_options_keep_old_keys(trained, preset):
    assert OLD_OPTION_DOCS <= set(trained[preset][0]["options"])


@pytest.mark.parametrize("preset", ["first", "one", "majority"])
def test_history_records_keep_old_keys(trained, preset):
    out = trained[preset][1]
    records = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
    assert records and all(set(OLD_HISTORY_FIELDS) <= set(r) for r in records)
    assert set(OLD_HISTORY_FIELDS) <= set(trained[preset][0]["final"])


def test_history_records_common_keys(trained):
    for preset in ("first", "one", "majority"):
        out = trained[preset][1]
        records = [json.loads(line) for line in (out / "history.jsonl").read_text().splitlines()]
        common = set(OLD_HISTORY_FIELDS) - {"test_attn_first", "test_query_angle_deg"}
        assert records and all(common <= set(r) for r in records), preset


def test_train_one_positions_first(trained):
    assert trained["one"][0]["options"]["positions"] == "first"
    assert trained["majority"][0]["options"]["num_classes"] == 5


@pytest.mark.parametrize("preset", ["first", "majority"])
def test_train_cli_positions_paper(capsys, tmp_path, preset):
    extra = ["--num-classes", "5"] if preset == "majority" else []
    run_cli(capsys, ["train", preset, "--positions", "paper", *extra, *SMALL, "--out", str(tmp_path), "--json"])


def test_diff_json(capsys, tmp_path):
    html = tmp_path / "diff.html"
    result = run_cli(capsys, ["diff", "first-flawed", "--against", "first", "--lengths", "2", "--strings", "4",
                              "--seed", "0", "--html", str(html), "--json"])
    assert missing_fields(result, OLD_JSON_PATHS["diff"], skip=DIFF_SKIP) == []
    assert html.is_file()


def test_diff_json_normalization_is_a_string(capsys):
    result = run_cli(capsys, ["diff", "first-flawed", "--against", "first", "--lengths", "2", "--strings", "4",
                              "--json"])
    assert missing_fields(result, OLD_JSON_PATHS["diff"]) == []


def test_hull_json(capsys):
    result = run_cli(capsys, ["hull", "first", "--tol", "1e-9", "--seed", "0", "--json"])
    assert missing_fields(result, OLD_JSON_PATHS["hull"]) == []


def test_pairlogic_json(capsys, tmp_path):
    small = ["--categories", "3", "--positions", "4", "--batch", "8"]
    result = run_cli(capsys, ["pairlogic", "--check", "sm-solution1", *small, "--json"])
    assert missing_fields(result, OLD_JSON_PATHS["pairlogic_check"]) == []
    result = run_cli(capsys, ["pairlogic", *small, "--iterations", "1", "--seeds", "1", "--system", "combined",
                              "--flavour", "unconstrained", "--q", "normal", "--q-seed", "0", "--dtype", "float32",
                              "--save", str(tmp_path), "--json"])
    assert missing_fields(result, OLD_JSON_PATHS["pairlogic"]) == []
    assert (tmp_path / "seed0" / "config.json").is_file()


OLD_REPORT_SETTINGS = {"verify_lengths", "verify_strings", "precision_max_length", "precision_strings",
                       "precision_points_per_decade", "example_length", "fig2", "fig3"}


def _report_json(tmp_path) -> dict:
    try:
        from exactlens.viz.page import build_report
    except ImportError:  # 0cb9ec5 (the module path itself: test_old_module_keeps_its_names)
        from exactlens.viz.report import build_report

    index = build_report(["parity"], tmp_path, quick=True, builders=[])
    assert index == tmp_path / "index.html" and index.is_file()
    return json.loads((tmp_path / "data" / "report.json").read_text())


def test_report_json(tmp_path):
    data = _report_json(tmp_path)
    assert {"constructions", "quick", "settings", "sections", "timings", "seconds", "errors"} <= set(data)
    assert OLD_REPORT_SETTINGS - {"fig2", "fig3"} <= set(data["settings"])
    assert data["constructions"] == ["parity"] and data["quick"] is True


def test_report_json_settings_fig2_fig3(tmp_path):
    """A report that includes the Chiang & Cholak figures records their settings under the old keys."""
    from exactlens.papers.chiang_cholak.report import chiang_figures_sections
    from exactlens.viz.page import build_report

    build_report(["parity"], tmp_path, quick=True, builders=[chiang_figures_sections])
    settings = json.loads((tmp_path / "data" / "report.json").read_text())["settings"]
    assert OLD_REPORT_SETTINGS <= set(settings)
    assert settings["fig2"]["points_per_decade"] == 8 and settings["fig3"]["lengths"] == [1, 20]


# ---- 4. Checkpoints written by 0cb9ec5 -----------------------------------------------------

# config.json as 0cb9ec5's ExactTransformer.save wrote it: `exactlens train first` and
# `exactlens pairlogic --save` (no "task", no "decision_rule").
OLD_FIRST_CONFIG = {
    "act_fn": "relu", "attention_mask": "none", "attention_weighting": "softmax", "attn_bias": True,
    "attn_length_scale": "none", "attn_scale": None, "d_head": 16, "d_mlp": 64, "d_model": 16, "d_vocab": 3,
    "d_vocab_out": 1, "dtype": "float32", "hard_tie_tolerance": 0.0, "ln_affine": True, "ln_center": True,
    "ln_eps": 1e-05, "ln_final": None, "ln_scale": True, "ln_select": False,
    "metadata": {"paper": "Chiang & Cholak 2022, §5.1/§5.3, Fig. 4", "preset": "first"}, "mlp_bias": True,
    "mlp_residual": True, "model_name": "trained-first", "n_ctx": None, "n_heads": 1, "n_layers": 2,
    "normalization": "post", "positional_features": ["I[i=1]"], "readout": "sigmoid", "readout_position": 0,
    "residual_labels": None, "use_attn_result": False, "vocab": ["0", "1", "[CLS]"],
}
OLD_PAIRS_CONFIG = {
    "act_fn": "relu", "attention_mask": "causal", "attention_weighting": "none", "attn_bias": False,
    "attn_length_scale": "none", "attn_scale": 1.0, "d_head": 7, "d_mlp": 9, "d_model": 7, "d_vocab": 3,
    "d_vocab_out": 1, "dtype": "float32", "hard_tie_tolerance": 0.0, "ln_affine": True, "ln_center": True,
    "ln_eps": 1e-05, "ln_final": None, "ln_scale": True, "ln_select": False,
    "metadata": {"paper": "Shin & Matzinger 2025 §4", "train": {
        "batch": 20, "categories": 3, "d_mlp": None, "dtype": "float32", "flavour": "unconstrained",
        "init_attention_scale": 1.0, "iterations": 2, "lean": 0.01, "normalization": "post", "positions": 4,
        "q": "normal", "q_seed": 0, "seed": 0, "system": "combined", "test_batch": 1000, "weighting": "none"}},
    "mlp_bias": True, "mlp_residual": False, "model_name": "shin-matzinger", "n_ctx": 4, "n_heads": 1,
    "n_layers": 1, "normalization": "post", "positional_features": ["learned"], "readout": "per_position",
    "readout_position": 0, "residual_labels": ["cat0", "cat1", "cat2", "pos0", "pos1", "pos2", "pos3"],
    "use_attn_result": False, "vocab": ["0", "1", "2"],
}
# The weights.pt keys and shapes 0cb9ec5 saved for these configs.
OLD_FIRST_WEIGHTS = {"embed.W_E": (3, 16), "pos_embed.W_feat": (1, 16), "unembed.W_U": (16, 1), "unembed.b_U": (1,)}
for _l in (0, 1):
    OLD_FIRST_WEIGHTS |= {f"blocks.{_l}.attn.{w}": (1, 16, 16) for w in ("W_Q", "W_K", "W_V", "W_O")}
    OLD_FIRST_WEIGHTS |= {f"blocks.{_l}.attn.{b}": (1, 16) for b in ("b_Q", "b_K", "b_V")}
    OLD_FIRST_WEIGHTS |= {f"blocks.{_l}.{n}": (16,) for n in ("attn.b_O", "mlp.b_out", "ln1.w", "ln1.b", "ln2.w",
                                                               "ln2.b")}
    OLD_FIRST_WEIGHTS |= {f"blocks.{_l}.mlp.W_in": (16, 64), f"blocks.{_l}.mlp.b_in": (64,),
                          f"blocks.{_l}.mlp.W_out": (64, 16)}
OLD_PAIRS_WEIGHTS = {
    "embed.W_E": (3, 7), "pos_embed.W_pos": (4, 7), "blocks.0.attn.W_Q": (1, 7, 7), "blocks.0.attn.W_K": (1, 7, 7),
    "blocks.0.attn.W_V": (1, 7, 7), "blocks.0.attn.W_O": (1, 7, 7), "blocks.0.attn.b_Q": (1, 7),
    "blocks.0.attn.b_K": (1, 7), "blocks.0.attn.b_V": (1, 7), "blocks.0.attn.b_O": (7,),
    "blocks.0.mlp.W_in": (7, 9), "blocks.0.mlp.b_in": (9,), "blocks.0.mlp.W_out": (9, 7), "blocks.0.mlp.b_out": (7,),
    "blocks.0.ln1.w": (7,), "blocks.0.ln1.b": (7,), "unembed.W_U": (7, 1), "unembed.b_U": (1,),
}
# What 0cb9ec5's model computed with the deterministic weights of _old_weights on these tokens.
OLD_CHECKPOINTS = {
    "first": (OLD_FIRST_CONFIG, OLD_FIRST_WEIGHTS, [[2, 0, 1, 1, 0], [2, 1, 0, 0, 1], [2, 1, 1, 1, 1]], [
        [-2.4522398, -2.4522452, -2.4522407, -2.4522407, -2.4522405],
        [-2.4447408, -2.4447696, -2.444747, -2.444747, -2.4447422],
        [-2.4451866, -2.4451904, -2.4451871, -2.4451871, -2.4451871]]),
    "pairs": (OLD_PAIRS_CONFIG, OLD_PAIRS_WEIGHTS, [[0, 1, 2, 1], [2, 2, 0, 1]], [
        [-1.5763391, -1.8302641, -1.506047, -1.9015981], [-1.5482498, -1.6075577, -1.5079573, -1.900798]]),
}


def _old_weights(shapes: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    state = {}
    for i, (key, shape) in enumerate(sorted(shapes.items())):
        x = torch.sin(torch.arange(math.prod(shape), dtype=torch.float64) * 0.37 + i) * 0.5
        state[key] = (1.0 + 0.1 * x if key.endswith(".w") else x).reshape(shape).float()
    return state


def write_old_checkpoint(directory: Path, which: str) -> Path:
    config, shapes, _, _ = OLD_CHECKPOINTS[which]
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    torch.save(_old_weights(shapes), directory / "weights.pt")
    return directory


@pytest.mark.parametrize("which", sorted(OLD_CHECKPOINTS))
def test_old_checkpoint_loads_and_computes_as_before(tmp_path, which):
    from exactlens.model import ExactTransformer

    _, shapes, tokens, expected = OLD_CHECKPOINTS[which]
    model = ExactTransformer.load(write_old_checkpoint(tmp_path / which, which))
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == shapes
    with torch.no_grad():
        out = model(torch.tensor(tokens))[..., 0]
    torch.testing.assert_close(out, torch.tensor(expected), rtol=0, atol=2e-6)


def test_old_checkpoint_through_the_commands(capsys, tmp_path):
    first = write_old_checkpoint(tmp_path / "first", "first")
    result = run_cli(capsys, ["diff", str(first), "--against", "first", "--lengths", "2,4", "--strings", "4",
                              "--json"])
    assert missing_fields(result, OLD_JSON_PATHS["diff"], skip=DIFF_SKIP + ("trained/name",)) == []
    assert result["settings"]["lengths"] == [2, 4]
    result = run_cli(capsys, ["hull", str(first), "--json"])
    assert len(result["layers"]) == 2
    pairs = write_old_checkpoint(tmp_path / "pairs", "pairs")
    result = run_cli(capsys, ["pairlogic", "--checkpoint", str(pairs), "--batch", "8", "--json"])
    assert result["runs"][0]["checkpoint"] == str(pairs) and result["runs"][0]["verdict"]


def test_saved_config_keeps_old_keys(tmp_path):
    from exactlens.constructions import build

    saved = json.loads((build("first").save(tmp_path / "m") / "config.json").read_text())
    assert set(OLD_FIRST_CONFIG) <= set(saved)
