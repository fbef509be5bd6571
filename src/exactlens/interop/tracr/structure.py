"""Where a compiled program computes each SOp: the metadata ``cfg.metadata["tracr"]`` records for
circuit analysis.

tracr places the craft blocks of the program's SOps (tracr.compiler.nodes.MODEL_BLOCK) into
half-layers: the craft model's blocks in order, each in the next attention (even) or MLP (odd)
half-layer of its type, a skipped half-layer staying zero. Within a layer the heads are in the
order of the layer's MultiAttentionHead, and the MLP hidden neurons in the order of the combined
MLP's hidden basis. A neuron may serve several SOps: tracr merges equal hidden directions of MLPs
in one layer (the ``_hidden_clean_bos_`` neuron of every selector width).
"""

from __future__ import annotations

from typing import Any

from exactlens.errors import ExactLensError
from exactlens.interop.tracr import deps
from exactlens.interop.tracr.program import is_primitive, sop_inputs, sops
from exactlens.jsonio import jsonable


def placed_blocks(craft_model: Any) -> list[tuple[int, str, Any]]:
    """(layer, "attn" or "mlp", block) of every block of the craft model, as tracr assembles them."""
    transformers = deps.craft().transformers
    half = 0  # half-layer index: 2l is layer l's attention, 2l + 1 its MLP
    out = []
    for block in craft_model.blocks:
        kind = "mlp" if isinstance(block, transformers.MLP) else "attn"
        while half % 2 != (1 if kind == "mlp" else 0):
            half += 1
        out.append((half // 2, kind, block))
        half += 1
    return out


def _labels(space: Any, order: dict[str, int]) -> list[str]:
    return sorted({str(d) for d in space.basis}, key=lambda label: order.get(label, len(order)))


def components(compiled: Any) -> list[dict[str, Any]]:
    """One entry per (SOp, head) and (SOp, MLP) of the compiled model: the component ("L0.H1",
    "L0.MLP"), the SOp's label, the residual labels it reads (split into query, key and value for a
    head) and writes, and an MLP's hidden neurons."""
    craft = deps.craft()
    nodes = deps.compiler().nodes
    order = {str(label): i for i, label in enumerate(compiled.assembled.residual_labels)}
    head_at: dict[int, tuple[int, int]] = {}
    mlp_layers = []
    for layer, kind, block in placed_blocks(compiled.craft_model):
        if kind == "attn":
            for index, head in enumerate(block.as_multi().heads()):
                head_at[id(head)] = (layer, index)
        else:
            mlp_layers.append((layer, block))
    out = []
    for sop in sops(compiled.program):
        block = compiled.graph.nodes[sop.label].get(nodes.MODEL_BLOCK)
        if block is None:
            continue
        parts = block.blocks if isinstance(block, craft.transformers.SeriesWithResiduals) else [block]
        for part in parts:
            if isinstance(part, craft.transformers.MLP):
                out.append(_mlp_entry(sop, part, mlp_layers, order))
                continue
            for head in part.as_multi().heads():
                if id(head) not in head_at:
                    raise ExactLensError(f"the head computing {sop.label} is in no layer of the compiled model")
                layer, index = head_at[id(head)]
                query = _labels(head.w_qk.left_space, order)
                key = _labels(head.w_qk.right_space, order)
                value = _labels(head.w_ov.input_space, order)
                out.append({
                    "component": f"L{layer}.H{index}", "layer": layer, "head": index, "sop": sop.label,
                    "query": query, "key": key, "value": value,
                    "reads": sorted(set(query) | set(key) | set(value), key=order.__getitem__),
                    "writes": _labels(head.w_ov.output_space, order),
                })
    return out


def _mlp_entry(sop: Any, mlp: Any, mlp_layers: list[tuple[int, Any]], order: dict[str, int]) -> dict[str, Any]:
    hidden = list(mlp.fst.output_space.basis)
    outputs = set(mlp.snd.output_space.basis)
    found = [(layer, block) for layer, block in mlp_layers
             if set(hidden) <= set(block.fst.output_space.basis) and outputs <= set(block.snd.output_space.basis)]
    if len(found) != 1:
        raise ExactLensError(f"the MLP computing {sop.label} is in {len(found)} MLP layers of the compiled model, "
                             "expected exactly one")
    layer, block = found[0]
    index = {d: i for i, d in enumerate(block.fst.output_space.basis)}
    return {
        "component": f"L{layer}.MLP", "layer": layer, "sop": sop.label,
        "neurons": sorted(index[d] for d in hidden),
        "reads": _labels(mlp.fst.input_space, order),
        "writes": _labels(mlp.snd.output_space, order),
    }


def sop_table(compiled: Any, entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every SOp of the program: label, name, RASP type, encoding, values (a categorical SOp's value set
    in its residual order; None for a numerical one), its residual labels and the components computing it."""
    rasp = deps.rasp()
    nodes = deps.compiler().nodes
    out = []
    for sop in sops(compiled.program):
        node = compiled.graph.nodes[sop.label]
        basis = node.get(nodes.OUTPUT_BASIS, [])
        categorical = rasp.is_categorical(sop)
        out.append({
            "label": sop.label, "name": sop.name, "type": type(sop).__name__,
            "encoding": "categorical" if categorical else "numerical",
            "values": jsonable([d.value for d in basis]) if categorical else None,
            "residual": [str(d) for d in basis],
            "input": is_primitive(sop),
            "components": [e["component"] for e in entries if e["sop"] == sop.label],
        })
    return out


def sop_edges(compiled: Any) -> list[dict[str, str]]:
    """The SOp dependency edges of the program: {"from", "to", "role"} with role input (Map), fst/snd
    (SequenceMap), value/key/query (Aggregate; SelectorWidth: key/query)."""
    edges = []
    for sop in sops(compiled.program):
        seen = set()
        for role, child in sop_inputs(sop):
            if (role, child.label) not in seen:
                seen.add((role, child.label))
                edges.append({"from": child.label, "to": sop.label, "role": role})
    return edges


def describe(compiled: Any) -> dict[str, Any]:
    """components, sops and edges (the circuit part of cfg.metadata["tracr"])."""
    entries = components(compiled)
    return {"components": entries, "sops": sop_table(compiled, entries), "edges": sop_edges(compiled)}
