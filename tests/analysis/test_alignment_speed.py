"""The alignment's speed-ups pin their behaviour (issue 41, "any program, any size"): each stacked pass starting
at its own sites' layer gives the fits of passes that all start at the earliest layer, and a task variable's values
are computed once per run and words. Their timings are benchmarks/'s, not these tests'."""

from __future__ import annotations

import pytest
import torch

from exactlens import tasks
from exactlens.analysis.diff import diff
from exactlens.analysis.diff.alignment import fit, patch
from exactlens.analysis.diff.alignment.variables import remembered, task_variables
from exactlens.analysis.diff.runs import make_side, run_both
from exactlens.constructions import build
from exactlens.model import ExactConfig, ExactTransformer

SMALL = dict(parts=("alignment",), das_max_dim=2, das_steps=30, alignment_pairs=16, untrained_baseline=True)
KEY = ("variable", "site", "position", "position_index", "dim", "iia_changed", "changed_pairs", "verdict",
       "random_iia_changed", "untrained_iia_changed", "validation_iia")


def test_layer_passes_split_at_layer_changes_and_size() -> None:
    assert fit.layer_passes([0, 0, 0, 1, 1, 2], 10) == [(0, 3), (3, 5), (5, 6)]
    assert fit.layer_passes([0, 0, 0, 1, 1, 2], 2) == [(0, 2), (2, 3), (3, 5), (5, 6)]
    assert fit.layer_passes([1, 0, 1], 5) == [(0, 1), (1, 2), (2, 3)]  # unsorted: never two layers in one pass
    assert fit.layer_passes([], 4) == []


def test_passes_from_each_sites_layer_give_the_same_alignment(monkeypatch: pytest.MonkeyPatch) -> None:
    """first-ln-eta (3 layers) against itself: the fits run with every pass starting at its sites' own layer (the
    default) and with every pass of a batch starting at the batch's earliest layer (as before: layers 0 and 1
    from layer 0, the last layer's sites apart) give the same rows and verdicts; only the default starts a
    training pass at layer 1 (the copies patched in layer 1 skip layer 0)."""
    starts: list[int] = []
    outputs = patch.Patcher._outputs

    def counted(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        if torch.is_grad_enabled():  # a training pass (scores run without gradients)
            starts.append(self.start)
        return outputs(self, *args, **kwargs)

    monkeypatch.setattr(patch.Patcher, "_outputs", counted)
    kwargs = dict(lengths=[3, 4, 5], **SMALL)
    own = diff("first-ln-eta", "first-ln-eta", **kwargs)
    assert {0, 1, 2} <= set(starts), sorted(set(starts))
    starts.clear()
    monkeypatch.setattr(fit, "LAYER_PASSES", False)
    earliest = diff("first-ln-eta", "first-ln-eta", **kwargs)
    assert set(starts) == {0, 2}, sorted(set(starts))
    assert [[r[k] for k in KEY] for r in own["alignment"]] == [[r[k] for k in KEY] for r in earliest["alignment"]]
    assert own["summary"]["verdicts"] == earliest["summary"]["verdicts"]


def test_a_layers_output_is_patched_at_the_next_layers_input() -> None:
    """A patch at layer L's hook_resid_post runs from layer L + 1 (its hook_resid_pre, the same tensor) and gives
    the outputs of the same patch applied at hook_resid_post in a forward pass from the embedding; the last
    layer's output stays where it is."""
    model = build("first-ln-eta", dtype="float64")
    task = tasks.of_model(model)
    side = make_side(model, {}, tasks.reader(model), model.cfg.readout_position, True)
    run = run_both(task, [4], 16, 0, side, side)[0]
    assert patch.hook_point(side, "blocks.2.hook_resid_post") == "blocks.2.hook_resid_post"
    base, source = torch.arange(0, 8), torch.arange(8, 16)
    q, _ = torch.linalg.qr(torch.randn(model.cfg.d_model, 2, generator=torch.Generator().manual_seed(0),
                                       dtype=torch.float64))
    n_pos = run.n_positions[base]
    unpatched = model.select_readout(model(run.tokens[base]), n_pos).double()
    for layer in (0, 1):
        site = f"blocks.{layer}.hook_resid_post"
        patcher = patch.Patcher(side, site)
        assert patcher.start == layer + 1 and patch.hook_point(side, site) == f"blocks.{layer + 1}.hook_resid_pre"
        mask = patch.patch_masks(side, run, [patch.Fit(0, 2, "all")])
        src = patcher.prepare(run, source)["site"]
        for projector in (q @ q.T, torch.eye(model.cfg.d_model, dtype=torch.float64)):  # a subspace; everything
            got = patcher.outputs(patcher.prepare(run, base), src, projector[None], mask, n_pos)

            def swap(act, hook, src=src, projector=projector):  # noqa: ANN001, ANN202
                return act + (src - act) @ projector

            want = model.select_readout(model.run_with_hooks(run.tokens[base], fwd_hooks=[(site, swap)]), n_pos)
            assert torch.allclose(got, want.double(), atol=1e-12), (site, (got - want).abs().max())
        assert not torch.allclose(got, unpatched)  # swapping the whole stream moves the answers (first symbols differ)


def test_task_values_are_computed_once_per_run_and_words() -> None:
    """The remembered values equal a fresh computation, for each run and set of words, and the computation runs
    once per (run, words)."""
    model = build("first", dtype="float64")
    task = tasks.of_model(model)
    side = make_side(model, {}, tasks.reader(model), model.cfg.readout_position, True)
    runs = run_both(task, [3, 4], 16, 0, side, side)
    calls: list[int] = []

    def values(run, b):  # noqa: ANN001, ANN202
        calls.append(run.length)
        return run.ids[b].double() * 2

    memo = remembered(values)
    for run in runs:
        for b in (torch.tensor([0, 1, 2]), torch.tensor([2, 1]), torch.tensor([0, 1, 2])):
            assert torch.equal(memo(run, b), values(run, b))
    assert len(calls) == 2 * 2 + 2 * 3  # memo: twice per run (two distinct word sets); direct: three times per run
    variable = task_variables(task)[0]
    b = torch.arange(len(runs[0].ids))
    assert variable.values(runs[0], b) is variable.values(runs[0], b)  # task variables are remembered


def test_tracr_counterfactuals_are_evaluated_once_per_word_and_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """A tracr task's SOp values and its outputs with an SOp set are kept per word (and setting): asked again,
    they equal a fresh task's, without evaluating the program again."""
    pytest.importorskip("tracr")
    from exactlens.interop.tracr import task as tracr_task

    evaluations: list[int] = []
    evaluation = tracr_task.Evaluation

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        evaluations.append(1)
        return evaluation(*args, **kwargs)

    monkeypatch.setattr(tracr_task, "Evaluation", counted)
    task = tasks.get("tracr-sort")
    ids = task.all_words(3)
    gen = torch.Generator().manual_seed(0)
    base, source = (ids[torch.randint(len(ids), (40,), generator=gen)] for _ in range(2))
    variables = [v for v in task.variables() if v.interventional]
    first = [v.counterfactual(base, source) for v in variables]
    n = len(evaluations)
    again = [v.counterfactual(base, source) for v in variables]
    assert len(evaluations) == n and n > 0  # every value and output was kept
    fresh = tasks.get("tracr-sort")
    assert fresh is not task
    fresh_cf = [v.counterfactual(base, source) for v in fresh.variables() if v.interventional]
    for a, b, c in zip(first, again, fresh_cf, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    assert len(evaluations) > n  # the fresh task evaluated the program itself


def test_inert_candidates_keep_their_start_without_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """first-ln-eta (3 layers) has an FFN in layer 1 and an attention in layer 2 that write zero on every input
    (weights and biases 0): at blocks.1.hook_mlp_out and blocks.2.hook_attn_out every pair's source equals its
    base, so a patch there moves nothing whatever the subspace (as at [CLS] in the first layer, for fits at the
    readout position). Their candidates are found inert and keep their
    starts without Adam steps, and their scores take the unpatched copy's decisions without running; the diff's
    rows and verdicts are those of running every copy (SKIP_INERT and SKIP_UNMOVED False), with fewer copies run
    in training and in scoring."""
    from exactlens.analysis.diff.alignment import score

    found: list[str] = []
    copies = {True: 0, False: 0}  # copies run with and without gradients (training, scoring)
    inert = fit.inert_candidates
    outputs = patch.Patcher._outputs

    def recorded(side, patchers, cand_fits, rows_of, train, caches):  # noqa: ANN001, ANN202
        got = inert(side, patchers, cand_fits, rows_of, train, caches)
        found.extend(patchers[rows_of[c]].site for c in got)
        return got

    def counted(self, base, source, projector, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        copies[torch.is_grad_enabled()] += projector.shape[0]
        return outputs(self, base, source, projector, *args, **kwargs)

    monkeypatch.setattr(fit, "inert_candidates", recorded)
    monkeypatch.setattr(patch.Patcher, "_outputs", counted)
    kwargs = dict(lengths=[3, 4, 5], **SMALL)
    skipped = diff("first-ln-eta", "first-ln-eta", **kwargs)
    # and the readout cells of the first layer's sites: [CLS] holds the same before anything moves it there
    assert {"blocks.1.hook_mlp_out", "blocks.2.hook_attn_out"} <= set(found), sorted(set(found))
    fewer = dict(copies)
    copies.update({True: 0, False: 0})
    monkeypatch.setattr(fit, "SKIP_INERT", False)
    monkeypatch.setattr(score, "SKIP_UNMOVED", False)
    every = diff("first-ln-eta", "first-ln-eta", **kwargs)
    assert fewer[True] < copies[True] and fewer[False] < copies[False], (fewer, copies)
    key = (*KEY, "init", "training_iia_changed", "illusion", "random_iia_p95", "iia", "do_nothing_iia")
    assert [[r.get(k) for k in key] for r in skipped["alignment"]] == [[r.get(k) for k in key]
                                                                        for r in every["alignment"]]
    assert skipped["summary"]["verdicts"] == every["summary"]["verdicts"]


def test_twin_sites_are_found_from_the_weights() -> None:
    """A residual site after a component that writes zero whatever its input (and no post-norm between) holds the
    site before it on every input: FIRST's second FFN; palindrome-hash's zero attention layers (pre-norm) and FFNs,
    chained to the earliest site; none across a post-norm (first-ln-eta's zero layer-2 attention)."""
    def twins(name: str) -> dict[str, str]:
        model = build(name, dtype="float64")
        side = make_side(model, {}, tasks.reader(model), model.cfg.readout_position, True)
        return patch.twin_sites(side, patch.alignment_sites(side))

    assert twins("first") == {"blocks.1.hook_resid_post": "blocks.1.hook_resid_mid"}
    assert twins("first-ln-eta") == {}
    model = build("first", dtype="float64")  # without the site between, a changed stream breaks the chain
    side = make_side(model, {}, tasks.reader(model), model.cfg.readout_position, True)
    fewer = [s for s in patch.alignment_sites(side) if s != "blocks.1.hook_resid_mid"]
    assert patch.twin_sites(side, fewer) == {}  # layer 1's attention writes between resid_post 0 and 1
    assert twins("palindrome-hash") == {
        "blocks.0.hook_resid_post": "blocks.0.hook_resid_mid", "blocks.1.hook_resid_post": "blocks.1.hook_resid_mid",
        "blocks.2.hook_resid_mid": "blocks.1.hook_resid_mid", "blocks.3.hook_resid_mid": "blocks.2.hook_resid_post",
        "blocks.5.hook_resid_post": "blocks.5.hook_resid_mid"}
    model = build("palindrome-hash", dtype="float64")
    task = tasks.of_model(model)
    ids = task.sample(6, 8, torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(task.encode(ids).tokens)
    for site, twin in twins("palindrome-hash").items():  # the same tensor on these words too
        assert torch.equal(cache[site], cache[twin]), site


def test_a_twin_site_takes_its_twins_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    """FIRST against itself: blocks.1.hook_resid_post (after a zero FFN) takes the fits, scores and random
    baseline of blocks.1.hook_resid_mid, running no copy of its own; every other site's rows are those of fitting
    every site (SHARE_TWINS False: the generator's draws are the same), and so are the verdict lines."""
    from exactlens.analysis.diff.alignment import table

    sites: list[str] = []
    outputs = patch.Patcher._outputs

    def counted(self, base, source, projector, mask, n_positions, row_sites=None):  # noqa: ANN001, ANN202
        if torch.is_grad_enabled():
            sites.extend(row_sites or [self.site] * projector.shape[0])
        return outputs(self, base, source, projector, mask, n_positions, row_sites)

    monkeypatch.setattr(patch.Patcher, "_outputs", counted)
    kwargs = dict(lengths=[3, 4, 5], **{**SMALL, "untrained_baseline": False})  # the untrained copy has no twins
    shared = diff("first", "first", **kwargs)
    assert "blocks.1.hook_resid_post" not in sites and "blocks.1.hook_resid_mid" in sites
    sites.clear()
    monkeypatch.setattr(table, "SHARE_TWINS", False)
    every = diff("first", "first", **kwargs)
    assert "blocks.1.hook_resid_post" in sites
    twin, origin = "blocks.1.hook_resid_post", "blocks.1.hook_resid_mid"
    key = (*KEY, "init", "training_iia_changed", "random_iia_p95")
    rows = {(r["site"], r["variable"], r["test"]): [r.get(k) for k in key] for r in shared["alignment"]}
    old = {(r["site"], r["variable"], r["test"]): [r.get(k) for k in key] for r in every["alignment"]}
    assert rows.keys() == old.keys()
    for (site, variable, test), values in rows.items():
        if site == twin:
            assert values[2:] == rows[(origin, variable, test)][2:], variable  # all but the site
        else:
            assert values == old[(site, variable, test)], (site, variable)
    assert {k: v["verdict"] for k, v in shared["summary"]["verdicts"].items()} == {
        k: v["verdict"] for k, v in every["summary"]["verdicts"].items()}


def _widened(name: str, extra: int) -> ExactTransformer:
    """The construction with ``extra`` idle FFN units per layer (random input weights, zero output weights)."""
    model = build(name, dtype="float64")
    wide = ExactTransformer(ExactConfig.from_dict({**model.cfg.to_dict(), "d_mlp": model.cfg.d_mlp + extra}))
    state = dict(model.state_dict())
    gen = torch.Generator().manual_seed(0)
    for layer in range(model.cfg.n_layers):
        p = f"blocks.{layer}.mlp."
        state[p + "W_in"] = torch.cat([state[p + "W_in"], torch.randn(model.cfg.d_model, extra, generator=gen,
                                                                        dtype=torch.float64)], 1)
        state[p + "b_in"] = torch.cat([state[p + "b_in"], torch.randn(extra, generator=gen, dtype=torch.float64)])
        state[p + "W_out"] = torch.cat([state[p + "W_out"], torch.zeros(extra, model.cfg.d_model,
                                                                         dtype=torch.float64)])
    wide.load_state_dict(state)
    return wide.eval()


def test_idle_units_are_dropped_with_the_same_alignment(monkeypatch: pytest.MonkeyPatch) -> None:
    """tracr-hist with 40 idle FFN units added: the alignment runs the model without them (every patched forward
    is that copy's) and its rows and verdicts are those of running them all (DROP_IDLE_UNITS False); the caller's
    model keeps its units."""
    from exactlens.analysis.diff.alignment import table

    wide = _widened("tracr-hist", 40)
    widths: set[int] = set()
    outputs = patch.Patcher._outputs

    def seen(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        widths.add(self.model.cfg.d_mlp)
        return outputs(self, *args, **kwargs)

    monkeypatch.setattr(patch.Patcher, "_outputs", seen)
    kwargs = dict(lengths=[3, 4], **{**SMALL, "untrained_baseline": False})
    lean = diff(wide, "tracr-hist", **kwargs)
    assert widths == {12} and wide.cfg.d_mlp == 52
    widths.clear()
    monkeypatch.setattr(table, "DROP_IDLE_UNITS", False)
    full = diff(wide, "tracr-hist", **kwargs)
    assert widths == {52}
    assert [[r.get(k) for k in KEY] for r in lean["alignment"]] == [[r.get(k) for k in KEY] for r in full["alignment"]]
    assert lean["summary"]["verdicts"] == full["summary"]["verdicts"]
