"""An example exactlens plug-in: one hand-built construction, ``example-first-hard``.

FIRST = {w : w_1 = 1} (exactlens's built-in task "first"). One layer, one head, unique-hard
attention: [CLS] (position 0) attends to position 1 and copies +1/2 if w_1 = 1, else -1/2, into a
residual dimension s that the sigmoid readout reads at [CLS]. For the empty word there is no
position 1; [CLS] then attends to itself and copies -1/2. So the logit is exactly +-1/2 at every
length: ``exactlens verify example-first-hard`` reports accuracy 1.
"""

from exactlens.constructions.builder import LabelledModel, labelled_config
from exactlens.constructions.registry import Construction
from exactlens.constructions.registry import register as register_construction
from exactlens.model import ExactTransformer
from exactlens.tasks import First

# Every residual dimension is named: the token indicators, a positional feature, and the output s.
LABELS = ("I[w_i=0]", "I[w_i=1]", "I[w_i=CLS]", "I[i=1]", "s")


def first_hard(dtype: str = "float32") -> ExactTransformer:
    """The model. dtype comes from `--dtype`; other keyword parameters would be `--param KEY=VALUE`."""
    cfg = labelled_config(
        "example-first-hard", LABELS, First().vocab,  # vocab ("0", "1", "[CLS]"): the task's tokens
        layers=1, heads=1, d_mlp=0, positions=("I[i=1]",), dtype=dtype, metadata={"paper": "example"},
        attention_weighting="unique_hard_left",  # any ExactConfig field can be overridden here
    )
    b = LabelledModel(cfg)
    b.embed_one_hot_tokens()  # token t writes 1 to I[w_i=t]
    b.position("I[i=1]", {"I[i=1]": 1})  # the feature I[i=1] writes to the dimension of that name
    # Score of query i on key j: I[w_i=CLS] * I[j=1]; at [CLS] the unique maximum is position 1.
    b.query_key(0, 0, query={"I[w_i=CLS]": 1}, key={"I[i=1]": 1})
    # The attended token's value: +1/2 for a 1, -1/2 for a 0 or for [CLS] itself (empty word).
    b.value(0, 0, {("s", "I[w_i=1]"): 0.5, ("s", "I[w_i=0]"): -0.5, ("s", "I[w_i=CLS]"): -0.5})
    b.readout({"s": 1})  # sigmoid logit = s, read at [CLS] (labelled_config's default readout)
    return b.model


def register() -> None:
    """The entry point: register what this package adds (here one construction for the task "first")."""
    register_construction(
        Construction(
            name="example-first-hard",
            task="first",  # a registered task name; a new task would be added with exactlens.tasks.register
            build=first_hard,
            paper="exactlens example plug-in",
            summary="FIRST, 1 layer x 1 head, unique-hard attention from [CLS] to position 1; s = +-1/2",
        )
    )
