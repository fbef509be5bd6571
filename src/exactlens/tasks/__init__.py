"""Tasks: what a model is asked (words, targets, kinds, decisions, causal variables).

    from exactlens import tasks
    task = tasks.get("dyck", k=2, max_depth=2)
    ids = task.sample(8, 16, torch.Generator().manual_seed(0))
    batch = task.encode(ids)                 # tokens with [CLS], n_positions
    truth = task.targets(ids)                # kind-shaped targets
    outputs = model.readout(batch.tokens)    # what the model answers
    predictions = tasks.reader(model).decide(outputs, batch.n_positions)

The protocol is :class:`Task` (exactlens.tasks.base); kinds in exactlens.tasks.kinds;
decision rules in exactlens.tasks.decisions; causal variables in exactlens.tasks.variables.
The names below are imported when first used (the registry itself needs no torch: ``exactlens list``).
"""

from exactlens.lazy import lazy_names
from exactlens.tasks.decisions import register_decision_rule, rule_names
from exactlens.tasks.registry import TASKS, from_spec, get, info, names, of_model, reader, register

_WHERE = {
    "CLS": "base", "EOS": "base", "Language": "base", "Task": "base", "TokenBatch": "base", "check_length": "base",
    "First": "binary", "One": "binary", "Parity": "binary",
    "DecisionRule": "decisions", "Reader": "decisions", "decision_rule": "decisions",
    "Dyck": "dyck", "InductionFrequent": "induction", "InductionRecent": "induction", "KINDS": "kinds",
    "Majority": "majority", "Palindrome": "palindrome", "CausalVariable": "variables",
}

__all__ = [
    "CLS", "CausalVariable", "DecisionRule", "Dyck", "EOS", "First", "InductionFrequent", "InductionRecent", "KINDS",
    "Language", "Majority", "One", "Palindrome", "Parity", "Reader", "TASKS", "Task", "TokenBatch", "check_length",
    "decision_rule", "from_spec", "get", "info", "names", "of_model", "reader", "register", "register_decision_rule",
    "rule_names",
]


__getattr__, __dir__ = lazy_names(__name__, _WHERE, submodules=True)  # and submodules (tasks.kinds, ...)
