"""opsnn bench (bench/models.py, peers in bench/peers.py): tiny configs end to end against
onnxruntime; the outputs-agree check and the JSON layout (no timing assertions)."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from opsnn.cli import bench_module

pytest.importorskip("onnxruntime")
benchmark = bench_module("models")
assert benchmark is not None, "bench/models.py not found next to the source tree"


def test_small_run_agrees_and_writes_json(tmp_path, capsys):
    path = tmp_path / "models.json"
    rc = benchmark.main(
        ["--small", "--no-torch", "--repeat", "1", "--warmup", "0", "--dtype", "bfloat16", "--json", str(path)]
    )
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json.loads(path.read_text())
    assert data["agree"] is True and data["small"] is True
    for key in ("command", "env", "versions", "load_average_start", "load_average_end", "models", "repeat"):
        assert key in data
    assert data["platform"].startswith("ISA ") and "GEMM" in data["platform"] and data["platform"] in out
    assert set(data["models"]) == set(benchmark.MODELS) | {"llama_bfloat16"}
    for name, honest in (("resnet50", "resnet_tiny"), ("resnet50_b8", "resnet_tiny_b2"), ("bert", "bert_tiny")):
        row = data["models"][name]
        assert row["model"] == honest and "ResNet-50" not in row["description"]  # --small says what it ran
        assert row["agree"] is True
        assert set(row["latency_ms"]) == {"opsnn", "onnxruntime"}
        assert row["max_rel_err"]["onnxruntime"] <= 1e-3
        for key in ("flops", "ratio_vs", "gflops_per_s", "samples_ms", "description"):
            assert key in row
        assert "torch" in row["skipped"]
    lm = data["models"]["llama"]
    assert lm["agree"] is True and lm["max_rel_err"]["onnxruntime"] <= 1e-3
    for key in ("prefill_ms", "decode_ms_per_token", "tokens_per_s", "ratio_vs", "tokens_match"):
        assert set(lm[key]) >= {"onnxruntime"}
    for key in ("prefill_ms", "decode_ms_per_token", "tokens_per_s"):
        assert "opsnn" in lm[key]
    lb = data["models"]["llama_bfloat16"]  # the decoder with bf16 weights: opsnn alone here (no torch, no ORT)
    assert lb["agree"] is True and lb["dtype"] == "bfloat16" and "onnxruntime" in lb["skipped"]
    assert lb["decode_ms_per_token"]["opsnn"] > 0 and len(lb["samples"]["opsnn"]) >= 1
    st = data["storage_16bit"]
    assert st["passed"] is True and st["stored_dtypes"] == ["bfloat16"]
    assert st["weight_bytes_16bit"] * 2 <= st["weight_bytes_fp32"] * 1.02
    assert st["logits_max_rel_err"] < 1e-2
    # onnxruntime's float32 run timed in the same blocks (torch is not installed here)
    assert st["latency_ms"]["onnxruntime float32"] > 0 and st["peer_rel_err"]["onnxruntime float32"] < 1e-3
    sb = data["bert_16bit"]  # every MatMul of the dynamic-length BERT in bf16, not only ResNet's convs
    assert sb["passed"] is True and sb["stored_dtypes"] == ["bfloat16"] and sb["output"] == "last_hidden_state"
    assert sb["weight_bytes_16bit"] < 0.6 * sb["weight_bytes_fp32"]  # the embeddings stay fp32
    assert "outputs agree: True" in out


def test_flop_counts():
    import opsnn

    net = opsnn.models.resnet50()
    assert 4.0e9 < benchmark.resnet_flops(net, 1, 224) / 2 < 4.2e9  # ~4.1 GMAC
    assert benchmark.resnet_flops(net, 8, 224) == 8 * benchmark.resnet_flops(net, 1, 224)
    cfg = opsnn.models.bert_config("base")
    assert benchmark.bert_flops(cfg, 1, 128) == pytest.approx(
        2 * (12 * (4 * 128 * 768**2 + 2 * 128 * 768 * 3072 + 2 * 128**2 * 768) + 768**2)
    )


def test_capped_run_says_onnxruntime_is_not_capped(monkeypatch):
    from opsnn.runtime import cpu

    # the states OPSNN_CPU_ISA=avx2 gives on an AVX-512 CPU, and an AVX2 CPU running as it is
    monkeypatch.setattr(cpu, "_state", cpu.IsaState("avx2", "avx512_bf16", "OPSNN_CPU_ISA", "avx2"))
    note = benchmark.peer_isa_note()
    assert note is not None and "NOT capped at avx2" in note and "avx512_bf16" in note
    assert "torch is (ATEN_CPU_CAPABILITY=avx2" in note
    monkeypatch.setattr(cpu, "_state", cpu.IsaState("avx2", "avx2", "detected", None))
    assert benchmark.peer_isa_note() is None


def test_capped_benchmarks_cap_their_torch_peer_too(monkeypatch):
    """bench/train.py (and opsnn bench) under OPSNN_CPU_ISA=avx2 run torch's own kernels at AVX2 too (ATEN_CPU_CAPABILITY;
    its MKL and oneDNN follow the variables ``import opsnn`` set) and says so beside the platform line."""
    from opsnn.runtime import cpu

    train = bench_module("train")
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    monkeypatch.setattr(cpu, "_state", cpu.IsaState("avx2", "avx512", "OPSNN_CPU_ISA", "avx2"))
    assert train._torch_cap() == "avx2"
    train._cap_torch()
    assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2"
    line = train._platform()
    assert "ISA avx2" in line and "ATEN_CPU_CAPABILITY=avx2" in line
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    bench_module("peers").load_torch()  # opsnn bench's torch column, the same way
    assert os.environ["ATEN_CPU_CAPABILITY"] == "avx2"
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")  # the user's setting wins
    train._cap_torch()
    assert os.environ["ATEN_CPU_CAPABILITY"] == "default"
    monkeypatch.setattr(cpu, "_state", cpu.IsaState("avx512", "avx512", "detected", None))
    assert train._torch_cap() is None and "ATEN" not in train._platform()
    monkeypatch.setattr(cpu, "_state", cpu.IsaState("avx512", "amx", "OPSNN_CPU_ISA", "avx512"))
    assert train._torch_cap() is None  # ATen has one AVX-512 level


def test_kernels_bench_takes_product_shapes():
    import argparse

    kb = bench_module("kernels")
    assert kb._shapes_arg("32x768x768, 64X2048x768") == [(32, 768, 768), (64, 2048, 768)]
    for bad in ("32x768", "0x8x8", "axbxc", ""):
        with pytest.raises(argparse.ArgumentTypeError, match="MxKxN"):
            kb._shapes_arg(bad)


def test_rel_err_and_block_order():
    assert benchmark.rel_err(np.array([1.0, 2.0]), np.array([1.0, 2.0])) == 0
    assert benchmark.rel_err(np.array([1.0, 2.5]), np.array([1.0, 2.0])) == pytest.approx(0.25)
    calls = []
    res = benchmark.blocks(
        {"a": lambda: calls.append(("a", time.perf_counter())), "b": lambda: calls.append(("b", time.perf_counter()))},
        repeat=3,
        warmup=1,
        block=2,
        block_warmup=1,
        settle_s=0.05,
    )
    # warm-up each, then blocks (1 untimed + up to 2 timed) taking turns in a rotating order
    assert "".join(n for n, _ in calls) == "ab" + "aaa" + "bbb" + "bb" + "aa"
    assert [len(v) for v in res.values()] == [3, 3]
    # each block starts after the pause (another runtime's pool goes idle meanwhile)
    starts = [i for i in range(2, len(calls)) if calls[i][0] != calls[i - 1][0]]
    assert starts and all(calls[i][1] - calls[i - 1][1] >= 0.05 for i in starts)


def test_cli_pass_through(capsys):
    from opsnn import cli

    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--help"])
    assert e.value.code == 0 and "--no-torch" in capsys.readouterr().out


def test_bench_from_an_installed_package_says_where_the_benchmarks_are(tmp_path):
    """An installed opsnn (no bench/ two folders above the package) prints one line and exits 2."""
    import shutil

    import opsnn

    site = tmp_path / "lib" / "site-packages"
    shutil.copytree(Path(opsnn.__file__).parent, site / "opsnn", ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run(
        [sys.executable, "-c", "import sys; from opsnn import cli; sys.exit(cli.main(['bench']))"],
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == [r.stderr.strip()] and "bench/models.py" in r.stderr


def test_info_says_whether_the_openblas_timeout_is_in_effect(capsys, monkeypatch):
    from opsnn import _blas_env, cli

    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "threads:" in out and "OpenBLAS idle-thread timeout" in out
    # this test process imported numpy before opsnn (conftest): whatever it says must match
    assert ("in effect" in out and "NOT" not in out) == bool(_blas_env.effective)
    monkeypatch.setattr(_blas_env, "effective", False)
    assert cli.main(["info"]) == 0
    assert "NOT in effect (numpy was imported before opsnn; set OPENBLAS_THREAD_TIMEOUT=4" in capsys.readouterr().out


def test_info_says_which_library_runs_threaded_gemms(capsys, monkeypatch):
    from opsnn import cli
    from opsnn.kernels.cpu import libraries, mkl

    for env, text in [
        ("openblas", "threaded float32 GEMM: OpenBLAS (numpy), "),
        ("mkl", "threaded float32 GEMM: Intel MKL, OPSNN_GEMM"),
    ]:
        if env == "mkl" and mkl.unavailable() is not None:
            continue
        monkeypatch.setattr(libraries, "_library", None)  # chosen again, from the environment
        monkeypatch.setenv("OPSNN_GEMM", env)
        assert cli.main(["info"]) == 0
        assert text in capsys.readouterr().out


def test_info_says_whether_onednn_is_used(capsys, monkeypatch):
    from opsnn import cli
    from opsnn.kernels.cpu import blocked as KB
    from opsnn.kernels.cpu import libraries as KL
    from opsnn.kernels.cpu import onednn

    assert cli.main(["info"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("blocked convolutions"))
    assert ("oneDNN 3." in line) == (onednn.unavailable() is None)
    if onednn.unavailable() is None:
        assert line.endswith(f"on {KB.layout_name(KL.conv_chain_layout().block)}")
    monkeypatch.setattr(onednn, "_looked", True)
    monkeypatch.setattr(onednn, "_why", "disabled by OPSNN_ONEDNN=0")
    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert "blocked convolutions: not used (disabled by OPSNN_ONEDNN=0)" in out
    assert "constant-weight matmuls: not on oneDNN (disabled by OPSNN_ONEDNN=0)" in out
    assert "bfloat16 (mixed precision) convolutions and products: not on oneDNN (disabled by OPSNN_ONEDNN=0)" in out


def test_onednn_env_switch_and_load_failure_say_why(monkeypatch):
    from opsnn.kernels.cpu import onednn

    for env, why in [("0", "disabled by OPSNN_ONEDNN=0")]:
        monkeypatch.setattr(onednn, "_looked", False)
        monkeypatch.setattr(onednn, "_why", None)
        monkeypatch.setenv("OPSNN_ONEDNN", env)
        onednn._load()
        assert onednn.unavailable() == why
    monkeypatch.setattr(onednn, "_looked", False)
    monkeypatch.setattr(onednn, "_why", None)
    monkeypatch.delenv("OPSNN_ONEDNN")
    monkeypatch.setattr(onednn, "_candidates", list)
    onednn._load()
    assert "not installed" in onednn.unavailable()


def test_paired_ratios_compare_blocks_of_the_same_round():
    # a slow spell hits both runtimes in round 2 and only the peer in round 3: the ratio of the
    # overall medians says 8 / 15 = 0.53; round by round we are 0.8x the peer in 3 of 4 rounds
    ours = [8, 8, 8, 16, 16, 16, 8, 8, 8, 8, 8, 8]
    peer = [10, 10, 10, 20, 20, 20, 20, 20, 20, 10, 10, 10]
    pr = benchmark.paired_ratios(ours, peer, block=3)
    assert pr["rounds"] == 4 and pr["median"] == pytest.approx(0.8)
    assert pr["p25"] == pytest.approx(0.7) and pr["p75"] == pytest.approx(0.8)
    assert benchmark.paired_ratios([1, 2, 3], [1, 2, 3], block=3)["median"] is None  # one round: no spread


BENCH = Path(__file__).resolve().parents[1] / "bench"
#: modules that load numpy (and with it OpenBLAS) when imported
_LOADS_BLAS = {"numpy", "onnx", "onnxruntime", "torch", "ml_dtypes", "scipy"}


def _import_order(script: Path) -> list:
    """The top-level modules ``script`` imports, in order (neighbour bench modules by their name)."""
    import ast

    names = []
    for node in ast.parse(script.read_text()).body:
        if isinstance(node, ast.Import):
            names += [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module.split(".")[0])
    return names


def _opsnn_first(name: str) -> bool | None:
    """True when bench/``name``.py imports opsnn before anything that loads numpy's OpenBLAS (a
    neighbour counts as what it imports first), False when after, None when it loads neither."""
    for mod in _import_order(BENCH / f"{name}.py"):
        if mod == "opsnn":
            return True
        if mod in _LOADS_BLAS:
            return False
        if (BENCH / f"{mod}.py").is_file():
            first = _opsnn_first(mod)
            if first is not None:
                return first
    return None


@pytest.mark.parametrize(
    "name", sorted(p.stem for p in BENCH.glob("*.py") if "opsnn" in _import_order(p)) or ["no bench script"]
)
def test_bench_scripts_import_opsnn_before_numpy(name):
    """OpenBLAS reads its thread timeout and the ISA cap's core type (set by ``import opsnn``) once,
    when numpy loads it: a script that loads numpy first measures another OpenBLAS set-up and, on
    AMD CPUs, another GEMM library (opsnn.kernels.cpu.libraries.gemm_library)."""
    assert _opsnn_first(name) is True, f"bench/{name}.py imports numpy before opsnn (see bench/models.py)"
