"""Formation events from a timeline's checkpoint rows: when each variable is computed (and stays so; a variable
that is the answer itself: when it reaches the readout with the answer, at the site ``answer_arrival``), when
behaviour reaches its threshold on the training and on the long lengths, when the circuit overlap reaches
its final value, and their order in one sentence.

An event is the first checkpoint *from which* the condition holds at every later checkpoint (a condition
met and lost again is not an event yet); None where it never holds at the last checkpoint. Light (no torch).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["BEHAVIOUR_AT", "COMPUTED_LOWER", "events", "order_sentence", "settled_from"]

COMPUTED_LOWER = 0.9  # the IIA interval's lower end a "computed" verdict must also reach for the event
BEHAVIOUR_AT = 0.99  # accuracy on the (training or long) lengths for the behaviour events


def settled_from(rows: list[dict[str, Any]], holds: Callable[[dict[str, Any]], bool]) -> dict[str, Any] | None:
    """The first row from which ``holds`` is true at every later row (None when it fails at the last)."""
    first = None
    for row in reversed(rows):
        if not holds(row):
            break
        first = row
    return first


def computed(row: dict[str, Any], variable: str) -> bool:
    """The variable's verdict at this checkpoint is "computed" with its IIA interval's lower end >= 0.9."""
    v = (row.get("verdicts") or {}).get(variable)
    ci = (v or {}).get("iia_ci")
    return bool(v) and v.get("verdict") == "computed" and ci is not None and ci[0] is not None \
        and ci[0] >= COMPUTED_LOWER


def arrives(row: dict[str, Any], variable: str) -> bool:
    """The variable is the answer itself ("indistinguishable from the answer", interval's lower end >= 0.9)
    and the answer reaches the readout at a site (``answer_arrival``): it is there, with the answer."""
    v = (row.get("verdicts") or {}).get(variable)
    ci = (v or {}).get("iia_ci")
    return bool(v) and v.get("verdict") == "indistinguishable from the answer" and bool(v.get("answer_arrival")) \
        and ci is not None and ci[0] is not None and ci[0] >= COMPUTED_LOWER


def _at_least(key: str, bound: float) -> Callable[[dict[str, Any]], bool]:
    return lambda row: row.get(key) is not None and row[key] >= bound


def _circuit(row: dict[str, Any]) -> float | None:
    return (row.get("circuit_overlap") or {}).get("edge_jaccard")


def events(rows: list[dict[str, Any]], long_lengths: list[int] | None = None) -> dict[str, Any]:
    """The ``events`` of a timeline (module docstring)."""
    names = list(dict.fromkeys(name for row in rows for name in (row.get("verdicts") or {})))
    variables: dict[str, Any] = {}
    for name in names:
        row = settled_from(rows, lambda r, name=name: computed(r, name))
        if row is not None:
            variables[name] = {"step": row["step"], "site": row["verdicts"][name]["site"], "how": "computed"}
            if row["verdicts"][name].get("position_index") is not None:  # a position-resolved variable's position
                variables[name]["position_index"] = row["verdicts"][name]["position_index"]
            continue
        # a variable that is the answer itself is dated where it reaches the readout with the answer
        row = settled_from(rows, lambda r, name=name: computed(r, name) or arrives(r, name))
        variables[name] = None if row is None else {
            "step": row["step"], "site": row["verdicts"][name].get("answer_arrival") or row["verdicts"][name]["site"],
            "how": "computed" if computed(row, name) else "arrives with the answer"}
    behaviour = settled_from(rows, _at_least("accuracy", BEHAVIOUR_AT))
    long_behaviour = settled_from(rows, _at_least("long_accuracy", BEHAVIOUR_AT))
    final = _circuit(rows[-1]) if rows else None
    # no overlap at the end is no event (settling on 0 from step 0 would date nothing)
    circuit = None if not final else settled_from(rows, lambda r: _circuit(r) == final)
    # a metric no checkpoint measured (its part not asked for) has no event and is not "never"
    unmeasured = [key for key, field in (("behaviour", "accuracy"), ("long_behaviour", "long_accuracy"))
                  if all(row.get(field) is None for row in rows)]
    out = {
        "variables": variables,
        "behaviour": None if behaviour is None else behaviour["step"],
        "long_behaviour": None if long_behaviour is None else long_behaviour["step"],
        "circuit": None if circuit is None else circuit["step"],
        "circuit_final_edge_jaccard": final,
        "thresholds": {"computed_iia_ci_lower": COMPUTED_LOWER, "accuracy": BEHAVIOUR_AT},
        "not_measured": unmeasured,
    }
    out["order"] = order_sentence(out, long_lengths)
    return out


def order_sentence(found: dict[str, Any], long_lengths: list[int] | None = None) -> str:
    """e.g. "w1 computed at step 120, before accuracy 0.99 at step 180; length generalisation at step 400"."""
    long_text = f"length generalisation (accuracy {BEHAVIOUR_AT} at lengths {_span(long_lengths)})" \
        if long_lengths else "length generalisation"
    named: list[tuple[str, Any]] = [
        (f"{name} {'computed' if not v or v.get('how', 'computed') == 'computed' else 'at the readout with the answer'}"
         + (f" ({v['site']})" if v and v.get("how") == "arrives with the answer" else ""), v["step"] if v else None)
        for name, v in found["variables"].items()]
    unmeasured = set(found.get("not_measured") or ())
    behaviours = [(f"accuracy {BEHAVIOUR_AT}", "behaviour"), (long_text, "long_behaviour")]
    named += [(text, found[key]) for text, key in behaviours if key not in unmeasured]
    if found.get("circuit_final_edge_jaccard"):
        named.append((f"circuit overlap at its final value (edge Jaccard {found['circuit_final_edge_jaccard']:.2f})",
                      found["circuit"]))
    happened = sorted(((step, text) for text, step in named if step is not None), key=lambda e: e[0])  # stable
    never = [text for text, step in named if step is None]
    if not happened:
        sentence = "nothing settles by the last checkpoint"
    else:
        parts, previous = [], None
        for step, text in happened:
            joiner = "" if previous is None else (", with " if step == previous else ", before ")
            parts.append(f"{joiner}{text} at step {step}" if step != previous else f"{joiner}{text}")
            previous = step
        sentence = "".join(parts)
    if never:
        sentence += "; never by the last checkpoint: " + ", ".join(never)
    if unmeasured:
        sentence += "; not measured: " + ", ".join(text for text, key in behaviours if key in unmeasured)
    if found.get("circuit_final_edge_jaccard") == 0:
        sentence += "; the discovered circuit shares no edge with the exact one at the last checkpoint"
    return sentence


def _span(lengths: list[int] | None) -> str:
    if not lengths:
        return "-"
    return str(lengths[0]) if len(lengths) == 1 else ",".join(str(n) for n in lengths)
