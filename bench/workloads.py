"""Shared benchmark workloads: the model builders exported to ONNX (the same file goes to
onnxruntime and to opsnn), with deterministic inputs."""

from __future__ import annotations

import opsnn  # before numpy: OpenBLAS reads opsnn's thread timeout and ISA cap when numpy loads it

# isort: split
import numpy as np


def build(name: str, rng, batch: int = 1, seq: int = 128, image: int = 224):
    """``(graph, feeds, onnx_bytes)`` for ``resnet50``, ``bert`` (base), ``bert-tiny``."""
    from opsnn.models import bert, resnet50, to_onnx

    if name == "resnet50":
        proto = to_onnx(resnet50())
        feeds = {proto.graph.input[0].name: rng.standard_normal((batch, 3, image, image)).astype(np.float32)}
    elif name in ("bert", "bert-base", "bert-tiny"):
        proto = to_onnx(bert("tiny" if name == "bert-tiny" else "base"))
        vocab = 100 if name == "bert-tiny" else 30522
        feeds = {
            "input_ids": rng.integers(0, vocab, (batch, seq)).astype(np.int64),
            "attention_mask": np.ones((batch, seq), np.int64),
            "token_type_ids": np.zeros((batch, seq), np.int64),
        }
        names = {i.name for i in proto.graph.input}
        feeds = {k: v for k, v in feeds.items() if k in names}
    else:
        raise SystemExit(f"unknown workload {name!r}")
    data = proto.SerializeToString()
    return opsnn.onnx.load(data), feeds, data


def write_json(obj, path: str, indent: int = 2, default=None) -> None:
    """Write a benchmark's results to ``path`` (folders created) and say where."""
    import json
    import os

    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(obj, f, indent=indent, default=default)
    print(f"wrote {path}")
