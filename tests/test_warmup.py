"""``opsnn warmup``: compiles a model's kernels into the kernel cache ahead of first use, saying
so; the second run finds them cached. Also the first-use notice on the ONNX road."""

import os
import subprocess
import sys

import numpy as np

from opsnn.cli import main
from opsnn.graph import Graph, Node, Value
from opsnn.graph.serialize import save

SRC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")


def _model(path):
    g = Graph(
        "g",
        inputs=[Value("x", np.float32, ("n", 5))],
        outputs=[Value("y")],
        nodes=[Node("Sigmoid", ["x"], ["t"]), Node("Relu", ["t"], ["y"])],
    )
    return save(g, str(path))


def _warmup(args, cache):
    env = dict(os.environ, OPSNN_KERNEL_CACHE_DIR=str(cache), PYTHONPATH=SRC)
    env.pop("NUMBA_CACHE_DIR", None)
    r = subprocess.run(
        [sys.executable, "-m", "opsnn.cli", "warmup", *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stderr
    return r.stdout, r.stderr


def test_warmup_compiles_into_the_cache_then_finds_it_warm(tmp_path):
    model = _model(tmp_path / "m.onnx")
    cache = tmp_path / "kernels"
    out, err = _warmup([model, "--shape", "x=3,5"], cache)
    lines = out.strip().splitlines()
    assert lines[0] == f"opsnn warmup: compiling kernels into {cache}"
    assert lines[-2].startswith(f"[1/1] {model}: compiled ")
    assert int(lines[-1].split()[3]) >= 1  # "opsnn warmup: done, N compiled"
    # not a terminal: the first compile says so in one line on stderr (the ONNX road's notice)
    notices = [ln for ln in err.splitlines() if ln.startswith("opsnn: compiling kernels on first use")]
    assert len(notices) == 1, err
    assert any(os.scandir(cache)), "nothing was written to the kernel cache"
    out, err = _warmup([model, "--shape", "x=3,5"], cache)
    assert out.strip().splitlines()[-2].startswith(f"[1/1] {model}: all kernels cached (")
    assert out.strip().splitlines()[-1] == "opsnn warmup: done, 0 compiled"
    assert "compiling kernels on first use" not in err


def test_warmup_refuses_unknown_model_names(capsys):
    assert main(["warmup", "--models", "resnet50,nope"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("opsnn warmup: ") and "nope" in err and "resnet50,bert,llama" in err
