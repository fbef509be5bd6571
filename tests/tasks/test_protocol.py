"""The task protocol (exactlens.tasks.base, kinds, decisions, variables, registry), checked for EVERY
registered task, plug-in tasks included: ``tasks.names()`` is read at collection time, so a new task is
covered automatically (with its default parameters unless PARAMS gives smaller ones).

1. the plain-Python reference ``target(word)`` against the vectorized ``targets(ids)``;
2. kinds: target shapes and dtypes, readouts, spec round trips;
3. encoding: specials, vocab, round trips, and clear errors on bad input;
4. sampling: seeded determinism, shapes, empty samples, held-out samples, both classes where promised;
5. decide / loss / score / margin with outputs that encode the true (and then wrong) answers;
6. causal variables: identity interventions, hand-derived counterfactuals, shapes;
7. the registry's errors.

Expected values are derived by hand (plain Python below), never with the function under test.
"""

from __future__ import annotations

import inspect
import json
import math
import random
import re
from collections import Counter
from types import SimpleNamespace

import pytest
import torch

from exactlens import tasks
from exactlens.errors import ExactLensError
from exactlens.tasks import CLS, EOS, KINDS, Reader, kinds

# Small parameters for tasks whose defaults are large, and extra cases for variables that exist only for
# some parameters (Dyck's "depth" needs k = 1). Tasks not listed run with their defaults.
PARAMS: dict[str, list[dict]] = {
    "majority": [{"num_classes": 3}, {"num_classes": 3, "allow_ties": True}],
    "dyck": [{"k": 2, "max_depth": 2}, {"k": 1, "max_depth": 2}, {"k": 1}],
    "induction-recent": [{"num_symbols": 3}],
    "induction-frequent": [{"num_symbols": 3}],
    "pairs": [{"categories": 3, "q": "normal", "seed": 1}, {"categories": 3, "q": "code"}],
}
NAMES = tasks.names()
CASES = [(name, params) for name in NAMES for params in PARAMS.get(name, [{}])]
BIG = 20.0  # logit size that encodes a confident answer


def case_id(case: tuple[str, dict]) -> str:
    name, params = case
    return name + "".join(f"-{k}={v}" for k, v in params.items())


@pytest.fixture(params=CASES, ids=[case_id(c) for c in CASES])
def task(request):
    name, params = request.param
    return tasks.get(name, **params)


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def per_position(task) -> bool:
    return task.kind in ("prediction", "regression")


def short_lengths(task) -> list[int]:
    """Lengths (from min_length) whose words can all be enumerated cheaply."""
    k, low = len(task.alphabet), task.min_length
    top = task.max_length if task.max_length is not None else low + 8
    lengths = [n for n in range(low, top + 1) if k**n <= 4096]
    return lengths or ([low] if k**low <= 10_000 else [])


def long_length(task) -> int:
    n = max(task.min_length, 11)
    return n if task.max_length is None else min(n, task.max_length)


def mid_length(task) -> int:
    n = max(task.min_length, 6)
    return n if task.max_length is None else min(n, task.max_length)


def word_batches(task) -> list[torch.Tensor]:
    """Every word of the short lengths, and random words of a longer length."""
    out = [task.all_words(n) for n in short_lengths(task)]
    out.append(task.sample(long_length(task), 64, gen(7)))
    return out


def as_symbols(task, row) -> list[str]:
    return [task.alphabet[int(i)] for i in row]


def lengths_of(ids: torch.Tensor) -> torch.Tensor:
    return torch.full((ids.shape[0],), ids.shape[1], dtype=torch.long)


def absent_symbol(task) -> str:
    return next(s for s in ("☃", "§", "z", "~", "\x00", "xx") if s not in task.alphabet)


# ---- 1. reference vs vectorized targets ----------------------------------------------------------------------------


def reference(task, ids: torch.Tensor) -> tuple[list, list | None]:
    """task.target of every word: (values, None) per word, or (values, has-target mask) per position."""
    values, mask = [], []
    for row in ids.tolist():
        answer = task.target(as_symbols(task, row))
        if not per_position(task):
            values.append(answer)
            continue
        assert isinstance(answer, list) and len(answer) == len(row), f"{task}: target of {row} is {answer!r}"
        mask.append([a is not None for a in answer])
        values.append([0 if a is None else a for a in answer])
    return values, (mask if per_position(task) else None)


def test_reference_target_matches_vectorized_targets(task):
    for ids in word_batches(task):
        values, mask = reference(task, ids)
        got = task.targets(ids)
        if task.kind == "membership":
            assert all(isinstance(v, bool) for v in values)
            assert got.tolist() == values
        elif task.kind == "classification":
            assert all(isinstance(v, int) for v in values)
            assert got.tolist() == values
        else:
            valid = task.target_mask(lengths_of(ids), ids.shape[1], got)
            assert valid.tolist() == mask, f"{task}: target_mask disagrees with the reference's None entries"
            expected = torch.tensor(values, dtype=got.dtype).reshape(ids.shape)
            assert torch.equal(torch.where(valid, got, 0), torch.where(valid, expected, 0))


def test_targets_of_mixed_lengths_match_reference(task):
    lengths = sorted({task.min_length, mid_length(task), long_length(task)})
    words = [as_symbols(task, row) for n in lengths for row in task.sample(n, 3, gen(n)).tolist()]
    got = task.targets_of(words)
    assert got.shape[0] == len(words)
    for row, word in zip(got.tolist(), words, strict=True):
        answer = task.target(word)
        if per_position(task):
            assert len(row) == max(lengths)
            for i, a in enumerate(answer):
                if a is not None:
                    assert row[i] == a
        else:
            assert row == answer


# ---- 2. kinds --------------------------------------------------------------------------------------------------


def test_readouts_table():
    assert set(kinds.READOUTS) == set(KINDS) == {"membership", "classification", "prediction", "regression"}
    assert kinds.READOUTS == {
        "membership": "sigmoid",
        "classification": "logits",
        "prediction": "per_position",
        "regression": "per_position",
    }
    with pytest.raises(ExactLensError, match="unknown.*membership, classification, prediction, regression"):
        kinds.check_kind("ranking")


def test_kind_and_target_layout(task):
    assert task.kind in KINDS
    assert task.readout == kinds.READOUTS[task.kind]
    n = mid_length(task)
    ids = task.sample(n, 16, gen(1))
    got = task.targets(ids)
    if task.kind == "membership":
        assert task.classes == ("reject", "accept") and task.n_outputs == 1
        assert got.shape == (16,) and got.dtype == torch.bool
    elif task.kind == "classification":
        assert task.n_outputs == len(task.classes) >= 2
        assert got.shape == (16,) and not got.is_floating_point() and got.dtype != torch.bool
        assert ((got >= 0) & (got < len(task.classes))).all()
    elif task.kind == "prediction":
        assert task.n_outputs == len(task.classes) >= 2
        assert got.shape == (16, n) and not got.is_floating_point() and got.dtype != torch.bool
        valid = task.target_mask(lengths_of(ids), n, got)
        assert ((got[valid] >= 0) & (got[valid] < len(task.classes))).all()
    else:
        assert task.n_outputs == 1 and task.classes == ("value",)
        assert got.shape == (16, n) and got.is_floating_point()
    if per_position(task):
        assert task.target_mask(lengths_of(ids), n).any(dim=1).all(), "a word of a valid length has no target"


def test_spec_round_trip(task):
    spec = json.loads(json.dumps(task.spec()))  # JSON values only
    assert spec["name"] == task.name and spec["kind"] == task.kind
    again = tasks.from_spec(spec)
    assert type(again) is type(task) and again == task and hash(again) == hash(task)
    assert again.alphabet == task.alphabet and again.vocab == task.vocab
    wrong = next(k for k in KINDS if k != task.kind)
    with pytest.raises(ExactLensError, match=f"is a {task.kind} task.*{wrong}"):
        tasks.from_spec({**spec, "kind": wrong})


# ---- 3. encoding -----------------------------------------------------------------------------------------------


def test_vocab_and_specials(task):
    specials = ([task.cls_token] if task.use_cls else []) + ([EOS] if task.use_eos else [])
    assert task.vocab == tuple(task.alphabet) + tuple(specials)
    assert task.n_specials == len(specials)
    assert len(set(task.vocab)) == len(task.vocab)
    assert task.cls_token not in task.alphabet and EOS not in task.alphabet
    assert task.symbol_offset == (1 if task.use_cls else 0)


def test_encode_adds_the_declared_specials(task):
    n = mid_length(task)
    ids = task.sample(n, 8, gen(2))
    batch = task.encode(ids)
    assert len(batch) == 8 and batch.tokens.dtype == torch.long
    assert batch.tokens.shape == (8, n + task.n_specials)
    assert batch.n_positions.tolist() == [n + task.n_specials] * 8
    for tokens, row in zip(batch.tokens.tolist(), ids.tolist(), strict=True):
        names = [task.vocab[t] for t in tokens]
        expected = ([task.cls_token] if task.use_cls else []) + as_symbols(task, row) + ([EOS] if task.use_eos else [])
        assert names == expected


def test_tokenize_pads_words_of_different_lengths(task):
    lengths = [mid_length(task), task.min_length, long_length(task)]
    words = [as_symbols(task, task.sample(n, 1, gen(n))[0].tolist()) for n in lengths]
    batch = task.tokenize(words)
    assert batch.n_positions.tolist() == [n + task.n_specials for n in lengths]
    assert batch.tokens.shape == (3, max(lengths) + task.n_specials)
    for tokens, n_pos, word in zip(batch.tokens.tolist(), batch.n_positions.tolist(), words, strict=True):
        expected = ([task.cls_token] if task.use_cls else []) + word + ([EOS] if task.use_eos else [])
        assert [task.vocab[t] for t in tokens[:n_pos]] == expected


def test_decode_round_trip(task):
    ids = task.sample(mid_length(task), 8, gen(3))
    if all(len(s) == 1 for s in task.alphabet):  # words are plain strings
        words = task.decode(ids)
        assert words == ["".join(as_symbols(task, row)) for row in ids.tolist()]
        assert torch.equal(task.ids(words), ids)
    assert torch.equal(task.ids([as_symbols(task, row) for row in ids.tolist()]), ids)


def test_bad_words_raise(task):
    a = task.alphabet[0]
    bad = absent_symbol(task)
    with pytest.raises(ExactLensError, match="not in the alphabet.*" + re.escape(repr(task.alphabet[-1]))):
        task.ids([[a, bad, a]])
    with pytest.raises(ExactLensError, match="not in the alphabet"):
        task.tokenize([[a, a], [bad]])
    for special in (CLS, EOS):
        with pytest.raises(ExactLensError, match=r"\[(CLS|EOS)\].*not in the alphabet.*special tokens"):
            task.ids([[special] + [a] * max(task.min_length, 1)])
        with pytest.raises(ExactLensError, match="not in the alphabet"):
            task.target([a] * task.min_length + [special])
    with pytest.raises(ExactLensError, match="one length"):
        task.ids([[a], [a, a]])
    with pytest.raises(ExactLensError, match="wrap a single word"):
        task.ids("".join([a, a]))
    with pytest.raises(ExactLensError, match="empty batch"):
        task.ids([])


def test_bad_symbol_ids_raise(task):
    n = max(task.min_length, 2)
    good = torch.zeros(2, n, dtype=torch.long)
    for wrong in (good[0], good.unsqueeze(0), good.tolist()):
        with pytest.raises(ExactLensError, match=r"symbol ids must be a tensor \[batch, length\]"):
            task.encode(wrong)
    for value in (len(task.alphabet), -1):
        with pytest.raises(ExactLensError, match=rf"must lie in \[0, {len(task.alphabet)}\)"):
            task.encode(torch.full((2, n), value, dtype=torch.long))
    with pytest.raises(ExactLensError, match="empty batch"):
        task.encode(torch.zeros(0, n, dtype=torch.long))


def test_lengths_below_the_minimum_raise(task):
    low = task.min_length - 1
    for method in (task.sample, task.sample_held_out):
        with pytest.raises(ExactLensError, match=f"length {low} is below the minimum {task.min_length}"):
            method(low, 4, gen())
    with pytest.raises(ExactLensError, match="below the minimum"):
        task.all_words(low)
    with pytest.raises(ExactLensError, match="below the minimum"):
        task.words(low, 4, gen())
    with pytest.raises(ExactLensError, match="length must be an integer"):
        task.sample(float(mid_length(task)), 4, gen())


def test_reference_below_the_minimum_raises_or_keeps_the_length(task):
    """Below min_length the reference either refuses the word or still answers one entry per symbol."""
    if task.min_length == 0:
        pytest.skip("defined for every length")
    for n in range(task.min_length):
        word = [task.alphabet[0]] * n
        try:
            answer = task.target(word)
        except ExactLensError:
            continue
        if per_position(task):
            assert len(answer) == n, f"{task}: target of a word of length {n} is {answer!r}"


# ---- 4. sampling -----------------------------------------------------------------------------------------------


def test_sampling_is_seeded_and_well_shaped(task):
    n = mid_length(task)
    for method in (task.sample, task.sample_held_out):
        first = method(n, 32, gen(5))
        assert first.shape == (32, n) and first.dtype == torch.long
        assert ((first >= 0) & (first < len(task.alphabet))).all()
        assert torch.equal(first, method(n, 32, gen(5)))
        assert not torch.equal(first, method(n, 32, gen(6)))
    for length in (task.min_length, n):
        for method in (task.sample, task.sample_held_out):
            empty = method(length, 0, gen())
            assert empty.shape == (0, length)


@pytest.mark.parametrize("count", [-1, 2.5, "3"])
def test_bad_counts_raise(task, count):
    with pytest.raises(ExactLensError, match="count must be an integer >= 0"):
        task.sample(mid_length(task), count, gen())


def test_words_is_exhaustive_when_small(task):
    n = task.min_length
    k = len(task.alphabet)
    ids, exhaustive = task.words(n, 5, gen(), exhaustive_limit=k**n)
    assert exhaustive and ids.shape == (k**n, n)
    assert len({tuple(r) for r in ids.tolist()}) == k**n  # every word once
    ids, exhaustive = task.words(n + 1, 5, gen(), exhaustive_limit=k**n)
    assert not exhaustive and ids.shape == (5, n + 1)


# Membership tasks whose sampler's docstring promises both classes at an even length >= 2:
# uniform bits (parity, first), Poisson(1.5) ones (one), half palindromes / half one-flip
# negatives (palindrome), half uniform members (dyck).
BOTH_CLASSES = {"parity", "first", "one", "palindrome", "dyck"}


def test_membership_samples_hold_both_classes(task):
    if task.name not in BOTH_CLASSES:
        pytest.skip(f"{task.name}: no both-classes promise ({task.kind})")
    n = max(task.min_length, 8)
    words = task.sample(n, 200, gen(11))
    labels = [task.contains(as_symbols(task, row)) for row in words.tolist()]
    assert 0 < sum(labels) < len(labels)
    if task.name == "dyck":  # "half are uniform over the members of the length"
        assert sum(labels) >= 100


def test_membership_samples_have_the_promised_law():
    first = tasks.get("first").sample(6, 4000, gen(3))  # uniform bits
    assert abs(first.double().mean() - 0.5) < 0.03
    palindrome = tasks.get("palindrome")  # a palindrome or a one-flip negative, each with probability 1/2
    words = palindrome.sample(9, 2000, gen(4))
    mismatched = [sum(r[i] != r[8 - i] for i in range(4)) for r in words.tolist()]
    assert set(mismatched) == {0, 1}
    assert abs(sum(m == 0 for m in mismatched) / 2000 - 0.5) < 0.05
    one = tasks.get("one").sample(12, 4000, gen(5))  # Poisson(1.5) ones (12 >> 1.5: barely truncated)
    counts = Counter(one.sum(1).tolist())
    for k in range(4):
        expected = math.exp(-1.5) * 1.5**k / math.factorial(k)
        assert abs(counts[k] / 4000 - expected) < 0.03


def test_held_out_characters_come_from_the_validation_text():
    if "stdlib-chars" not in NAMES:
        pytest.skip("the brody plug-in is not installed")
    task = tasks.get("stdlib-chars")
    n = 8

    def inside(windows, text):
        starts = text.unfold(0, n, 1)  # every window of the text
        return (windows[:, None, :] == starts[None, :, :]).all(-1).any(-1)

    held = task.sample_held_out(n, 20, gen(1))
    train = task.sample(n, 20, gen(1))
    assert inside(held, task.corpus.validation_ids).all()
    assert inside(train, task.corpus.train_ids).all()


# ---- 5. decide / loss / score ----------------------------------------------------------------------------------


def test_one_signature_everywhere(task):
    def names(fn):
        return list(inspect.signature(fn).parameters)

    assert names(task.decide) == ["outputs", "n_positions"]
    assert names(task.loss) == ["outputs", "targets", "n_positions"]
    assert names(task.score)[:3] == ["predictions", "targets", "n_positions"]
    reader = Reader(task, None)
    assert names(reader.decide) == names(reader.margin)[:2] == ["outputs", "n_positions"]
    assert names(reader.margin)[2:] == ["truth"]  # optional: leaves out undefined target positions


def encoded_outputs(task, targets: torch.Tensor, n_positions: torch.Tensor, layout: int = 0) -> torch.Tensor:
    """Standard readout outputs whose decision is ``targets``: +-BIG logits, BIG one-hot logits per word or per
    position, exact values; at positions without a target (specials, padding, masked symbols) outputs that
    would be wrong or far off if they were read."""
    g = gen(99)
    k = len(task.classes)
    if task.kind == "membership":
        logit = torch.where(targets, BIG, -BIG).double()
        return [logit, logit[:, None], torch.stack([-logit / 2, logit / 2], 1)][layout]
    if task.kind == "classification":
        return BIG * torch.nn.functional.one_hot(targets.long(), k).double()
    batch, width = targets.shape
    pos = int(n_positions.max())
    valid = task.target_mask(n_positions - task.n_specials, width, targets)
    if task.kind == "prediction":
        out = torch.randn(batch, pos, k, generator=g, dtype=torch.float64)
        for b, i in valid.nonzero().tolist():
            out[b, task.symbol_offset + i] = BIG * torch.nn.functional.one_hot(targets[b, i].long(), k)
        for b, i in (~valid).nonzero().tolist():  # a wrong answer, by a small gap
            if i < pos - task.symbol_offset:
                out[b, task.symbol_offset + i] = 0.5 * torch.nn.functional.one_hot((targets[b, i] + 1) % k, k)
        return out
    out = 1000 + torch.randn(batch, pos, generator=g, dtype=torch.float64)
    for b, i in valid.nonzero().tolist():
        out[b, task.symbol_offset + i] = targets[b, i].double()
    return out[..., None] if layout == 0 else out


def corrupted(task, outputs: torch.Tensor, targets: torch.Tensor, n_positions: torch.Tensor):
    """The outputs with one answer per word made wrong (a word without targets: none); also the
    positions changed [(b, i)]."""
    out = outputs.clone()
    k = len(task.classes)
    if task.kind == "membership":
        return -out, None
    if task.kind == "classification":
        return BIG * torch.nn.functional.one_hot((targets.long() + 1) % k, k).double(), None
    valid = task.target_mask(n_positions - task.n_specials, targets.shape[1], targets)
    changed = []
    for b in valid.any(1).nonzero()[:, 0].tolist():
        i = int(valid[b].nonzero()[0])
        p = task.symbol_offset + i
        if task.kind == "prediction":
            out[b, p] = BIG * torch.nn.functional.one_hot((targets[b, i].long() + 1) % k, k)
        else:
            out[b, p] = out[b, p] + 1.0
        changed.append((b, i))
    return out, changed


def batches_for_decisions(task):
    """(targets, n_positions) for words of one length (encode) and of mixed lengths (tokenize)."""
    ids = task.sample(mid_length(task), 12, gen(21))
    yield task.targets(ids), task.encode(ids).n_positions
    low = max(task.min_length, task.first_target + 1)  # every word has a target position (e.g. detect_pattern)
    words = [as_symbols(task, task.sample(n, 1, gen(n))[0].tolist())
             for n in (long_length(task), low, mid_length(task), min(low + 1, long_length(task)))]
    yield task.targets_of(words), task.tokenize(words).n_positions


@pytest.mark.parametrize("layout", [0, 1, 2])
def test_decide_score_loss_on_encoded_answers(task, layout):
    layouts = {"membership": 3, "regression": 2}.get(task.kind, 1)
    if layout >= layouts:
        pytest.skip(f"{task.kind} has {layouts} output layout(s)")
    for targets, n_positions in batches_for_decisions(task):
        outputs = encoded_outputs(task, targets, n_positions, layout)
        decided = task.decide(outputs, n_positions)
        assert torch.equal(Reader(task, None).decide(outputs, n_positions), decided)
        scores = task.score(decided, targets, n_positions)
        assert scores.correct.all() and scores.accuracy == 1.0
        right_loss = task.loss(outputs, targets, n_positions)
        assert right_loss.shape == (targets.shape[0],)
        margin = Reader(task, None).margin(outputs, n_positions, targets)
        has_target = torch.ones(targets.shape[0], dtype=torch.bool)
        if per_position(task):
            valid = task.target_mask(n_positions - task.n_specials, targets.shape[1], targets)
            has_target = valid.any(1)  # e.g. trend's one-symbol words: their only output is undefined
            assert decided.shape[:2] == targets.shape
            assert torch.equal(decided[valid].to(targets.dtype), targets[valid])
            assert scores.per_position_accuracy == 1.0
        else:
            assert torch.equal(decided, targets.to(decided.dtype))
        if task.kind == "regression":
            assert margin is None and (right_loss == 0).all()
        else:
            assert (right_loss < 1e-5).all()
            scored = margin.isfinite()  # a word without target positions (e.g. shorter than first_target) has none
            assert scored.any() and torch.allclose(margin[scored], torch.full_like(margin[scored], BIG))

        wrong, changed = corrupted(task, outputs, targets, n_positions)
        decided_wrong = task.decide(wrong, n_positions)
        wrong_scores = task.score(decided_wrong, targets, n_positions)
        assert not wrong_scores.correct[has_target].any() and wrong_scores.correct[~has_target].all()
        wrong_loss = task.loss(wrong, targets, n_positions)[has_target]
        if task.kind == "regression":  # squared error 1 at one of the word's target positions
            n_valid = task.target_mask(n_positions - task.n_specials, targets.shape[1], targets).sum(1)[has_target]
            assert torch.allclose(wrong_loss, 1.0 / n_valid.double())
        else:
            assert (wrong_loss > right_loss[has_target] + 0.1).all()
        if per_position(task):
            assert wrong_scores.per_position_accuracy < 1.0
            for b, i in changed:
                assert not wrong_scores.position_correct[b, i]


def test_regression_tolerance(task):
    if task.kind != "regression":
        pytest.skip("regression only")
    ids = task.sample(mid_length(task), 6, gen(2))
    targets, n_positions = task.targets(ids), task.encode(ids).n_positions
    values = task.decide(encoded_outputs(task, targets, n_positions), n_positions)
    near = values + 1e-3
    assert not task.score(near, targets, n_positions).correct.any()
    assert task.score(near, targets, n_positions, tolerance=1e-2).correct.all()


def test_bad_output_shapes_raise(task):
    ids = task.sample(mid_length(task), 4, gen(3))
    n_positions = task.encode(ids).n_positions
    pos, k = int(n_positions[0]), len(task.classes)
    bad = {
        "membership": [torch.zeros(4, 3), torch.zeros(4, pos, 2)],
        "classification": [torch.zeros(4, k + 1), torch.zeros(4, pos, k)],
        "prediction": [torch.zeros(4), torch.zeros(4, pos, k + 1), torch.zeros(4, k)],
        "regression": [torch.zeros(4), torch.zeros(4, pos, 2)],
    }[task.kind]
    for outputs in bad:
        with pytest.raises(ExactLensError, match=f"task {task.name!r}.*got (per-position )?outputs of shape"):
            task.decide(outputs, n_positions)
    if task.kind in ("membership", "classification"):
        with pytest.raises(ExactLensError, match="do not match targets"):
            task.score(torch.zeros(3, dtype=torch.long), task.targets(ids), n_positions)


def test_score_of_too_narrow_predictions_is_not_all_correct(task):
    """Predictions that stop before the last target position must not score every word correct."""
    if not per_position(task):
        pytest.skip("per-position kinds only")
    ids = task.sample(mid_length(task), 4, gen(8))
    targets, n_positions = task.targets(ids), task.encode(ids).n_positions
    last = int(task.target_mask(lengths_of(ids), ids.shape[1], targets).nonzero()[:, 1].max())
    narrow = targets[:, :last]  # right wherever it answers, but the last target position is missing
    try:
        scores = task.score(narrow, targets, n_positions)
    except ExactLensError:
        return
    assert not scores.correct.all()


def test_reader_of_a_model_reads_its_task(task):
    model = SimpleNamespace(cfg=SimpleNamespace(task=task.spec(), decision_rule=None, model_name="m"))
    reader = tasks.reader(model)
    assert reader.task == task and reader.rule is None
    assert reader.name == f"standard {task.kind}" and reader.has_logits == (task.kind != "regression")
    assert tasks.reader(SimpleNamespace(cfg=SimpleNamespace(task=None, decision_rule=None)), task).task is task
    with pytest.raises(ExactLensError, match="records no task"):
        tasks.reader(SimpleNamespace(cfg=SimpleNamespace(task=None, decision_rule=None, model_name="m")))


def test_chars_task_with_modules_is_hashable():
    if "stdlib-chars" not in NAMES:
        pytest.skip("the brody plug-in is not installed")
    from exactlens.papers.brody.corpus import STDLIB_MODULES

    task = tasks.get("stdlib-chars", modules=list(STDLIB_MODULES[:-1]))
    assert hash(task) == hash(tasks.from_spec(json.loads(json.dumps(task.spec()))))


# ---- 6. causal variables ---------------------------------------------------------------------------------------
# Every registered task has variables; stdlib-chars's only one ("previous character") has no intervene
# (its answer does not depend on it), so only compute() and the shapes are checked there.


def variable_cases():
    out = []
    for name, params in CASES:
        for var in tasks.get(name, **params).variables():
            out.append(pytest.param(name, params, var.name, id=f"{case_id((name, params))}:{var.name}"))
    return out


VARIABLES = variable_cases()


def test_every_task_has_variables():
    for name, params in CASES:
        assert tasks.get(name, **params).variables(), f"{name} has no causal variables"


@pytest.mark.parametrize(("name", "params", "variable"), VARIABLES)
def test_variable_identity_and_shapes(name, params, variable):
    task = tasks.get(name, **params)
    var = task.variable(variable)
    assert var.name == variable and var.scope in ("word", "position")
    for ids in word_batches(task):
        values = var.compute(ids)
        assert torch.equal(var.values(ids), values)
        if var.scope == "word":
            assert values.shape[0] == ids.shape[0] and values.ndim in (1, 2)
        else:
            assert values.shape == ids.shape
        if not var.interventional:
            continue
        same = var.intervene(ids, values)
        truth = task.targets(ids)
        assert same.shape == truth.shape
        assert torch.equal(same.to(truth.dtype), truth), f"{task}: setting {variable} to its own value changed targets"
        assert torch.equal(var.counterfactual(ids, ids), same)


@pytest.mark.parametrize(("name", "params", "variable"), VARIABLES)
def test_variable_counterfactual_errors(name, params, variable):
    task = tasks.get(name, **params)
    var = task.variable(variable)
    base = task.sample(mid_length(task), 4, gen(1))
    if not var.interventional:
        with pytest.raises(ExactLensError, match="no known effect"):
            var.counterfactual(base, base)
        return
    with pytest.raises(ExactLensError, match="differ in size"):
        var.counterfactual(base, base[:3])
    other = mid_length(task) + 1
    if task.max_length is not None and other > task.max_length:  # e.g. a compiled program's max_seq_len
        other = mid_length(task) - 1
    longer = task.sample(other, 4, gen(2))
    if var.scope == "position":
        with pytest.raises(ExactLensError, match="same length"):
            var.counterfactual(base, longer)
    else:
        assert var.counterfactual(base, longer).shape[0] == 4


def test_unknown_variable_names_the_known_ones(task):
    known = sorted(v.name for v in task.variables())
    with pytest.raises(ExactLensError, match="no variable 'nope'.*" + re.escape(known[0])):
        task.variable("nope")


# Hand derivations: (task, base word ids, source word ids) -> the target of the base word with the variable
# set to the source word's value, in plain Python from the papers' definitions.


def dyck_parts(task, word: list[int]) -> dict[str, bool]:
    """Membership's conjuncts of one word: balanced, no prefix closing more than it opened, every close
    matching the last unclosed open (where there is one), depth within the bound."""
    depth, lowest, highest, stack, types_ok = 0, 0, 0, [], True
    for s in word:
        if s % 2 == 0:
            stack.append(s // 2)
            depth += 1
        else:
            depth -= 1
            if stack and stack.pop() != s // 2:
                types_ok = False
        lowest, highest = min(lowest, depth), max(highest, depth)
    bound = task.max_depth
    return {
        "balanced": depth == 0,
        "no violation": lowest >= 0,
        "types": types_ok,
        "depth ok": bound is None or highest <= bound,
    }


def dyck_member(task, word):
    parts = dyck_parts(task, word)
    return all(parts.values())


def dyck_balance(task, base, source):
    parts = dyck_parts(task, base)
    parts["balanced"] = dyck_parts(task, source)["balanced"]
    return all(parts.values())


def dyck_violation(task, base, source):
    parts = dyck_parts(task, base)
    parts["no violation"] = dyck_parts(task, source)["no violation"]
    return all(parts.values())


def dyck_depth(task, base, source):
    # k = 1: the depth profile decides membership, so the base takes the source's answer
    return dyck_member(task, source)


def majority_counts(task, base, source):
    counts = Counter(source)
    best = max(counts.values())
    return min(c for c, n in counts.items() if n == best)


def induction(choose):
    def answer(task, base, source):
        # key j (<= i) matches query i when the symbol before j (set: the source's) is w_i; it proposes w_j
        previous = [None] + source[:-1]
        out = []
        for i, x in enumerate(base):
            proposals = [base[j] for j in range(i + 1) if previous[j] == x]
            out.append(choose(x, proposals, len(task.alphabet)))
        return out

    return answer


def recent(x, proposals, k):
    return proposals[-1] if proposals else x


def frequent(x, proposals, k):
    counts = [proposals.count(y) for y in range(k)]
    return max(range(k), key=lambda y: (counts[y], -y))  # most often, then alphabetically first ("a" if none)


def pairs_previous(task, base, source):
    if task.q_kind == "code":  # eq. 2.15 with N < 10: q(a, b) = 10 (a + 1) + (b + 1)
        q = [[10 * (a + 1) + (b + 1) for b in range(task.n_categories)] for a in range(task.n_categories)]
    else:
        q = task.q_true.tolist()
    return [None] + [q[source[i - 1]][base[i]] for i in range(1, len(base))]


def pairs_value(task, base, source):
    """The pair value is the output itself: swapping it answers the source's pair at each position."""
    expected = pairs_previous(task, source, source)
    return expected[: len(base)]


HAND = {
    ("parity", "ones"): lambda t, b, s: sum(s) % 2 == 1,
    ("parity", "parity"): lambda t, b, s: sum(s) % 2 == 1,
    ("first", "first symbol"): lambda t, b, s: len(s) > 0 and s[0] == 1,
    ("one", "ones"): lambda t, b, s: sum(s) == 1,
    ("palindrome", "mismatches"): lambda t, b, s: s == s[::-1],
    ("palindrome", "mirror symbol"): lambda t, b, s: all(b[i] == s[len(s) - 1 - i] for i in range(len(b))),
    ("dyck", "balance"): dyck_balance,
    ("dyck", "violation"): dyck_violation,
    ("dyck", "depth"): dyck_depth,
    ("majority", "counts"): majority_counts,
    ("induction-recent", "previous symbol"): induction(recent),
    ("induction-frequent", "previous symbol"): induction(frequent),
    ("pairs", "previous category"): pairs_previous,
    ("pairs", "pair value"): pairs_value,
}
KNOWN = {"parity", "first", "one", "palindrome", "dyck", "majority", "induction-recent", "induction-frequent",
         "pairs", "stdlib-chars"}


def base_source_pairs(task, scope: str):
    """(base, source) batches: every word of a short length against a shuffle of them, random words of a
    longer length, and (word scope) sources of another length."""
    lengths = short_lengths(task)
    for n in lengths[-2:]:
        base = task.all_words(n)
        yield base, base[torch.randperm(len(base), generator=gen(n))]
    n = long_length(task)
    yield task.sample(n, 48, gen(31)), task.sample(n, 48, gen(32))
    if scope == "word":
        yield task.sample(mid_length(task), 48, gen(33)), task.sample(mid_length(task) + 3, 48, gen(34))


@pytest.mark.parametrize(("name", "params", "variable"), VARIABLES)
def test_counterfactual_matches_hand_derivation(name, params, variable):
    task = tasks.get(name, **params)
    var = task.variable(variable)
    if not var.interventional:
        pytest.skip(f"{variable!r} has no intervene")
    if (name, variable) not in HAND:
        assert name not in KNOWN, f"add a hand derivation of {name}'s variable {variable!r} to HAND"
        pytest.skip(f"no hand derivation for plug-in task {name!r}")
    derive = HAND[name, variable]
    checked = 0
    for base, source in base_source_pairs(task, var.scope):
        got = var.counterfactual(base, source)
        for b, s, row in zip(base.tolist(), source.tolist(), got.tolist(), strict=True):
            expected = derive(task, b, s)
            if isinstance(expected, list):
                assert len(row) == len(expected)
                assert [r for r, e in zip(row, expected, strict=True) if e is not None] == [
                    e for e in expected if e is not None
                ], f"{task}: base {b}, source {s}"
            else:
                assert row == expected, f"{task}: base {b}, source {s}"
            checked += 1
    assert checked > 50


def test_hand_derivations_agree_with_the_reference():
    """The hand derivations above, with source = base, give each task's reference target (checks HAND)."""
    rng = random.Random(0)
    for (name, variable), derive in HAND.items():
        if name not in NAMES:
            continue
        for params in PARAMS.get(name, [{}]):
            task = tasks.get(name, **params)
            if variable not in {v.name for v in task.variables()}:
                continue
            for _ in range(200):
                n = rng.randint(task.min_length, task.min_length + 8)
                word = [rng.randrange(len(task.alphabet)) for _ in range(n)]
                assert derive(task, word, word) == task.target(as_symbols(task, word)), (name, params, word)


# ---- 7. registry -----------------------------------------------------------------------------------------------

ALLOWED = {
    "parity": [], "first": [], "one": [], "palindrome": [],
    "dyck": ["k", "max_depth"], "majority": ["allow_ties", "num_classes", "per_position"],
    "induction-recent": ["num_symbols"], "induction-frequent": ["num_symbols"],
    "pairs": ["categories", "q", "seed"], "stdlib-chars": ["modules", "validation_fraction"],
}


def test_names_lists_builtins_and_plugins():
    assert NAMES == sorted(NAMES) == sorted(tasks.TASKS)
    builtins = {"parity", "first", "one", "palindrome", "dyck", "majority", "induction-recent", "induction-frequent"}
    assert builtins <= set(NAMES)
    for name in NAMES:
        assert tasks.get(name, **PARAMS.get(name, [{}])[0]).name == name


def test_unknown_task_names_the_known_ones():
    with pytest.raises(ExactLensError, match="unknown task 'no-such-task'") as err:
        tasks.get("no-such-task")
    for name in NAMES:
        assert name in str(err.value)


@pytest.mark.parametrize("name", NAMES)
def test_unknown_parameter_names_the_allowed_ones(name):
    with pytest.raises(ExactLensError, match=f"task {name!r} takes the parameters.*not.*'bogus'") as err:
        tasks.get(name, bogus=1)
    if name in ALLOWED:
        assert f"takes the parameters {ALLOWED[name]}" in str(err.value)
