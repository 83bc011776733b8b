"""A smaller cross-encoder distilled from a larger one (``hybridrag train cross-encoder --teacher T --layers N``).

* **Student start.** ``--layers N`` keeps N of the init model's transformer layers, evenly spaced and always the last
  (6 -> 2 keeps layers 2 and 5, as DistilBERT and TinyBERT-style students do), with its embeddings, pooler and
  head. An init folder may hold only an ONNX export (the shared models do: no torch weights); its weights are read
  back from the graph (:func:`onnx_state_dict`).
* **Targets.** The teacher (an ONNX cross-encoder, run by ONNX Runtime as it is served) scores every pair of each
  training step; the loss is the KL divergence from the teacher's softmax over each group to the student's
  (listwise distillation), mixed with the label loss by ``distill_weight`` (1 = the teacher alone).

Needs torch, transformers and onnx (the ``bench`` extra); imported inside the functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from index_builder.errors import ModelError


def kept_layers(total: int, keep: int) -> list[int]:
    """``keep`` of ``total`` layer indices, evenly spaced, the last one always kept.

    >>> kept_layers(6, 2), kept_layers(6, 3), kept_layers(6, 6)
    ([2, 5], [1, 3, 5], [0, 1, 2, 3, 4, 5])
    """
    if not 1 <= keep <= total:
        raise ModelError(f"--layers must be in [1, {total}] (the init model has {total}), got {keep}")
    return [round((i + 1) * total / keep) - 1 for i in range(keep)]


def onnx_state_dict(onnx_path: Path) -> dict[str, np.ndarray]:
    """The transformers state dict of a BERT sequence-classification model exported to ONNX.

    Named initializers keep their module names (``m.`` prefix of the export wrapper dropped). Linear weights were
    folded into anonymous MatMul constants, stored transposed: each is named after the bias its MatMul output is
    added to (``X.bias`` -> ``X.weight``, transposed back)."""
    import onnx
    from onnx import numpy_helper

    graph = onnx.load(str(onnx_path)).graph
    init = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}

    def clean(name: str) -> str:
        return name[2:] if name.startswith("m.") else name

    state = {clean(n): a for n, a in init.items() if not n.startswith("onnx::")}
    for node in graph.node:
        if node.op_type != "Add":
            continue
        bias = next((i for i in node.input if i in init and i.endswith(".bias")), None)
        other = next((i for i in node.input if i != bias), None)
        matmul = producer.get(other or "")
        if bias is None or matmul is None or matmul.op_type != "MatMul":
            continue
        weight = next((i for i in matmul.input if i in init), None)
        if weight is not None:
            state[clean(bias)[:-len("bias")] + "weight"] = init[weight].T.copy()
    # the classifier (a Gemm or MatMul without a named bias in some exports)
    for node in graph.node:
        if node.op_type == "Gemm" and len(node.input) == 3:
            w, b = node.input[1], node.input[2]
            if b in init and w in init:
                key = clean(b)[:-len("bias")] + "weight"
                transposed = any(a.name == "transB" and a.i == 1 for a in node.attribute)
                state.setdefault(key, init[w] if transposed else init[w].T.copy())
    return state


def load_student(init: Path, layers: int, torch: Any, transformers: Any) -> Any:
    """A ``BertForSequenceClassification`` from ``init`` (torch weights, or an ONNX export only) with ``layers``
    of its transformer layers (0 = all)."""
    config = transformers.AutoConfig.from_pretrained(str(init), local_files_only=True)
    total = config.num_hidden_layers
    keep = kept_layers(total, layers or total)
    config.num_labels = 1
    has_torch = any((init / f).is_file() for f in ("model.safetensors", "pytorch_model.bin"))
    if has_torch:
        full = transformers.AutoModelForSequenceClassification.from_pretrained(
            str(init), num_labels=1, local_files_only=True, attn_implementation="eager")
        state = {k: v.detach().cpu().numpy() for k, v in full.state_dict().items()}
    elif (init / "model.onnx").is_file():
        state = onnx_state_dict(init / "model.onnx")
    else:
        raise ModelError(f"{init}: neither torch weights (model.safetensors) nor model.onnx")
    config.num_hidden_layers = len(keep)
    student = transformers.AutoModelForSequenceClassification.from_config(config, attn_implementation="eager")
    mapped: dict[str, Any] = {}
    for key, value in state.items():
        if ".encoder.layer." in key:
            head, rest = key.split(".encoder.layer.", 1)
            idx, tail = rest.split(".", 1)
            if int(idx) not in keep:
                continue
            key = f"{head}.encoder.layer.{keep.index(int(idx))}.{tail}"
        mapped[key] = torch.from_numpy(np.array(value, copy=True))
    own = student.state_dict()
    # a bi-encoder init has no pooler or head: those keep their fresh initialisation
    missing = [k for k in own if k not in mapped and not k.endswith("position_ids")
               and not k.startswith(("classifier.", "bert.pooler."))]
    if missing:
        raise ModelError(f"{init}: weights not found for {len(missing)} parameters, e.g. {missing[:3]}")
    shapes = [k for k in own if k in mapped and tuple(own[k].shape) != tuple(mapped[k].shape)]
    if shapes:
        raise ModelError(f"{init}: weight shapes differ for {shapes[:3]}")
    student.load_state_dict({k: v for k, v in mapped.items() if k in own}, strict=False)
    return student


class Teacher:
    """The teacher's logits for (query, passage) pairs, from its ONNX model as served."""

    def __init__(self, folder: Path, max_length: int, threads: int = 0) -> None:
        from index_builder.models.encoders import CrossEncoder
        from index_builder.settings import CrossEncoderConfig, RuntimeConfig

        # precision "fp32": the teacher's own logits are the targets, not the int8 copy a VNNI CPU would serve
        self.model = CrossEncoder(CrossEncoderConfig(model=str(folder), max_length=max_length, batch_size=64,
                                                     runtime=RuntimeConfig(intra_op_threads=threads),
                                                     precision="fp32"))

    def logits(self, queries: Sequence[str], passages: Sequence[str]) -> np.ndarray:
        return self.model.score(list(zip(queries, passages, strict=True)))


def distill_loss(student_logits: Any, teacher_logits: np.ndarray, torch: Any, temperature: float = 1.0) -> Any:
    """KL(teacher || student) of the softmaxes over each row (a group's documents), mean over the rows."""
    t = torch.tensor(teacher_logits, dtype=torch.float32, device=student_logits.device).view_as(student_logits)
    p = torch.softmax(t / temperature, dim=-1)
    log_q = torch.log_softmax(student_logits / temperature, dim=-1)
    return (p * (torch.log(p + 1e-12) - log_q)).sum(-1).mean() * temperature ** 2
