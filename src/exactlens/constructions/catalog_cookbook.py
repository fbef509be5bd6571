"""Registry entries of the Transformer Cookbook's worked examples (§9) and Brody et al.'s MAJORITY."""

from __future__ import annotations

from exactlens.constructions import cookbook_examples as ex
from exactlens.constructions.palindrome_hash import palindrome_hash
from exactlens.constructions.registry import Construction, register

TC = "Transformer Cookbook (Yang et al. 2025)"

register(
    Construction(
        "majority",
        "majority",
        ex.majority,
        "Brody et al. 2023 §4.1",
        "most frequent of num_classes classes: uniform attention, logits (count_c - c/k)/n at CLS",
        min_length=1,
        decide=ex.argmax_class,
    )
)
register(
    Construction(
        "induction-recent",
        "induction-recent",
        ex.induction_recent,
        f"{TC} §9.1.1",
        "follower of the most recent earlier occurrence of the last symbol; 2 layers, unique-hard",
        min_length=1,
        decide=ex.argmax_class,
    )
)
register(
    Construction(
        "induction-frequent",
        "induction-frequent",
        ex.induction_frequent,
        f"{TC} §9.1.2",
        "most frequent follower of the last symbol (ties: alphabetical); bigram counts, 2 layers",
        min_length=1,
        decide=ex.argmax_class,
    )
)
register(
    Construction(
        "dyck1",
        "dyck",
        ex.dyck1,
        f"{TC} §9.2.1",
        "Dyck-1, future-masked uniform attention; uniform external check, or 0/1 with max_length=N",
        decide=ex.dyck_decide,
        margin=ex.dyck_margin,
    )
)
register(
    Construction(
        "dyck1-depth2",
        "dyck",
        ex.dyck1_depth2,
        f"{TC} §9.2.2",
        "Dyck-1 of depth <= 2: match-and-cancel twice (4 hard-attention layers + final average)",
        decide=ex.dyck_decide,
        margin=ex.dyck_margin,
    )
)
register(
    Construction(
        "dyck-k-D",
        "dyck",
        ex.dyck_kd,
        f"{TC} §9.2.3",
        "Dyck-k of depth <= D: 2D hard-attention layers cancel matched pairs, then an average",
        decide=ex.dyck_decide,
        margin=ex.dyck_margin,
    )
)
register(
    Construction(
        "palindrome-hash",
        "palindrome",
        palindrome_hash,
        f"ours ({TC} §5.1.2, §5.3.3, §4.8)",
        "PALINDROME by layer-norm-hash lookup of the mirror n-1-i (6 layers, average-hard, selective LN); "
        "logit (1 - M)/n at CLS, M = #mismatches (0 or >= 2), |logit| >= 1/n",
        tags=("layer-norm-hash",),
    )
)
