"""ExactTransformer: the one hooked model class for every construction and trained model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformer_lens import ActivationCache, FactoredMatrix, HookedRootModule

from exactlens.errors import ExactLensError
from exactlens.model.components import Block, Embed, HookPoint, LayerNorm, PosEmbed, Unembed, visible_keys
from exactlens.model.config import ExactConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.pt"


class ExactTransformer(HookedRootModule):
    """A transformer whose every switch is in :class:`ExactConfig`.

    ``forward(tokens, n_positions=None)`` returns logits [batch, pos, d_vocab_out].
    ``n_positions`` [batch] gives the number of real positions of right-padded
    sequences: keys beyond it are masked and positional features use it as n.
    Weights start at zero; constructions set them, ``init_weights`` randomizes.
    """

    def __init__(self, cfg: ExactConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()
        self.pos_embed = PosEmbed(cfg)
        self.hook_pos_embed = HookPoint()
        self.blocks = torch.nn.ModuleList(Block(cfg, layer) for layer in range(cfg.n_layers))
        if cfg.final_ln:
            self.ln_final = LayerNorm(cfg)
        self.unembed = Unembed(cfg)
        self.setup()

    # ---- forward -------------------------------------------------------------

    def _check_input(self, tokens: Any, n_positions: Any) -> torch.Tensor:
        if not isinstance(tokens, torch.Tensor) or tokens.dtype not in (torch.int64, torch.int32):
            raise ExactLensError(
                "tokens must be an integer torch.Tensor [batch, pos]; tokenize strings with the language "
                f"(e.g. exactlens.languages.get('parity').tokenize), got {type(tokens).__name__}"
                + (f" of dtype {tokens.dtype}" if isinstance(tokens, torch.Tensor) else "")
            )
        if tokens.ndim != 2 or tokens.shape[0] == 0 or tokens.shape[1] == 0:
            raise ExactLensError(f"tokens must have shape [batch >= 1, pos >= 1], got {tuple(tokens.shape)}")
        n_pos = tokens.shape[1]
        if self.cfg.learned_positions and n_pos > self.cfg.n_ctx:
            raise ExactLensError(f"{n_pos} positions exceed the learned positional table (n_ctx={self.cfg.n_ctx})")
        low, high = (int(v) for v in torch.aminmax(tokens))
        if low < 0 or high >= self.cfg.d_vocab:
            raise ExactLensError(f"token ids must lie in [0, {self.cfg.d_vocab}), got range [{low}, {high}]")
        if n_positions is None:
            return torch.full((tokens.shape[0],), n_pos, dtype=torch.long)
        if not isinstance(n_positions, torch.Tensor) or n_positions.shape != (tokens.shape[0],):
            raise ExactLensError(f"n_positions must be a tensor of shape [batch]=({tokens.shape[0]},)")
        if n_positions.dtype not in (torch.int64, torch.int32):
            raise ExactLensError(f"n_positions must be an integer tensor, got dtype {n_positions.dtype}")
        if int(n_positions.min()) < 1 or int(n_positions.max()) > n_pos:
            raise ExactLensError(f"n_positions must lie in [1, {n_pos}] (positions per sequence, padding excluded)")
        return n_positions.long()

    def forward(
        self, tokens: torch.Tensor, n_positions: torch.Tensor | None = None, return_type: str | None = "logits"
    ) -> torch.Tensor | None:
        padded = n_positions is not None
        n_positions = self._check_input(tokens, n_positions)
        n_pos = tokens.shape[1]
        padded = padded and bool((n_positions != n_pos).any())
        allowed = {
            mask: visible_keys(mask, n_pos, n_positions, padded) for mask in set(self.cfg.per_layer("attention_mask"))
        }
        x = self.hook_embed(self.embed(tokens)) + self.hook_pos_embed(self.pos_embed(n_pos, n_positions, padded))
        for block in self.blocks:
            x = block(x, allowed[block.attn.mask], n_positions)
        if self.cfg.final_ln:
            x = self.ln_final(x)
        if return_type is None:
            return None
        if return_type != "logits":
            raise ExactLensError(f"return_type must be 'logits' or None, got {return_type!r}")
        return self.unembed(x)

    def readout_logits(self, tokens: torch.Tensor, n_positions: torch.Tensor | None = None) -> torch.Tensor:
        """For a sigmoid readout: the logit at cfg.readout_position, [batch]."""
        if self.cfg.readout != "sigmoid":
            raise ExactLensError(f"readout_logits needs readout='sigmoid', this model has {self.cfg.readout!r}")
        logits = self(tokens, n_positions)[..., 0]
        pos = self.cfg.readout_position
        if pos >= 0:
            return logits[:, pos]
        n_positions = self._check_input(tokens, n_positions)
        return logits[torch.arange(tokens.shape[0]), n_positions + pos]

    def run_with_cache(self, *args: Any, **kwargs: Any) -> tuple[Any, ActivationCache]:
        """Like HookedRootModule.run_with_cache, with a TransformerLens ActivationCache."""
        out, cache = super().run_with_cache(*args, **kwargs)
        has_batch = not kwargs.get("remove_batch_dim", False)
        return out, ActivationCache(cache, self, has_batch_dim=has_batch)

    def set_use_attn_result(self, use: bool) -> None:
        """Compute per-head outputs so that blocks.{l}.attn.hook_result fires."""
        self.cfg.use_attn_result = bool(use)

    # ---- weights, TransformerLens-style accessors ----------------------------

    def _stack(self, name: str) -> torch.Tensor:
        return torch.stack([getattr(b.attn, name) for b in self.blocks])

    @property
    def W_E(self) -> torch.Tensor:
        return self.embed.W_E

    @property
    def W_U(self) -> torch.Tensor:
        return self.unembed.W_U

    @property
    def b_U(self) -> torch.Tensor:
        return self.unembed.b_U

    @property
    def W_Q(self) -> torch.Tensor:
        return self._stack("W_Q")

    @property
    def W_K(self) -> torch.Tensor:
        return self._stack("W_K")

    @property
    def W_V(self) -> torch.Tensor:
        return self._stack("W_V")

    @property
    def W_O(self) -> torch.Tensor:
        return self._stack("W_O")

    @property
    def QK(self) -> FactoredMatrix:
        """[n_layers, n_heads, d_model, d_model]: x_q^T QK x_k is the (unscaled) score."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """[n_layers, n_heads, d_model, d_model]: x^T OV is what a head writes for source x."""
        return FactoredMatrix(self.W_V, self.W_O)

    def residual_label(self, index: int) -> str:
        labels = self.cfg.residual_labels
        return labels[index] if labels is not None else f"dim{index}"

    def init_weights(self, seed: int | None = None, std: float | None = None) -> ExactTransformer:
        """Random initialization for training (PyTorch-default-like uniform fan-in scale
        unless std is given); LN gains 1, biases 0."""
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        with torch.no_grad():
            for name, p in self.named_parameters():
                if name.endswith((".w",)):
                    p.fill_(1.0)
                elif name.endswith(".W_select"):  # selective LN starts as plain LN
                    p.copy_(torch.eye(p.shape[0], dtype=p.dtype))
                elif name.split(".")[-1].startswith("b") or p.ndim == 1:
                    p.zero_()
                else:
                    fan_in = p.shape[-2] if p.ndim >= 2 else p.shape[-1]
                    bound = std if std is not None else max(fan_in, 1) ** -0.5  # W_feat may have 0 rows
                    noise = torch.rand(p.shape, generator=gen, dtype=torch.float64) * 2 - 1
                    p.copy_(noise * bound)
        return self

    def check_finite(self) -> None:
        bad = [n for n, p in self.state_dict().items() if p.is_floating_point() and not torch.isfinite(p).all()]
        if bad:
            raise ExactLensError(f"weights contain NaN or inf: {bad}")

    # ---- save / load ---------------------------------------------------------

    def save(self, directory: str | Path) -> Path:
        """Write config.json (the ExactConfig) and weights.pt (the state dict)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / CONFIG_FILE).write_text(self.cfg.to_json() + "\n")
        torch.save(self.state_dict(), directory / WEIGHTS_FILE)
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> ExactTransformer:
        """Load a saved model; say exactly what differs when weights and config disagree."""
        directory = Path(directory)
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            if not (directory / name).is_file():
                raise ExactLensError(f"{directory} is not an exactlens checkpoint: {name} is missing")
        try:
            cfg = ExactConfig.from_dict(json.loads((directory / CONFIG_FILE).read_text()))
        except json.JSONDecodeError as err:
            raise ExactLensError(f"{directory / CONFIG_FILE} is not valid JSON: {err}") from err
        model = cls(cfg)
        try:
            state = torch.load(directory / WEIGHTS_FILE, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises UnpicklingError, EOFError, RuntimeError ... for a bad file
            raise ExactLensError(f"{directory / WEIGHTS_FILE} is not a readable torch state dict: {err}") from err
        if not isinstance(state, dict):
            raise ExactLensError(f"{directory / WEIGHTS_FILE} holds a {type(state).__name__}, not a state dict")
        expected = model.state_dict()
        problems = [f"missing weight {k} {tuple(v.shape)}" for k, v in expected.items() if k not in state]
        problems += [f"unexpected weight {k}" for k in state if k not in expected]
        problems += [
            f"{k} has shape {tuple(state[k].shape)}, config implies {tuple(v.shape)}"
            for k, v in expected.items()
            if k in state and state[k].shape != v.shape
        ]
        problems += [
            f"{k} has dtype {state[k].dtype}, config says {cfg.dtype}"
            for k, v in expected.items()
            if k in state and state[k].shape == v.shape and state[k].dtype != v.dtype
        ]
        if problems:
            raise ExactLensError(f"checkpoint {directory} does not match its config: " + "; ".join(problems))
        model.load_state_dict(state)
        model.check_finite()
        return model

    # ---- exports to TransformerLens ------------------------------------------

    def to_hooked_transformer(self, length: int | None = None):
        """A TransformerLens 3.x HookedTransformer with the same outputs (see exactlens.model.export)."""
        from exactlens.model.export import to_hooked_transformer

        return to_hooked_transformer(self, length=length)

    def to_bridge(self, length: int | None = None):
        """A TransformerLens 4.x TransformerBridge with the same outputs (see exactlens.model.export)."""
        from exactlens.model.export import to_bridge

        return to_bridge(self, length=length)
