"""Model benchmark (issue 5, item 7): ResNet-50 (batch 1 and 8), BERT-base (batch 1, sequence
128) and a LLaMA-style decoder (12 layers, hidden 768, 12 heads, 4 KV heads, vocab 32000;
prefill 128, then 64 greedy decode steps) run by opsnn, onnxruntime and torch eager with the
same weights, in settled blocks in one process; a thin wrapper over ``opsnn bench``
(``opsnn.tools.benchmark``), which holds the logic.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/models.py --repeat 10

torch is optional (``PYTHONPATH=DIR`` with torch installed there); ``--no-torch``,
``--no-ort``, ``--models resnet50,bert``, ``--small`` (tiny configs), ``--dtype bfloat16``
(16-bit weight storage check on ResNet-50). Results: bench/results/models.json.

Targets (issue 5): opsnn decoder ms/token <= 0.8x torch eager; fp16/bf16 storage halves
weight memory with < 1e-2 relative error vs fp32 on ResNet-50 logits.
"""
import sys

from opsnn.tools.benchmark import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
