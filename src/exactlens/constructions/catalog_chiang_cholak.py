"""Registry entries of Chiang & Cholak 2022 (PARITY, FIRST, layer norm, log-n)."""

from __future__ import annotations

from exactlens.constructions import chiang_cholak as cc
from exactlens.constructions.registry import Construction, register

CC = "Chiang & Cholak 2022"

register(Construction("parity", "parity", cc.parity, f"{CC} §3.2",
                      "PARITY, 2 layers x 2 heads, d=9, no layer norm; s = ±2tanh(c)/n^2 (even n)"))
register(Construction("first", "first", cc.first, f"{CC} §3.3",
                      "FIRST, 2 layers, d=6, no layer norm; s = e^c/(e^c+n-1)(I[w1=1]-1/2)"))
register(Construction("parity-ln", "parity", cc.parity_ln, f"{CC} §4.1",
                      "PARITY with [x,-x] residual and post-LN (gamma=1, beta=0), eps a parameter"))
register(Construction("first-ln", "first", cc.first_ln, f"{CC} §4.1",
                      "FIRST with [x,-x] residual and post-LN (gamma=1, beta=0), eps a parameter"))
register(Construction("parity-ln-eta", "parity", cc.parity_ln_eta, f"{CC} §4.2 Prop. 2",
                      "parity-ln (eps=0) plus the Prop. 2 layer: cross-entropy eta bits for every n",
                      min_length=1))  # empty word: s = 0 and LN(0) = 0/0 with eps = 0
register(Construction("first-ln-eta", "first", cc.first_ln_eta, f"{CC} §4.2 Prop. 2",
                      "first-ln (eps=0) plus the Prop. 2 layer: cross-entropy eta bits for every n",
                      min_length=1))  # empty word: s = 0 and LN(0) = 0/0 with eps = 0
register(Construction("first-log", "first", cc.first_log, f"{CC} §5.3 eq. 2, Prop. 3",
                      "FIRST with attention logits scaled by log n; |s| > 1/4 for c=1"))
register(Construction("first-log-ln", "first", cc.first_log_ln, f"{CC} §5.3 Prop. 3",
                      "first-log with [x,-x] residual and post-LN"))
register(Construction("first-flawed", "first", cc.first_flawed, f"{CC} §5.2",
                      "one-layer FIRST that leaks the other positions; correct iff c > log(n-1)"))
