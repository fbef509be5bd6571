"""ExactTransformer: the one hooked model class for every construction and trained model."""

from __future__ import annotations

import json
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformer_lens import ActivationCache, FactoredMatrix, HookedRootModule

from exactlens.errors import ExactLensError
from exactlens.model.components import (
    QUERY_CHUNK_BYTES,
    Block,
    Embed,
    HookPoint,
    LayerNorm,
    PosEmbed,
    Unembed,
    gather_rows,
    visible_keys,
)
from exactlens.model.config import ExactConfig, model_bytes
from exactlens.resources import check_memory, check_work, memory_limit

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "weights.pt"


def _load_reason(err: BaseException) -> str:
    """Why torch.load refused a file, in one line, without torch's advice to retry with weights_only=False
    (which would run whatever code the file holds: never advice for a user of ours)."""
    if isinstance(err, OSError) and err.strerror:
        return err.strerror
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    kept = [line for line in lines if "weights_only" not in line and "pytorch.org" not in line
            and not line.startswith("Weights only load failed")]
    if len(kept) < len(lines):  # the weights-only unpickler refused something: say what
        return ((kept[0] if kept else "the file holds Python objects beyond tensors")
                + " (a pickle that would run code or build other objects is refused)")
    return lines[0] if lines else type(err).__name__


def forward_bytes_of(cfg: ExactConfig, batch: int, n_pos: int, padded: bool = False, hooked: bool = False) -> int:
    """A rough upper estimate of the memory one forward pass of a model of ``cfg`` on [batch, n_pos] needs, from
    the config alone (nothing allocated): the key masks, the attention's [query, key] tensors (all of them when
    a hook reads them, e.g. run_with_cache or training's backward pass; else a block of queries at a time, see
    components.QUERY_CHUNK_BYTES) and the residual-width activations (every layer's when ``hooked``)."""
    item = torch.finfo(cfg.torch_dtype).bits // 8
    masks = {m for m in cfg.per_layer("attention_mask") if m != "none" or padded}
    mask_bytes = len(masks) * (batch + 1) * n_pos * n_pos
    scores = 3 * batch * cfg.n_heads * n_pos * n_pos * item
    score_bytes = scores * cfg.n_layers if hooked else min(scores, QUERY_CHUNK_BYTES + 3 * batch * cfg.n_heads
                                                             * n_pos * item)
    width = 8 * cfg.d_model + 2 * cfg.d_mlp + 3 * cfg.n_heads * cfg.d_head + cfg.d_vocab_out
    resid_bytes = batch * n_pos * width * item * (cfg.n_layers if hooked else 1)
    return mask_bytes + score_bytes + resid_bytes + batch * n_pos * 8


def forward_operations_of(cfg: ExactConfig, batch: int, n_pos: int) -> float:
    """Arithmetic of one forward pass of a model of ``cfg`` on [batch, n_pos] (multiply-adds counted once):
    attention's [query, key] work plus the position-wise maps. What the work limit is checked against."""
    attention = cfg.n_heads * n_pos * n_pos * (2 * cfg.d_head + 8)
    positionwise = n_pos * cfg.d_model * (4 * cfg.n_heads * cfg.d_head + 2 * cfg.d_mlp)
    return float(cfg.n_layers * batch * (attention + positionwise))


class ExactTransformer(HookedRootModule):
    """A transformer whose every switch is in :class:`ExactConfig`.

    ``forward(tokens, n_positions=None)`` returns logits [batch, pos, d_vocab_out].
    ``n_positions`` [batch] gives the number of real positions of right-padded
    sequences: keys beyond it are masked and positional features use it as n.
    Weights start at zero; constructions set them, ``init_weights`` randomizes.
    """

    def __init__(self, cfg: ExactConfig):
        super().__init__()
        check_memory(model_bytes(cfg), f"a model with d_model={cfg.d_model}, d_mlp={cfg.d_mlp}, "
                     f"n_layers={cfg.n_layers}, n_heads={cfg.n_heads}, d_vocab={cfg.d_vocab} ({cfg.dtype})",
                     "lower the widths, layers or vocabulary in the config")
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

    def _check_input(self, tokens: Any, n_positions: Any) -> tuple[torch.Tensor, bool]:
        """(n_positions [batch], padded: some row is shorter than the tensor) for valid input."""
        if not isinstance(tokens, torch.Tensor) or tokens.dtype not in (torch.int64, torch.int32):
            raise ExactLensError(
                "tokens must be an integer torch.Tensor [batch, pos]; tokenize strings with the task "
                f"(e.g. exactlens.tasks.get('parity').tokenize), got {type(tokens).__name__}"
                + (f" of dtype {tokens.dtype}" if isinstance(tokens, torch.Tensor) else "")
            )
        if tokens.ndim != 2 or tokens.shape[0] == 0 or tokens.shape[1] == 0:
            raise ExactLensError(f"tokens must have shape [batch >= 1, pos >= 1], got {tuple(tokens.shape)}")
        low, high = (int(v) for v in torch.aminmax(tokens))
        if low < 0 or high >= self.cfg.d_vocab:
            raise ExactLensError(f"token ids must lie in [0, {self.cfg.d_vocab}), got range [{low}, {high}]")
        return self._check_positions(tokens.shape[0], tokens.shape[1], n_positions, tokens.device)

    def _check_positions(self, batch: int, n_pos: int, n_positions: Any,
                         device: torch.device | None = None) -> tuple[torch.Tensor, bool]:
        if self.cfg.learned_positions and n_pos > self.cfg.n_ctx:
            raise ExactLensError(f"{n_pos} positions exceed the learned positional table (n_ctx={self.cfg.n_ctx})")
        if n_positions is None:
            self.check_forward_cost(batch, n_pos, padded=False)
            return torch.full((batch,), n_pos, dtype=torch.long, device=device), False
        if not isinstance(n_positions, torch.Tensor) or n_positions.shape != (batch,):
            raise ExactLensError(f"n_positions must be a tensor of shape [batch]=({batch},)")
        if n_positions.dtype not in (torch.int64, torch.int32):
            raise ExactLensError(f"n_positions must be an integer tensor, got dtype {n_positions.dtype}")
        if int(n_positions.min()) < 1 or int(n_positions.max()) > n_pos:
            raise ExactLensError(f"n_positions must lie in [1, {n_pos}] (positions per sequence, padding excluded)")
        padded = bool((n_positions != n_pos).any())
        self.check_forward_cost(batch, n_pos, padded)
        return n_positions.long(), padded

    @property
    def device(self) -> torch.device:
        """Where the model's weights are (``model.to(device)`` moves them; exactlens.devices)."""
        return self.embed.W_E.device

    def on_device(self, tokens: Any, n_positions: Any) -> tuple[Any, Any]:
        """Input tensors moved to the model's device (words are tokenized on the CPU; a model on
        another device reads them there). Anything else is left for the input checks to refuse."""
        device = self.device
        if isinstance(tokens, torch.Tensor) and tokens.device != device:
            tokens = tokens.to(device)
        if isinstance(n_positions, torch.Tensor) and n_positions.device != device:
            n_positions = n_positions.to(device)
        return tokens, n_positions

    def forward_bytes(self, batch: int, n_pos: int, padded: bool = False, hooked: bool | None = None) -> int:
        """A rough upper estimate of the memory one forward pass on [batch, n_pos] needs (forward_bytes_of);
        ``hooked`` None: whether a hook of this model is active."""
        if hooked is None:
            hooked = any(isinstance(m, HookPoint) and m.active for m in self.modules())
        return forward_bytes_of(self.cfg, batch, n_pos, padded, hooked)

    def forward_operations(self, batch: int, n_pos: int) -> float:
        """Arithmetic of one forward pass on [batch, n_pos] (forward_operations_of)."""
        return forward_operations_of(self.cfg, batch, n_pos)

    def check_forward_cost(self, batch: int, n_pos: int, padded: bool = False) -> None:
        """Refuse (ExactLensError) a forward pass beyond the work limit (forward_operations) or the memory
        limit (forward_bytes)."""
        check_work(self.forward_operations(batch, n_pos), f"a forward pass on {batch} x {n_pos} tokens",
                   "use shorter lengths or fewer words")
        if self.forward_bytes(batch, n_pos, padded, hooked=True) <= memory_limit():  # the usual, cheap case
            return
        check_memory(self.forward_bytes(batch, n_pos, padded),
                     f"a forward pass on {batch} x {n_pos} tokens",
                     "use fewer words per call (--strings) or shorter lengths")

    def forward(
        self,
        tokens: torch.Tensor,
        n_positions: torch.Tensor | None = None,
        return_type: str | None = "logits",
        *,
        start_at_layer: int | None = None,
        stop_at_layer: int | None = None,
        readout_only: bool = False,
    ) -> torch.Tensor | None:
        """Logits [batch, pos, d_vocab_out].

        ``start_at_layer=l``: ``tokens`` is the residual stream [batch, pos, d_model] entering
        block l (TransformerLens's convention). ``stop_at_layer=l``: return the residual stream
        entering block l instead of logits. ``readout_only``: compute the last layer only at the
        readout position (``cfg.readout_position``, for a sigmoid or logits readout): logits
        [batch, 1, d_vocab_out], what training reads, at a fraction of the cost.
        """
        if return_type not in ("logits", None):
            raise ExactLensError(f"return_type must be 'logits' or None, got {return_type!r}")
        tokens, n_positions = self.on_device(tokens, n_positions)
        start, stop = self._layer_range(start_at_layer, stop_at_layer)
        if start > 0:
            n_positions, padded = self._check_residual(tokens, n_positions)
        else:
            n_positions, padded = self._check_input(tokens, n_positions)
        out = self.run(tokens, n_positions, padded, start=start, stop=stop, readout_only=readout_only)
        return None if return_type is None and stop == self.cfg.n_layers else out

    def run(
        self,
        inputs: torch.Tensor,
        n_positions: torch.Tensor,
        padded: bool,
        *,
        start: int = 0,
        stop: int | None = None,
        readout_only: bool = False,
    ) -> torch.Tensor:
        """The forward pass on checked input (``forward`` checks; ``exactlens.model.stacked`` maps this
        over many runs at once). ``padded`` says whether some row is shorter than the tensor."""
        cfg = self.cfg
        stop = cfg.n_layers if stop is None else stop
        n_pos = inputs.shape[1]
        masks = set(cfg.per_layer("attention_mask"))
        allowed = {mask: visible_keys(mask, n_pos, n_positions, padded) for mask in masks}
        if start == 0:
            x = self.hook_embed(self.embed(inputs)) + self.hook_pos_embed(self.pos_embed(n_pos, n_positions, padded))
        else:
            x = inputs
        rows = None
        if readout_only and stop == cfg.n_layers and cfg.readout != "per_position":  # the readout's rows only
            pos = cfg.readout_position  # one position for every row: a slice, else one index per row
            rows = pos if pos >= 0 else self.readout_rows(n_positions)
        for layer in range(start, stop):
            block = self.blocks[layer]
            x = block(x, allowed[block.attn.mask], n_positions, rows if layer == cfg.n_layers - 1 else None)
        if stop < cfg.n_layers:
            return x
        if rows is not None and cfg.n_layers == start:  # no layer ran: select the readout row here
            x = gather_rows(x, rows)
        if cfg.final_ln:
            x = self.ln_final(x)
        return self.unembed(x)

    def _layer_range(self, start: int | None, stop: int | None) -> tuple[int, int]:
        n = self.cfg.n_layers
        start = 0 if start is None else start
        stop = n if stop is None else stop
        for name, value in (("start_at_layer", start), ("stop_at_layer", stop)):
            if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= n:
                raise ExactLensError(f"{name} must be an integer in [0, n_layers={n}], got {value!r}")
        if start > stop:
            raise ExactLensError(f"start_at_layer={start} is after stop_at_layer={stop}")
        return start, stop

    def _check_residual(self, resid: Any, n_positions: Any) -> tuple[torch.Tensor, bool]:
        cfg = self.cfg
        if not isinstance(resid, torch.Tensor) or resid.ndim != 3 or resid.shape[-1] != cfg.d_model:
            shape = tuple(resid.shape) if isinstance(resid, torch.Tensor) else type(resid).__name__
            raise ExactLensError(
                f"with start_at_layer the input is the residual stream [batch, pos, d_model={cfg.d_model}], got {shape}"
            )
        if resid.dtype != cfg.torch_dtype:
            raise ExactLensError(f"the residual stream must have the model's dtype {cfg.dtype}, got {resid.dtype}")
        if resid.shape[0] == 0 or resid.shape[1] == 0:
            raise ExactLensError(f"the residual stream must have batch >= 1 and pos >= 1, got {tuple(resid.shape)}")
        return self._check_positions(resid.shape[0], resid.shape[1], n_positions, resid.device)

    def readout_rows(self, n_positions: torch.Tensor) -> torch.Tensor | None:
        """The position the readout reads in each row [batch] (a negative readout_position counts from
        each row's last real position); None for a per-position readout."""
        if self.cfg.readout == "per_position":
            return None
        pos = self.cfg.readout_position
        return torch.full_like(n_positions, pos) if pos >= 0 else n_positions + pos

    def readout(
        self,
        tokens: torch.Tensor,
        n_positions: torch.Tensor | None = None,
        *,
        readout_only: bool = False,
        max_score_bytes: int | None = None,
    ) -> torch.Tensor:
        """What the model answers, by cfg.readout: the logit [batch] (sigmoid), the logits at the
        readout position [batch, d_vocab_out] (logits), or every position's [batch, pos, d_vocab_out]
        (per_position). ``max_score_bytes``: evaluate in chunks of rows whose attention scores stay
        under this many bytes (long inputs). ``readout_only``: see ``forward``."""
        tokens, n_positions = self.on_device(tokens, n_positions)
        n_positions_checked, _ = self._check_input(tokens, n_positions)
        if max_score_bytes is not None:
            n_pos = tokens.shape[1]
            per_row = self.cfg.n_heads * n_pos * n_pos * torch.finfo(self.cfg.torch_dtype).bits // 8 * 4
            chunk = max(1, max_score_bytes // max(per_row, 1))
            if chunk < tokens.shape[0]:
                parts = [
                    self.readout(
                        tokens[i : i + chunk], None if n_positions is None else n_positions[i : i + chunk],
                        readout_only=readout_only,
                    )
                    for i in range(0, tokens.shape[0], chunk)
                ]
                return torch.cat(parts)
        logits = self(tokens, n_positions, readout_only=readout_only)
        return self.select_readout(logits, n_positions_checked)

    def select_readout(self, logits: torch.Tensor, n_positions: torch.Tensor) -> torch.Tensor:
        """The readout's outputs from forward's logits (full [batch, pos, out] or readout-only [batch, 1, out])."""
        if self.cfg.readout == "per_position":
            return logits
        if logits.shape[1] == 1:
            at = logits[:, 0]
        else:
            at = gather_rows(logits, self.readout_rows(n_positions))[:, 0]
        return at[:, 0] if self.cfg.readout == "sigmoid" else at

    def readout_logits(self, tokens: torch.Tensor, n_positions: torch.Tensor | None = None) -> torch.Tensor:
        """For a sigmoid readout: the logit at cfg.readout_position, [batch]."""
        if self.cfg.readout != "sigmoid":
            raise ExactLensError(f"readout_logits needs readout='sigmoid', this model has {self.cfg.readout!r}")
        return self.readout(tokens, n_positions)

    # ---- TransformerLens habits: tokens through the model's task ---------------------------

    def _task(self) -> Any:
        from exactlens.tasks import of_model

        return of_model(self)

    def to_tokens(self, words: str | Sequence[str | Sequence[str]]) -> torch.Tensor:
        """Token ids [batch, pos] of words of one length of the model's task (its tokenizer adds [CLS]/[EOS]).

        Words of different lengths are refused: their padding is a real token id, which the model would read
        as symbols; ``to_tokens_and_positions`` gives the padded batch with n_positions, which the model masks."""
        tokens, n_positions = self.to_tokens_and_positions(words)
        if len(n_positions) and bool((n_positions != n_positions[0]).any()):
            raise ExactLensError(
                f"to_tokens: the words have different lengths ({sorted(set(n_positions.tolist()))} positions); "
                "padding them would add real symbols. Use tokens, n_positions = model.to_tokens_and_positions(words) "
                "and model(tokens, n_positions=n_positions) (padding masked), or words of one length")
        return tokens

    def to_tokens_and_positions(self, words: str | Sequence[str | Sequence[str]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens [batch, pos], n_positions [batch]): pass both to the model for padded batches."""
        batch = self._task().tokenize([words] if isinstance(words, str) else list(words))
        return batch.tokens, batch.n_positions

    def to_str_tokens(self, tokens: str | torch.Tensor | Sequence[int]) -> list[str] | list[list[str]]:
        """Token names (cfg.vocab) of one sequence [pos] (a list) or of a batch [batch, pos] (a list of
        lists); a word is tokenized first."""
        if isinstance(tokens, str):
            tokens = self.to_tokens(tokens)[0]
        tokens = torch.as_tensor(tokens)
        vocab = self.cfg.vocab or tuple(str(i) for i in range(self.cfg.d_vocab))
        if tokens.ndim == 2:
            return [[vocab[int(t)] for t in row] for row in tokens]
        return [vocab[int(t)] for t in tokens]

    def to_string(self, tokens: torch.Tensor | Sequence[int]) -> str | list[str]:
        """The word(s) the tokens spell, special tokens ([CLS], [EOS]) left out."""
        if self.cfg.task is not None:
            task = self._task()
            specials = set(task.vocab) - set(task.alphabet)
        else:
            specials = {name for name in (self.cfg.vocab or ()) if name.startswith("[")}
        tokens = torch.as_tensor(tokens)
        rows = tokens.unsqueeze(0) if tokens.ndim == 1 else tokens
        joined = ["".join(t for t in row if t not in specials) for row in self.to_str_tokens(rows)]
        return joined[0] if tokens.ndim == 1 else joined

    def tokens_to_residual_directions(self, tokens: int | torch.Tensor | Sequence[int]) -> torch.Tensor:
        """The residual-stream direction of each *output* (a column of W_U) [..., d_model]: what
        ``ActivationCache.logit_attrs`` and direct logit attribution read. Outputs are the readout's
        classes (index 0 is the single logit of a sigmoid readout), not input tokens."""
        self._warn_post_ln()
        index = torch.as_tensor(tokens, dtype=torch.long)
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= self.cfg.d_vocab_out):
            raise ExactLensError(f"outputs index the readout's {self.cfg.d_vocab_out} classes, got {index.tolist()}")
        return self.W_U[:, index].movedim(0, -1)

    def accumulated_bias(self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True) -> torch.Tensor:
        """The output biases (attention b_O, FFN b_out) written to the residual stream before layer ``layer``'s
        input (``mlp_input``: also that layer's attention b_O), [d_model]: what TransformerLens's
        ``ActivationCache.get_full_resid_decomposition`` adds as its bias term."""
        if not 0 <= layer <= self.cfg.n_layers or (mlp_input and layer == self.cfg.n_layers):
            raise ExactLensError(f"accumulated_bias: layer must be in 0..{self.cfg.n_layers} (an MLP input: below "
                                 f"{self.cfg.n_layers}), got {layer}")
        self._warn_post_ln()
        total = torch.zeros(self.cfg.d_model, dtype=self.cfg.torch_dtype, device=self.W_E.device)
        for i in range(layer + int(mlp_input)):
            block = self.blocks[i]
            b_o = getattr(block.attn, "b_O", None)
            total = total + (b_o if b_o is not None else 0)
            mlp = getattr(block, "mlp", None)
            if include_mlp_biases and i < layer and mlp is not None and getattr(mlp, "b_out", None) is not None:
                total = total + mlp.b_out
        return total

    def _warn_post_ln(self) -> None:
        """Once per model: a post-LN model's residual stream is not the sum of its components' writes."""
        if "post" in self.cfg.per_layer("normalization") and not getattr(self, "_warned_post_ln", False):
            self._warned_post_ln = True
            warnings.warn(
                f"{self.cfg.model_name} is post-LN: each layer norm rescales the stream after the residual add, so "
                "logit attributions and residual decompositions of its hooks are not additive (their sum is not "
                "the logit)", UserWarning, stacklevel=3)

    def run_with_cache(self, *args: Any, **kwargs: Any) -> tuple[Any, ActivationCache]:
        """Like HookedRootModule.run_with_cache, with a TransformerLens ActivationCache."""
        out, cache = super().run_with_cache(*args, **kwargs)
        has_batch = not kwargs.get("remove_batch_dim", False)
        return out, ActivationCache(cache, self, has_batch_dim=has_batch)

    def set_fused(self, fused: bool) -> ExactTransformer:
        """Compute layer norms and softmax attention through torch's fused kernels where no hook
        reads their insides (the training loop does this; rounding differs from the formulas in the
        last bits, so the default, used for constructions and analysis, is off)."""
        for module in self.modules():
            if hasattr(module, "fused"):
                module.fused = bool(fused)
        return self

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

    # Every layer's attention weights, stacked [n_layers, n_heads, ...] (HookedTransformer's names).
    W_Q = property(lambda self: self._stack("W_Q"))
    W_K = property(lambda self: self._stack("W_K"))
    W_V = property(lambda self: self._stack("W_V"))
    W_O = property(lambda self: self._stack("W_O"))

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

    def init_weights(
        self, seed: int | None = None, *, generator: torch.Generator | None = None, scale: float = 1.0
    ) -> ExactTransformer:
        """Random weights for training: PyTorch's default initialization (exactlens.model.init),
        every draw times ``scale``; LN gains 1, biases as PyTorch sets them. Seeded by ``seed`` or
        drawn from ``generator``."""
        from exactlens.model.init import initialize

        if generator is None:
            generator = torch.Generator().manual_seed(seed) if seed is not None else torch.Generator()
        initialize(self, generator, scale=scale)
        return self

    def check_finite(self) -> None:
        bad = [n for n, p in self.state_dict().items() if p.is_floating_point() and not torch.isfinite(p).all()]
        if bad:
            raise ExactLensError(f"weights contain NaN or inf: {bad}")

    # ---- save / load ---------------------------------------------------------

    def save(self, directory: str | Path, *, overwrite: bool = False) -> Path:
        """Write config.json (the ExactConfig) and weights.pt (the state dict) as a new directory, in one
        step (exactlens.outputs.staged): an existing non-empty ``directory`` is refused unless
        ``overwrite``, and it is replaced only once the new checkpoint is complete. Non-finite weights
        are refused (``load`` would refuse them)."""
        from exactlens.outputs import staged

        self.check_finite()
        with staged(directory, overwrite=overwrite, what="checkpoint") as tmp:
            self.write_checkpoint(tmp)
        return Path(directory)

    def write_checkpoint(self, directory: Path) -> None:
        """config.json + weights.pt into an existing directory (the staging directory of ``save`` or of a
        training run; use ``save`` to write a checkpoint safely)."""
        from exactlens.outputs import failed_write, naming

        with naming(directory / CONFIG_FILE):
            (directory / CONFIG_FILE).write_text(self.cfg.to_json() + "\n")
        try:
            torch.save(self.state_dict(), directory / WEIGHTS_FILE)
        except RuntimeError as err:  # torch reports a failed write (a full disk, ulimit -f) as a RuntimeError
            raise failed_write(directory / WEIGHTS_FILE, err) from err

    @classmethod
    def load(cls, directory: str | Path) -> ExactTransformer:
        """Load a saved model; say exactly what differs when weights and config disagree."""
        directory = Path(directory)
        for name in (CONFIG_FILE, WEIGHTS_FILE):
            if not (directory / name).is_file():
                raise ExactLensError(f"{directory} is not an exactlens checkpoint: {name} is missing")
        config_path = directory / CONFIG_FILE
        try:
            text = config_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            reason = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
            raise ExactLensError(f"cannot read {config_path}: {reason}") from err
        try:
            cfg = ExactConfig.from_dict(json.loads(text))
        except json.JSONDecodeError as err:
            raise ExactLensError(f"{config_path} is not valid JSON: {err}") from err
        except RecursionError:  # JSON nested thousands of levels deep
            raise ExactLensError(f"{config_path} is nested too deeply to be a config (a config is one object of "
                                 "fields)") from None
        except ExactLensError as err:
            raise ExactLensError(f"{config_path}: {err}") from err
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as err:  # a field of the wrong type
            raise ExactLensError(f"{config_path} does not describe a model: {type(err).__name__}: {err}") from err
        model = cls(cfg)
        try:
            state = torch.load(directory / WEIGHTS_FILE, map_location="cpu", weights_only=True)
        except Exception as err:  # torch raises UnpicklingError, EOFError, RuntimeError ... for a bad file
            raise ExactLensError(f"{directory / WEIGHTS_FILE} is not a readable torch state dict "
                                 f"(weights_only loading; {type(err).__name__}: {_load_reason(err)})") from None
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

    def to_hooked_transformer(self, length: int | None = None, *, positions: int | None = None,
                              symbols: int | None = None):
        """A TransformerLens 3.x HookedTransformer with the same outputs (see exactlens.model.export): built for
        ``positions`` (``length``: its older name; special tokens included) or ``symbols`` (a word's length)."""
        from exactlens.model.export import to_hooked_transformer

        return to_hooked_transformer(self, length=length, positions=positions, symbols=symbols)

    def to_bridge(self, length: int | None = None, *, positions: int | None = None,
                  symbols: int | None = None):
        """A TransformerLens 4.x TransformerBridge with the same outputs (see exactlens.model.export): built for
        ``positions`` (``length``: its older name; special tokens included) or ``symbols`` (a word's length)."""
        from exactlens.model.export import to_bridge

        return to_bridge(self, length=length, positions=positions, symbols=symbols)
