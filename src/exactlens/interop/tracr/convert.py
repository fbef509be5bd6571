"""tracr's compiled transformers as ExactTransformers, weight for weight.

A tracr model (``AssembledTransformerModel``) is a post-norm-free transformer: token and position
embeddings (position embedding row 0 is zero, row p >= 1 holds ``indices:p-1``, so the BOS token at
position 0 has no index), per layer softmax attention with logits / sqrt(key_size) and a ReLU MLP,
both with biases, and an unembedding that projects the residual stream onto the output SOp's space
(categorical: the argmax over its values; numerical: the value of its one dimension). exactlens has
every piece: ``normalization="none"``, ``act_fn="relu"``, ``attn_scale=None`` (sqrt(d_head)),
``positional_features=("learned",)`` with ``n_ctx = max_seq_len + 1``, ``readout="per_position"``.

Vocabulary: the input tokens as strings in tracr's token order (the rows of its token embedding),
then tracr's BOS token under its own name (``compiler_bos``). tracr's PAD token is left out: exactlens
masks padding by ``n_positions``. Weights are tracr's float32 values; ``dtype="float64"`` computes
with them in float64.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from exactlens.dtypes import dtype_name
from exactlens.errors import ExactLensError
from exactlens.interop.tracr import deps
from exactlens.interop.tracr.compile import CompiledProgram
from exactlens.interop.tracr.structure import describe
from exactlens.jsonio import jsonable
from exactlens.model import ExactConfig, ExactTransformer

PAPER = "Lindner et al. 2023 (tracr)"


def _array(params: dict[str, Any], module: str, name: str) -> np.ndarray:
    try:
        return np.asarray(params[module][name], dtype=np.float64)
    except KeyError:
        raise ExactLensError(f"the tracr model has no parameter {module}/{name}") from None


def output_projection(assembled: Any) -> np.ndarray:
    """tracr's unembedding as a matrix [d_model, outputs]: the projection onto the output SOp's space,
    read by applying the model's own unembed module (no argmax) to the identity."""
    try:
        import haiku as hk
        import jax.numpy as jnp
    except ImportError as err:
        raise ExactLensError(f"{deps.INSTALL_HINT} ({err})") from err
    d_model = len(assembled.residual_labels)

    def unembed(x: Any) -> Any:
        return assembled.get_compiled_model().unembed(x, use_unembed_argmax=False)

    apply = hk.without_apply_rng(hk.transform(unembed))
    eye = jnp.eye(d_model)
    matrix = np.asarray(apply.apply(apply.init(None, eye), eye), dtype=np.float64)
    return matrix.reshape(d_model, -1)


def input_tokens(assembled: Any) -> tuple[list[Any], str, str | None, list[int]]:
    """(input values in tracr's token order, BOS name, PAD name, their token-embedding rows with BOS last)."""
    encoder = assembled.input_encoder
    if encoder is None or not getattr(encoder, "bos_token", None) or not hasattr(encoder, "encoding_map"):
        raise ExactLensError("the tracr model has no categorical input encoder with a BOS token; exactlens reads "
                             "models compiled with compiler_bos (tracr's compile_rasp_to_model always sets one)")
    bos, pad = encoder.bos_token, encoder.pad_token
    ordered = sorted(encoder.encoding_map.items(), key=lambda item: item[1])
    values = [v for v, _ in ordered if v not in (bos, pad)]
    names = [str(v) for v in values]
    if len(set(names)) != len(names) or bos in names:
        raise ExactLensError(f"the tracr model's tokens {values} (BOS {bos!r}) do not have distinct names")
    rows = [encoder.encoding_map[v] for v in values] + [encoder.encoding_map[bos]]
    return values, bos, pad, rows


def output_values(assembled: Any) -> list[Any] | None:
    """The output SOp's values in output order (categorical), or None (numerical output)."""
    encoder = assembled.output_encoder
    if encoder is not None and hasattr(encoder, "encoding_map"):
        return [v for v, _ in sorted(encoder.encoding_map.items(), key=lambda item: item[1])]
    return None


def _is_assembled(obj: Any) -> bool:
    """Whether ``obj`` is tracr's AssembledTransformerModel (its class where tracr is importable; else
    what from_tracr reads of it)."""
    try:
        from tracr.compiler.assemble import AssembledTransformerModel
    except ImportError:
        return all(hasattr(obj, a) for a in ("params", "model_config", "residual_labels", "get_compiled_model"))
    return isinstance(obj, AssembledTransformerModel)


def from_tracr(model: Any, *, dtype: str = "float32", task: Any = None) -> ExactTransformer:
    """An ExactTransformer with the weights of a compiled tracr model (module docstring).

    ``model``: a :class:`CompiledProgram` (from :func:`compile_program` or a registered program;
    then ``cfg.metadata["tracr"]`` also records, per head and MLP, the SOp it computes and the residual
    labels it reads and writes, and the program's SOp graph) or tracr's ``AssembledTransformerModel``.
    ``task``: the Task the model answers (its vocabulary must be the model's); by default a registered
    program's :class:`TracrTask`, else none."""
    compiled = model if isinstance(model, CompiledProgram) else None
    assembled = compiled.assembled if compiled is not None else model
    if not _is_assembled(assembled):
        raise ExactLensError("from_tracr takes a CompiledProgram or tracr's AssembledTransformerModel, got "
                             f"{type(model).__name__}")
    dtype = dtype_name(dtype)
    cfg_t = assembled.model_config
    if cfg_t.layer_norm:
        raise ExactLensError("the tracr model uses layer norm; tracr's compiler never does and exactlens reads "
                             "only compiled models (layer_norm=False)")
    if getattr(cfg_t.activation_function, "__name__", "") != "relu":
        raise ExactLensError(f"the tracr model's MLP activation is {cfg_t.activation_function!r}, not ReLU")
    params = assembled.params
    labels = tuple(str(label) for label in assembled.residual_labels)
    values, bos, pad, rows = input_tokens(assembled)
    token_embed = _array(params, "token_embed", "embeddings")
    pos_embed = _array(params, "pos_embed", "embeddings")
    unembed = output_projection(assembled)
    outputs = output_values(assembled)
    if outputs is not None and len(outputs) != unembed.shape[1]:
        raise ExactLensError(f"the tracr model decodes {len(outputs)} output values from {unembed.shape[1]} outputs")
    max_seq_len = pos_embed.shape[0] - 1
    heads, key_size, layers = cfg_t.num_heads, cfg_t.key_size, cfg_t.num_layers
    cfg = ExactConfig(
        d_model=len(labels), n_layers=layers, d_vocab=len(rows), n_heads=heads, d_head=key_size,
        d_mlp=cfg_t.mlp_hidden_size, d_vocab_out=unembed.shape[1],
        attention_mask="causal" if cfg_t.causal else "none", attention_weighting="softmax", attn_scale=None,
        normalization="none", act_fn="relu", positional_features=("learned",), n_ctx=pos_embed.shape[0],
        readout="per_position", residual_labels=labels, vocab=tuple(str(v) for v in values) + (bos,),
        dtype=dtype, model_name=f"tracr-{compiled.name}" if compiled is not None and compiled.name else "tracr",
    )
    record: dict[str, Any] = {
        "program": compiled.name if compiled is not None else None,
        "output": {"sop": compiled.program.label if compiled is not None else None,
                   "encoding": "categorical" if outputs is not None else "numerical",
                   "values": jsonable(outputs) if outputs is not None else None},
        "vocab": jsonable(values), "compiler_bos": bos, "compiler_pad": pad, "max_seq_len": max_seq_len,
        "causal": bool(cfg_t.causal), "mlp_exactness": compiled.mlp_exactness if compiled is not None else None,
        "positions": "position 0 is BOS (no index); position p >= 1 holds indices:p-1",
    }
    if compiled is not None:
        record.update(describe(compiled))
    cfg.metadata.update({"paper": PAPER, "max_length": max_seq_len, "tracr": record})
    out = ExactTransformer(cfg)
    _load(out, params, token_embed[rows], pos_embed, unembed, heads, key_size)
    if task is None and compiled is not None and compiled.name is not None:
        from exactlens.interop.tracr.task import TracrTask

        task = TracrTask(compiled.name, max_seq_len=compiled.max_seq_len)
    if task is not None:
        if tuple(task.vocab) != cfg.vocab:
            raise ExactLensError(f"the task's vocabulary {list(task.vocab)} is not the tracr model's {list(cfg.vocab)}")
        cfg.task = task.spec()
    out.eval()
    return out


def _load(model: ExactTransformer, params: dict[str, Any], embed: np.ndarray, pos: np.ndarray,
          unembed: np.ndarray, heads: int, key_size: int) -> None:
    dtype = model.cfg.torch_dtype

    def put(parameter: torch.nn.Parameter, value: np.ndarray) -> None:
        tensor = torch.as_tensor(value, dtype=torch.float64).to(dtype)
        if tensor.shape != parameter.shape:
            raise ExactLensError(f"a tracr weight of shape {tuple(tensor.shape)} does not fit {tuple(parameter.shape)}")
        parameter.data.copy_(tensor)

    def split(w: np.ndarray) -> np.ndarray:  # [d_model, heads * key] -> [heads, d_model, key]
        return w.reshape(w.shape[0], heads, key_size).transpose(1, 0, 2)

    with torch.no_grad():
        put(model.embed.W_E, embed)
        put(model.pos_embed.W_pos, pos)
        put(model.unembed.W_U, unembed)
        model.unembed.b_U.zero_()
        for layer, block in enumerate(model.blocks):
            prefix = f"transformer/layer_{layer}"
            attn = block.attn
            for name, module in (("Q", "query"), ("K", "key"), ("V", "value")):
                put(getattr(attn, f"W_{name}"), split(_array(params, f"{prefix}/attn/{module}", "w")))
                put(getattr(attn, f"b_{name}"), _array(params, f"{prefix}/attn/{module}", "b").reshape(heads, key_size))
            put(attn.W_O, _array(params, f"{prefix}/attn/linear", "w").reshape(heads, key_size, -1))
            put(attn.b_O, _array(params, f"{prefix}/attn/linear", "b"))
            if block.mlp is not None:
                put(block.mlp.W_in, _array(params, f"{prefix}/mlp/linear_1", "w"))
                put(block.mlp.b_in, _array(params, f"{prefix}/mlp/linear_1", "b"))
                put(block.mlp.W_out, _array(params, f"{prefix}/mlp/linear_2", "w"))
                put(block.mlp.b_out, _array(params, f"{prefix}/mlp/linear_2", "b"))


def decode_outputs(model: ExactTransformer, outputs: torch.Tensor, n_positions: torch.Tensor | None = None
                   ) -> list[list[Any]]:
    """Outputs of a model made by :func:`from_tracr` ([batch, pos, outputs], the readout) -> per word, the
    decoded value at each symbol position (BOS left out), as tracr's output encoder decodes them:
    the argmax's value (categorical) or the output itself (numerical). Values are JSON values (a tuple
    value reads as a list)."""
    record = model.cfg.metadata.get("tracr")
    if record is None:
        raise ExactLensError(f"model {model.cfg.model_name!r} was not made from a tracr model (no metadata['tracr'])")
    if outputs.ndim != 3:
        raise ExactLensError(f"outputs must be [batch, pos, outputs], got shape {tuple(outputs.shape)}")
    lengths = (n_positions.tolist() if n_positions is not None else [outputs.shape[1]] * outputs.shape[0])
    values = record["output"]["values"]
    rows = []
    for row, n in zip(outputs.detach(), lengths, strict=True):
        symbols = row[1:int(n)]
        if values is None:
            rows.append([float(v) for v in symbols[:, 0]])
        else:
            rows.append([values[int(i)] for i in symbols.argmax(-1)])
    return rows
