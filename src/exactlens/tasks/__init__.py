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
"""

from exactlens.tasks.base import CLS, EOS, Language, Task, TokenBatch, check_length
from exactlens.tasks.binary import First, One, Parity
from exactlens.tasks.decisions import DecisionRule, Reader, decision_rule, register_decision_rule, rule_names
from exactlens.tasks.dyck import Dyck
from exactlens.tasks.induction import InductionFrequent, InductionRecent
from exactlens.tasks.kinds import KINDS
from exactlens.tasks.majority import Majority
from exactlens.tasks.palindrome import Palindrome
from exactlens.tasks.registry import TASKS, from_spec, get, names, of_model, reader, register
from exactlens.tasks.variables import CausalVariable

__all__ = [
    "CLS", "EOS", "KINDS", "TASKS", "CausalVariable", "DecisionRule", "Dyck", "First", "InductionFrequent",
    "InductionRecent", "Language", "Majority", "One", "Palindrome", "Parity", "Reader", "Task", "TokenBatch",
    "check_length", "decision_rule", "from_spec", "get", "names", "of_model", "reader", "register",
    "register_decision_rule", "rule_names",
]
