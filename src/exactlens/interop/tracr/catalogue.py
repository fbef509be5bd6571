"""RASP programs of classic circuit-benchmark tasks beyond tracr's library, written here from the
tasks' descriptions and registered like the library (``tracr-<name>``) by the plug-in ``tracr``.

Each is a small, known circuit: which SOp is computed where is tracr's compilation of the program
below. RASP's None (no key selected, or a None argument) is an undefined output: that position has
no target (trend's last position, neighbour_sum's and pair_lookup's first, dedup's repeats).

* ``trend``: "up", "down" or "same" for x_{i+1} against x_i; undefined at the last position.
* ``count_token``: how many tokens of the word are "a", at every position.
* ``dedup``: x_i where it starts a run of equal tokens, undefined where it repeats x_{i-1}.
* ``count_greater``: how many tokens of the word are greater than x_i.
* ``max_element``: the largest token of the word, at every position.
* ``neighbour_sum``: x_i + x_{i-1}; undefined at position 0.
* ``most_frequent``: the most frequent token (ties: the smallest), at every position.
* ``pair_lookup``: a fixed table's entry for the pair (x_{i-1}, x_i); undefined at position 0.
"""

from __future__ import annotations

from typing import Any

LETTERS = ("a", "b", "c")
DIGITS = (1, 2, 3)
PAIR_TABLE = {("a", "a"): "x", ("a", "b"): "y", ("a", "c"): "z",
              ("b", "a"): "z", ("b", "b"): "x", ("b", "c"): "x",
              ("c", "a"): "y", ("c", "b"): "z", ("c", "c"): "y"}
"""pair_lookup's table (previous token, token) -> class: no sum or order of the two tokens gives it."""


def _rasp() -> Any:
    from exactlens.interop.tracr import deps

    return deps.rasp()


def shifted(sop: Any, by: int) -> Any:
    """sop's value at position i - by (None where that is outside the word): one attention head."""
    r = _rasp()
    return r.Aggregate(r.Select(r.indices, r.indices, lambda key, query: key == query - by), sop)


def count_where(keys: Any, queries: Any, predicate: Any) -> Any:
    """How many positions j satisfy predicate(keys_j, queries_i), per position i (SelectorWidth)."""
    r = _rasp()
    return r.SelectorWidth(r.Select(keys, queries, predicate))


def value_where_zero(counts: Any, sop: Any) -> Any:
    """sop's value at the positions whose count is 0 (they all hold the same value), everywhere."""
    r = _rasp()
    return r.Aggregate(r.Select(counts, counts, lambda key, query: key == 0), sop)


def make_trend() -> Any:
    r = _rasp()
    return r.SequenceMap(lambda x, after: "up" if after > x else "down" if after < x else "same",
                         r.tokens, shifted(r.tokens, -1)).named("trend")


def make_count_token() -> Any:
    r = _rasp()
    return count_where(r.tokens, r.tokens, lambda key, query: key == "a").named("count_token")


def make_dedup() -> Any:
    """The repeat flag from one select on (index, token) codes; then each position reads its own token
    through a key that only a run's first position offers (a repeat selects nothing: None)."""
    r = _rasp()
    code = r.SequenceMap(lambda i, x: 10 * i + LETTERS.index(x), r.indices, r.tokens).named("code")
    repeats = count_where(code, code, lambda key, query: key // 10 == query // 10 - 1 and key % 10 == query % 10)
    slot = r.SequenceMap(lambda i, repeat: i if repeat == 0 else -1, r.indices, repeats.named("repeats"))
    return r.Aggregate(r.Select(slot.named("slot"), r.indices, r.Comparison.EQ), r.tokens).named("dedup")


def make_count_greater() -> Any:
    r = _rasp()
    return count_where(r.tokens, r.tokens, r.Comparison.GT).named("count_greater")


def make_max_element() -> Any:
    r = _rasp()
    above = count_where(r.tokens, r.tokens, r.Comparison.GT).named("above")
    return value_where_zero(above, r.tokens).named("max_element")


def make_neighbour_sum() -> Any:
    r = _rasp()
    return r.SequenceMap(lambda x, before: x + before, r.tokens, shifted(r.tokens, 1)).named("neighbour_sum")


def make_most_frequent() -> Any:
    """Score each position by its token's count, then by the smaller token; read the best one's token."""
    r = _rasp()
    count = count_where(r.tokens, r.tokens, r.Comparison.EQ).named("count")
    score = r.SequenceMap(lambda n, x: 10 * n - x, count, r.tokens).named("score")
    better = count_where(score, score, r.Comparison.GT).named("better")
    return value_where_zero(better, r.tokens).named("most_frequent")


def make_pair_lookup() -> Any:
    r = _rasp()
    return r.SequenceMap(lambda before, x: PAIR_TABLE[(before, x)], shifted(r.tokens, 1),
                         r.tokens).named("pair_lookup")


def catalogue() -> list[dict[str, Any]]:
    """The programs with the vocabularies and lengths they are registered with (all categorical)."""
    entry = [
        ("trend", make_trend, DIGITS, "'up'/'down'/'same' for x_{i+1} against x_i; undefined at the last position"),
        ("count_token", make_count_token, LETTERS, "how many tokens are 'a', at every position"),
        ("dedup", make_dedup, LETTERS, "sequential duplicate removal: x_i where it starts a run, undefined where "
         "it repeats x_{i-1}"),
        ("count_greater", make_count_greater, DIGITS, "how many tokens are greater than x_i"),
        ("max_element", make_max_element, DIGITS, "the largest token, at every position"),
        ("neighbour_sum", make_neighbour_sum, (0, 1, 2, 3), "x_i + x_{i-1}; undefined at position 0"),
        ("most_frequent", make_most_frequent, DIGITS, "the most frequent token (ties: the smallest), at every "
         "position"),
        ("pair_lookup", make_pair_lookup, LETTERS, "a fixed table's class of (x_{i-1}, x_i); undefined at "
         "position 0"),
    ]
    return [dict(name=name, make_program=make, vocab=vocab, max_seq_len=5, summary=f"{name} (catalogue): {summary}")
            for name, make, vocab, summary in entry]
