"""Decision rules: how a model's outputs become the task's predictions.

Every model is read by one rule with one signature, ``decide(outputs, n_positions)``. A model
with a standard readout for its task's kind uses the kind's rule (:mod:`exactlens.tasks.kinds`).
A construction whose outputs mean something else names its own rule in
``ExactConfig.decision_rule`` (e.g. "accept iff |s| < 2^-n" for a signal that is 0 exactly on
members, or an external zero check of several outputs); such rules are registered here by name,
so a saved model keeps its rule and verify, diff and the report all read it the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from exactlens.errors import ExactLensError
from exactlens.plugins import Lazy, Registry

if TYPE_CHECKING:
    import torch

Decide = Callable[["torch.Tensor", "torch.Tensor"], "torch.Tensor"]
"""(outputs, n_positions [B]) -> predictions."""


@dataclass(frozen=True)
class DecisionRule:
    name: str
    decide: Decide
    margin: Decide | None = None  # distance of each word's outputs from the boundary (None: the kind's)
    summary: str = ""
    logits: bool = False  # the outputs are the kind's standard logits, so cross-entropy applies to them
    evidence: Decide | None = None  # differentiable standard-kind outputs whose standard decision is this rule's


def _accept(name: str, rule: Any) -> None:
    if not isinstance(rule, DecisionRule) or rule.name != name:
        raise ExactLensError(f"decision rule {name!r} must be a DecisionRule of that name, got {rule!r}")


_RULES: dict[str, DecisionRule] = Registry("decision rules", accept=_accept)


def register_decision_rule(rule: DecisionRule | Lazy, name: str | None = None) -> DecisionRule | Lazy:
    """Make a rule available by name (ExactConfig.decision_rule); ``exactlens.plugins.lazy("module:RULE")``
    with ``name`` defers its import."""
    key = rule.name if isinstance(rule, DecisionRule) else name
    if not isinstance(key, str) or not key:
        raise ExactLensError("register a DecisionRule, or a lazy one with name=...")
    existing = _RULES.peek(key)
    if existing is not None and existing != rule:
        raise ExactLensError(f"a different decision rule named {key!r} is already registered")
    _RULES[key] = rule
    return rule


def decision_rule(name: str) -> DecisionRule:
    from exactlens.plugins import load_plugins

    load_plugins()
    if name not in _RULES:
        known = ", ".join(sorted(_RULES)) or "none"
        raise ExactLensError(f"unknown decision rule {name!r}; registered: {known} (a plug-in registers its own)")
    return _RULES[name]


def rule_names() -> list[str]:
    from exactlens.plugins import load_plugins

    load_plugins()
    return sorted(_RULES)


@dataclass(frozen=True)
class Reader:
    """A task and the rule that reads one model's outputs for it."""

    task: object  # exactlens.tasks.Task
    rule: DecisionRule | None  # None: the kind's standard rule

    def decide(self, outputs: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
        if self.rule is not None:
            return self.rule.decide(outputs, n_positions)
        from exactlens.tasks import kinds

        return kinds.decide(self.task, outputs, n_positions)

    def margin(self, outputs: torch.Tensor, n_positions: torch.Tensor,
               truth: torch.Tensor | None = None) -> torch.Tensor | None:
        if self.rule is not None and self.rule.margin is not None:
            return self.rule.margin(outputs, n_positions)
        from exactlens.tasks import kinds

        return kinds.margin(self.task, outputs, n_positions, truth)

    def evidence(self, outputs: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor | None:
        """Outputs in the kind's standard form whose standard decision is this reader's (differentiable,
        for fitting by the kind's loss): the outputs themselves, a rule's ``evidence``, or None when
        the rule gives none."""
        if self.rule is None:
            return outputs
        if self.rule.evidence is not None:
            return self.rule.evidence(outputs, n_positions)
        return outputs if self.rule.logits else None

    @property
    def has_logits(self) -> bool:
        """Cross-entropy applies: the standard rule, or a rule over the kind's standard logits."""
        return self.task.kind != "regression" and (self.rule is None or self.rule.logits)

    @property
    def name(self) -> str:
        return self.rule.name if self.rule is not None else f"standard {self.task.kind}"
