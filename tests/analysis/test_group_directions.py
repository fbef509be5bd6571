"""A one-hot group's known directions (issue 41: a one-hot group is swapped whole): DAS fits of k < m
dimensions start from the first k columns, so those must be the members' differences, not m - 1 members."""

from __future__ import annotations

import itertools

import torch

from exactlens.analysis.diff.alignment.directions import group_directions


def _swap(base: torch.Tensor, source: torch.Tensor, basis: torch.Tensor) -> torch.Tensor:
    """Interchange on the span of ``basis`` (orthonormalized): base + P (source - base)."""
    q = torch.linalg.qr(basis)[0]
    return base + q @ (q.T @ (source - base))


def test_first_m_minus_1_directions_swap_every_one_hot_value() -> None:
    d, members = 7, [1, 2, 4, 6]  # a group of 4 labels among 7 residual dimensions
    own = torch.eye(d, dtype=torch.float64)[:, members]
    ordered = group_directions(own)
    assert ordered.shape == (d, 4)
    # the same span as the members (k = m is the exact patch)
    assert torch.allclose(ordered @ torch.linalg.lstsq(ordered, own).solution, own, atol=1e-12)
    noise = torch.randn(d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    noise[members] = 0.0  # other labels: left as the base has them
    for a, b in itertools.permutations(range(4), 2):
        base, source = noise + own[:, a], noise + own[:, b]
        assert torch.allclose(_swap(base, source, ordered[:, :3]), source, atol=1e-12)
    # the first three members alone miss every pair that involves the fourth: what this replaces
    base, source = noise + own[:, 3], noise + own[:, 0]
    assert not torch.allclose(_swap(base, source, own[:, :3]), source, atol=1e-3)


def test_group_directions_of_doubled_labels() -> None:
    """Members written as e_L - e_-(L) (a doubled residual): the same property, directions not unit."""
    d = 8
    own = torch.zeros(d, 3, dtype=torch.float64)
    for j in range(3):
        own[j, j], own[j + 4, j] = 1.0, -1.0
    ordered = group_directions(own)
    for a, b in itertools.permutations(range(3), 2):
        assert torch.allclose(_swap(own[:, a], own[:, b], ordered[:, :2]), own[:, b], atol=1e-12)


def test_a_k_that_passes_validation_but_not_its_training_pairs_is_not_chosen() -> None:
    """choose_dim: of the dimensions within DIM_TOLERANCE of the best validation IIA, the smallest whose fit also
    fits its training pairs (tracr-max_element's answer: k = 1 right on every validation pair, 0.78 on training)."""
    from exactlens.analysis.diff.alignment.fit import choose_dim

    assert choose_dim({1: 1.0, 2: 1.0}) == 1  # nothing known about training: the smallest, as before
    assert choose_dim({1: 1.0, 2: 1.0}, {1: 0.78, 2: 1.0}) == 2
    assert choose_dim({1: 1.0, 2: 0.9}, {1: 0.78, 2: 1.0}) == 1  # k = 2 is not near the best on validation
    assert choose_dim({1: 1.0, 2: 1.0, 3: 1.0}, {1: 0.5, 2: 0.8, 3: None}) == 1  # none fits: the old rule


def test_a_task_variable_named_like_a_label_gets_its_direction() -> None:
    """A compiled program's SOp is a task variable and an exact label of one name: a self-diff's fits of the task
    variable start from the label's direction (a numerical label, or a categorical one's group name:value)."""
    from exactlens.analysis.diff.alignment.directions import own_directions
    from exactlens.analysis.diff.alignment.variables import HighLevel

    labels = ["one", "opens_3", "hist_2:1", "hist_2:2", "hist_2:3", "other"]

    def var(name: str, origin: str = "task") -> HighLevel:
        return HighLevel(name, origin, "position", lambda *a: None, lambda *a: None)

    got = own_directions([var("opens_3"), var("hist_2"), var("missing"), var("opens_3", "exact")], labels)
    assert sorted(got) == [0, 1, 3]
    assert torch.equal(got[0][:, 0], torch.eye(6, dtype=got[0].dtype)[:, 1])
    span = got[1]
    assert span.shape == (6, 3) and torch.allclose(span[[0, 1, 5]], torch.zeros(3, 3, dtype=span.dtype))
