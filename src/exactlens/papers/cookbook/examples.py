"""Worked examples of the Transformer Cookbook (Yang et al. 2025, §9), assembled from the cookbook
recipes (exactlens.constructions.cookbook).

Every model reads [CLS] at position 0 (it plays the cookbook's bos). Labels name the quantities
of the paper; ``model.cfg.metadata`` records whether the output is a uniform external check or
a nonuniform 0/1 decision (``decision``) and, for the latter, the largest |w| it is built for
(``max_length``). The induction heads are causal, so they answer at every position (the task
asks for every prefix; the cookbook states the last position).

Uniform vs nonuniform (§2.3, §9.2.1): a uniform construction has weights that do not
depend on the length; its Dyck outputs are real numbers that an *external* check
compares with zero. In exact arithmetic the check is "= 0"; in floating point we test
"< half the smallest nonzero value", and that value is 1/n (or 1/n^2), which the model
itself outputs as the average of the [CLS] indicator, so the check still uses no length
parameter. A nonuniform construction (``max_length=N``) adds the §4.7 comparisons with
tolerance 1/(N+1) and outputs one logit whose sign is the 0/1 decision, valid for |w| <= N.
"""

from __future__ import annotations

import torch

from exactlens.constructions.cookbook import FFN, Head, Layer, Program, Readout, compile
from exactlens.constructions.cookbook import attention as att
from exactlens.constructions.cookbook import ffn as ff
from exactlens.errors import ExactLensError
from exactlens.model import ExactTransformer
from exactlens.tasks import CLS, Dyck, InductionFrequent, InductionRecent
from exactlens.tasks.decisions import DecisionRule

UNIFORM = "uniform external check"
NONUNIFORM = "nonuniform 0/1 decision"


def _finish(model: ExactTransformer, **metadata) -> ExactTransformer:
    model.cfg.metadata.update(metadata)
    return model


def _check_max_length(max_length: int | None) -> None:
    if max_length is not None and (not isinstance(max_length, int) or isinstance(max_length, bool) or max_length < 1):
        raise ExactLensError(f"max_length must be an integer >= 1 (nonuniform) or None (uniform), got {max_length!r}")


# ----------------------------------------------------------------------------- decisions


def dyck_decide(outputs: torch.Tensor, n_positions: torch.Tensor | None = None) -> torch.Tensor:
    """Sigmoid logit (nonuniform): accept iff s > 0. Uniform outputs [value, 1/n] or
    [balance, violations, 1/n] (Dyck-1): accept iff every value is zero, tested as
    |value| < (1/n)/2 (violations: < (1/n)^2 / 2, its smallest nonzero size)."""
    if outputs.ndim == 1:
        return outputs > 0
    return (_dyck_slack(outputs) > 0).all(dim=1)


def _dyck_slack(outputs: torch.Tensor) -> torch.Tensor:
    """Per tested value: threshold - |value| (positive = the value counts as zero)."""
    inv = outputs[:, -1:]
    if outputs.shape[1] == 2:
        return inv / 2 - outputs[:, :1].abs()
    return torch.cat([inv / 2 - outputs[:, :1].abs(), inv**2 / 2 - outputs[:, 1:2].abs()], dim=1)


def dyck_evidence(outputs: torch.Tensor, n_positions: torch.Tensor | None = None) -> torch.Tensor:
    """A logit positive exactly when dyck_decide accepts: s, or the smallest slack in units of 1/n."""
    if outputs.ndim == 1:
        return outputs
    return (_dyck_slack(outputs) / outputs[:, -1:]).amin(dim=1) * 4


def dyck_margin(outputs: torch.Tensor, n_positions: torch.Tensor | None = None) -> torch.Tensor:
    """Distance of the outputs from the decision boundary (|s|, or the smallest |slack|)."""
    if outputs.ndim == 1:
        return outputs.abs()
    return _dyck_slack(outputs).abs().min(dim=1).values


# ----------------------------------------------------------------------------- induction heads


def _predecessor_layer(symbols: tuple[str, ...]) -> Layer:
    """§5.4 (strict future masking): prev_s[i] = [w_{i-1} = s]; position 1 reads [CLS] -> 0."""
    return att.predecessor("pos", {f"prev_{s}": f"cur_{s}" for s in symbols})


def _induction_embedding(lang) -> tuple[dict, dict]:
    embedding = {s: {f"cur_{s}": 1.0} for s in lang.alphabet} | {CLS: {"is_cls": 1.0}}
    return embedding, {"i": {"pos": 1.0}}


def induction_recent(num_symbols: int = 3, dtype: str = "float32") -> ExactTransformer:
    """§9.1.1. Layer 1: predecessor (prev one-hot). Layer 2: query cur_i, key prev_j,
    score [w_{j-1} = w_i] over j <= i; rightmost unique-hard attention picks the most
    recent earlier occurrence and copies its follower w_j. With no match every score
    is 0 and the rightmost key is i itself: the current symbol, as §9.1.1 asks."""
    lang = InductionRecent(num_symbols)
    syms = lang.alphabet
    embedding, positions = _induction_embedding(lang)
    induction = att.match(
        [f"cur_{s}" for s in syms],
        [f"prev_{s}" for s in syms],
        {f"next_{s}": f"cur_{s}" for s in syms},
        name="induction",
    )
    layers = (_predecessor_layer(syms), Layer(heads=(induction,), mask="causal", weighting="unique_hard_right"))
    readout = Readout({s: {f"next_{s}": 1.0} for s in syms}, kind="per_position")
    program = Program(
        vocab=lang.vocab,
        embedding=embedding,
        positions=positions,
        layers=layers,
        readout=readout,
        name="induction-recent",
    )
    return _finish(compile(program, dtype), decision="argmax class at every position")


def induction_frequent(num_symbols: int = 3, dtype: str = "float32") -> ExactTransformer:
    """§9.1.2. Layer 1: predecessor, then an FFN of ANDs (§4.8) gives the bigram one-hot
    bi_xy[i] = [w_{i-1} = x and w_i = y]. Layer 2: future-masked uniform attention (§5.1.2)
    counts them, cnt_xy = #{bigrams xy up to i} / (i+1), plus 1/(i+1) from [CLS]; its FFN
    selects the row of the current symbol, sel_y = sum_x relu(cnt_xy + cur_x - 1) (§4.9
    with else-branch 0, exact for cnt in [0, 1]). Readout logit_y = sel_y - (y/k)/(i+1):
    the most frequent follower wins by >= 1/(k n), ties go to the alphabetically first."""
    lang = InductionFrequent(num_symbols)
    syms = lang.alphabet
    k = len(syms)
    embedding, positions = _induction_embedding(lang)
    bigram = ff.join(
        *[
            ff.boolean(
                lambda a, b: a and b, [f"prev_{x}", f"cur_{y}"], f"bi_{x}{y}", inputs_encoding="01", name=f"and-{x}{y}"
            )
            for x in syms
            for y in syms
        ],
        name="bigram",
    )
    layer1 = Layer(
        heads=_predecessor_layer(syms).heads, ffns=(bigram,), mask="strict_causal", weighting="unique_hard_right"
    )
    counts = att.uniform_average(
        {f"cnt_{x}{y}": f"bi_{x}{y}" for x in syms for y in syms} | {"1/(i+1)": "is_cls"}, name="count"
    )
    select = FFN.build(
        [{f"cnt_{x}{y}": 1.0, f"cur_{x}": 1.0} for x in syms for y in syms],
        {f"sel_{y}": [1.0 if yy == y else 0.0 for _ in syms for yy in syms] for y in syms},
        b_in=[-1.0] * (k * k),
        name="select-row",
    )
    layer2 = Layer(heads=(counts,), ffns=(select,), mask="causal", weighting="average_hard")
    readout = Readout(
        {y: {f"sel_{y}": 1.0, "1/(i+1)": -index / k} for index, y in enumerate(syms)}, kind="per_position"
    )
    program = Program(
        vocab=lang.vocab,
        embedding=embedding,
        positions=positions,
        layers=(layer1, layer2),
        readout=readout,
        name="induction-frequent",
    )
    return _finish(compile(program, dtype), decision="argmax class at every position")


# ----------------------------------------------------------------------------- Dyck-1


def dyck1(max_length: int | None = None, dtype: str = "float32") -> ExactTransformer:
    """§9.2.1 (after Bhattamishra et al. 2020): average-hard future-masked attention,
    no layer norm. Layer 1: balance b_i = (#open - #close)/(i+1) and 1/(i+1); FFN
    e_i = relu(-b_i) > 0 iff the prefix condition fails at i. Layer 2: violations
    E_i = mean_{j <= i} e_j. At the last position the word is in Dyck-1 iff b = 0
    and E = 0 (smallest nonzero sizes 1/n and 1/n^2).

    max_length=None: uniform; outputs [balance, violations, 1/n] for the external
    check. max_length=N: nonuniform; a third layer's FFN computes [b = 0] and [E = 0]
    with the §4.7 tolerances 1/(N+1) and 1/(N+1)^2, then their AND (§4.8): one
    logit s = accept - 1/2, valid for |w| <= N."""
    _check_max_length(max_length)
    lang = Dyck(1)
    embedding = {"(": {"x": 1.0}, ")": {"x": -1.0}, CLS: {"is_cls": 1.0}}
    balance = att.uniform_average({"b": "x", "1/(i+1)": "is_cls"}, name="balance")
    violation = FFN.build([{"b": -1.0}], {"e": [1.0]}, name="violation")
    layers = [
        Layer(heads=(balance,), ffns=(violation,), mask="causal", weighting="average_hard"),
        Layer(heads=(att.uniform_average({"E": "e"}, name="aggregate"),), mask="causal", weighting="average_hard"),
    ]
    if max_length is None:
        readout = Readout(
            {"balance": {"b": 1.0}, "violations": {"E": 1.0}, "1/n": {"1/(i+1)": 1.0}}, kind="logits", position=-1
        )
        meta = {"decision": UNIFORM}
    else:
        tol = 1.0 / (max_length + 1)
        checks = ff.join(
            ff.equal_zero("b", "b=0", tol, name="b-is-zero"),
            ff.equal_zero("E", "E=0", tol**2, name="E-is-zero"),
            name="zero-checks",
        )
        layers[1] = Layer(heads=layers[1].heads, ffns=(checks,), mask="causal", weighting="average_hard")
        accept = ff.boolean(lambda a, b: a and b, ["b=0", "E=0"], "accept", inputs_encoding="01", name="and")
        layers.append(Layer(ffns=(accept,)))
        readout = Readout({"accept": {"accept": 1.0}}, bias={"accept": -0.5}, kind="sigmoid", position=-1)
        meta = {"decision": NONUNIFORM, "max_length": max_length}
    program = Program(vocab=lang.vocab, embedding=embedding, layers=tuple(layers), readout=readout, name="dyck1")
    return _finish(compile(program, dtype), **meta)


# ----------------------------------------------------------------------------- Dyck-k-D


def _nearest_active(side: str, d: int, k: int, weighting: str) -> Layer:
    """Nearest still-active position to the left (strict future mask) or right (strict
    past mask). Unique-hard: score = active_j, rightmost/leftmost maximum. Average-hard
    (§5.6): score = active_j + p_j / 2 with p_j = j/n (left) or (n-1-j)/n (right), so the
    nearest active key is the unique maximum. No active key -> an inactive one, whose
    copied active bit 0 says "none"."""
    tag = f"{side}{d}"
    values = {f"{tag}_active": "active", f"{tag}_open": "open"} | {f"{tag}_type{t}": f"type{t}" for t in range(k)}
    head = Head.build(
        query={},
        key={"active": [1.0]},
        value={(o, i): 1.0 for o, i in values.items()},
        q_bias=[1.0],
        name=f"nearest-{tag}",
    )
    mask = "strict_causal" if side == "L" else "strict_past"
    if weighting == "unique_hard":
        return Layer(heads=(head,), mask=mask, weighting="unique_hard_right" if side == "L" else "unique_hard_left")
    position = "i/n" if side == "L" else "(n-1-i)/n"
    return Layer(heads=(att.break_ties(head, position, gap=1.0, side="right"),), mask=mask, weighting="average_hard")


def _match_ffn(d: int, k: int) -> FFN:
    """§9.2.2 eq. 44-47 as Boolean ANDs (§4.8): an active open bracket of pair t whose
    nearest active right neighbour closes pair t, or an active close whose nearest active
    left neighbour opens pair t, becomes inactive (active -= 1)."""
    rules = {  # a, o: this position active / open; na, no: the neighbour's; ty, nt: both of type t
        "open": ("R", lambda a, o, na, no, ty, nt: a and o and na and not no and ty and nt),
        "close": ("L", lambda a, o, na, no, ty, nt: a and not o and na and no and ty and nt),
    }
    pieces = []
    for t in range(k):
        for kind, (side, rule) in rules.items():
            names = ["active", "open", f"{side}{d}_active", f"{side}{d}_open", f"type{t}", f"{side}{d}_type{t}"]
            pieces.append(ff.boolean(rule, names, "matched", inputs_encoding="01", name=f"match-{kind}{t}"))
    return ff.join(*pieces, name=f"match{d}").route(outputs={"matched": {"active": -1.0}})


def dyck_kd(
    k: int = 2, D: int = 2, max_length: int | None = None, weighting: str = "unique_hard", dtype: str = "float32"
) -> ExactTransformer:
    """§9.2.2-9.2.3 (Yao et al. 2021; Yang et al. 2024): each position carries
    (open, active, type one-hot); for depth d = 1..D, one layer fetches the nearest
    active bracket to the left, one to the right, and an FFN deactivates matched pairs
    (2D layers). The word is in Dyck-k-D iff no position stays active: a final unmasked
    uniform layer gives A = #active / n and 1/n at [CLS].

    max_length=None: uniform, outputs [active, 1/n], external check A = 0 (A < (1/n)/2).
    max_length=N: nonuniform, [A = 0] with the §4.7 tolerance 1/(N+1), logit
    s = [A = 0] - 1/2, valid for |w| <= N. weighting: "unique_hard" or "average_hard"
    (with the §5.6 positional tie-break)."""
    _check_max_length(max_length)
    if weighting not in ("unique_hard", "average_hard"):
        raise ExactLensError(f"weighting must be 'unique_hard' or 'average_hard', got {weighting!r}")
    lang = Dyck(k, D)
    embedding = {CLS: {"is_cls": 1.0}}
    for t, pair in enumerate(lang.alphabet[0::2]):
        embedding[pair] = {"open": 1.0, "active": 1.0, f"type{t}": 1.0}
        embedding[lang.alphabet[2 * t + 1]] = {"open": 0.0, "active": 1.0, f"type{t}": 1.0}
    positions = {"i/n": {"i/n": 1.0}, "(n-1-i)/n": {"(n-1-i)/n": 1.0}} if weighting == "average_hard" else {}
    layers = []
    for d in range(1, D + 1):
        layers.append(_nearest_active("L", d, k, weighting))
        right = _nearest_active("R", d, k, weighting)
        layers.append(Layer(heads=right.heads, ffns=(_match_ffn(d, k),), mask=right.mask, weighting=right.weighting))
    final = att.uniform_average({"A": "active", "1/n": "is_cls"}, name="unmatched")
    if max_length is None:
        layers.append(Layer(heads=(final,), mask="none", weighting="average_hard"))
        readout = Readout({"unmatched": {"A": 1.0}, "1/n": {"1/n": 1.0}}, kind="logits", position=0)
        meta = {"decision": UNIFORM}
    else:
        check = ff.equal_zero("A", "accept", 1.0 / (max_length + 1), name="none-active")
        layers.append(Layer(heads=(final,), ffns=(check,), mask="none", weighting="average_hard"))
        readout = Readout({"accept": {"accept": 1.0}}, bias={"accept": -0.5}, kind="sigmoid", position=0)
        meta = {"decision": NONUNIFORM, "max_length": max_length}
    program = Program(
        vocab=lang.vocab,
        embedding=embedding,
        positions=positions,
        layers=tuple(layers),
        readout=readout,
        name=f"dyck-{k}-{D}",
    )
    return _finish(compile(program, dtype), **meta)


def dyck1_depth2(
    max_length: int | None = None, weighting: str = "unique_hard", dtype: str = "float32"
) -> ExactTransformer:
    """§9.2.2: Dyck-1-2, i.e. dyck_kd with k = 1, D = 2."""
    return dyck_kd(k=1, D=2, max_length=max_length, weighting=weighting, dtype=dtype)


# ----------------------------------------------------------------------------- registry

TC = "Transformer Cookbook (Yang et al. 2025)"
DYCK_RULE = DecisionRule(
    "dyck-zero-check",
    dyck_decide,
    dyck_margin,
    "a sigmoid logit (nonuniform: accept iff s > 0), or the uniform outputs [value(s), 1/n]: accept iff "
    "every value is zero, tested as |value| < half its smallest nonzero size",
    evidence=dyck_evidence,
)


DYCK_TRAINING = {"train_length": (1, 16), "test_length": (1, 16)}
"""Dyck-1, Dyck-1 of depth 2 and Dyck-k-D in their constructions' shapes: the generic 1200 Adam steps
of 128 words (exactlens.train.shaped) at |w| 1..16 reach held-out accuracy 1.0 (the table in docs/training.md)."""

INDUCTION_TRAINING = {"d_model": 32, "train_length": (1, 16), "test_length": (1, 16)}
"""Induction heads in the constructions' shape (2 layers x 1 head, feature i): width 32 (the rule's 16
plateaus lower); most-recent plateaus near 0.93 per position (the table in docs/training.md)."""
