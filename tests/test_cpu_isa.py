"""The instruction-set cap (OPSNN_CPU_ISA / opsnn.config.set_cpu_isa): detection from CPU flags,
the error for an unknown level, and what a capped process tells oneDNN, MKL and numba."""

import json
import os
import subprocess
import sys

import pytest

import opsnn
from opsnn.errors import OpsnnRuntimeError, ParamInvalidError
from opsnn.runtime import cpu

AVX2 = {"sse4_1", "avx", "avx2", "fma"}
AVX512 = AVX2 | {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"}


@pytest.mark.parametrize(
    "flags, level",
    [
        (set(), None),
        ({"sse4_1"}, "sse41"),
        (AVX2, "avx2"),
        (AVX2 - {"fma"}, "sse41"),
        (AVX512, "avx512"),
        (AVX512 | {"avx512_bf16"}, "avx512"),  # BF16 without VNNI is not a level
        (AVX512 | {"avx512_bf16", "avx512_vnni"}, "avx512_bf16"),
        (AVX512 | {"avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8"}, "amx"),
        (AVX2 | {"amx_tile", "amx_bf16", "amx_int8"}, "avx2"),  # each level needs the ones below
    ],
)
def test_detected_level_from_flags(monkeypatch, flags, level):
    monkeypatch.setattr(cpu, "_flags", frozenset(flags))
    assert cpu.detected() == level


def test_unknown_level_is_a_one_line_error_listing_the_levels():
    with pytest.raises(ParamInvalidError) as e:
        cpu.parse("avx9")
    msg = str(e.value)
    assert "\n" not in msg and "'avx9'" in msg and all(lv in msg for lv in cpu.LEVELS)
    assert cpu.parse("AVX-512") == "avx512" and cpu.parse("avx512_core") == "avx512"
    with pytest.raises(ParamInvalidError, match="set_cpu_isa"):
        opsnn.config.set_cpu_isa("neon")


def test_cap_lowers_but_never_raises_the_level(monkeypatch):
    monkeypatch.setattr(cpu, "_flags", frozenset(AVX512))
    monkeypatch.setattr(cpu, "_loaded", {})
    monkeypatch.setattr(cpu, "_state", None)
    monkeypatch.setattr(cpu, "_numba_level", "avx512")
    monkeypatch.setattr(cpu, "apply_environment", lambda: None)
    monkeypatch.delenv("OPSNN_CPU_ISA", raising=False)
    with pytest.warns(RuntimeWarning, match="numba's kernels keep avx512"):
        assert opsnn.config.set_cpu_isa("avx2") == "avx2"
    assert not cpu.at_least("avx512") and cpu.at_least("avx2") and "set_cpu_isa('avx2')" in cpu.why()
    assert opsnn.config.set_cpu_isa("amx") == "avx512"  # the CPU's own is the most a cap gives
    assert "more than the CPU has" in cpu.why()
    assert opsnn.config.set_cpu_isa(None) == "avx512" and cpu.why() == "detected"


def test_set_cpu_isa_after_a_library_loaded_is_an_error(monkeypatch):
    monkeypatch.setattr(cpu, "_state", None)
    monkeypatch.setattr(cpu, "_loaded", {"oneDNN": cpu.isa()})
    lower = cpu.LEVELS[max(0, cpu.LEVELS.index(cpu.isa()) - 1)] if cpu.isa() else "sse41"
    if lower == cpu.isa():
        pytest.skip("no level below the one in force")
    with pytest.raises(OpsnnRuntimeError, match="oneDNN is already loaded"):
        opsnn.config.set_cpu_isa(lower)
    assert cpu.state().source != "set_cpu_isa"
    assert opsnn.config.set_cpu_isa(cpu.isa()) == cpu.isa()  # the level in force: nothing to change


_PROBE = """
import json, os, opsnn
from opsnn.runtime import cpu
from opsnn.kernels.cpu import onednn, libraries
from opsnn.runtime import blas
from numba.core import config
print(json.dumps({"isa": cpu.isa(), "why": cpu.why(), "onednn_env": os.environ.get("ONEDNN_MAX_CPU_ISA"),
                  "openblas_env": os.environ.get("OPENBLAS_CORETYPE"), "openblas_core": blas.core_name(),
                  "mkl_env": os.environ.get("MKL_ENABLE_INSTRUCTIONS"), "numba_features": config.CPU_FEATURES,
                  "block": onednn.block(), "onednn_why": onednn.unavailable(), "bf16": onednn.bf16_unavailable(),
                  "summary": libraries.summary()}))
"""


def _probe(level: str) -> dict:
    env = dict(os.environ, OPSNN_CPU_ISA=level)
    for var in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES"):
        env.pop(var, None)
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(cpu.detected() is None or not cpu.at_least("avx2"), reason="needs an AVX2 CPU")
def test_avx2_cap_reaches_onednn_mkl_and_numba():
    got = _probe("avx2")
    assert got["isa"] == "avx2"
    assert got["onednn_env"] == "AVX2" and got["mkl_env"] == "AVX2"
    assert "summary" in got and got["summary"].startswith("ISA avx2")
    if cpu.detected() != "avx2":  # an AVX-512 CPU: the cap changes what runs
        assert got["why"] == f"capped by OPSNN_CPU_ISA=avx2; the CPU has {cpu.detected()}"
        feats = set(got["numba_features"].split(","))
        assert "+avx2" in feats and "-avx512f" in feats and not any(f.startswith("+avx512") for f in feats)
        # OpenBLAS, loaded by numpy after ``import opsnn``, runs its 8-lane kernels (a value the user set wins)
        assert got["openblas_env"] == os.environ.get("OPENBLAS_CORETYPE", "Haswell")
        if got["openblas_core"] is not None and "OPENBLAS_CORETYPE" not in os.environ:
            assert got["openblas_core"] == "Haswell" and "OpenBLAS Haswell" in got["summary"]
    if got["onednn_why"] is None:
        assert got["block"] == 8 and got["bf16"] is not None


_CHILD = """
import json, opsnn
from opsnn.runtime import cpu
print(json.dumps({"level": cpu._numba_level, "note": cpu._numba_note, "describe": cpu.describe()}))
"""


@pytest.mark.skipif(cpu.detected() in (None, "sse41"), reason="needs a CPU above the lowest level to cap")
def test_a_child_process_takes_the_numba_target_its_parent_set_as_the_caps():
    """A process an opsnn process starts under the cap (pytest-xdist's workers) inherits the NUMBA_CPU_NAME /
    NUMBA_CPU_FEATURES the cap set: they are the cap's, so ``describe()`` names no other numba target (it
    did: "numba's kernels target as NUMBA_CPU_NAME / NUMBA_CPU_FEATURES say (set by the user)"); other values
    are still the user's."""
    level = "avx2" if cpu.at_least("avx512") else "sse41"
    name, feats = cpu._numba_target(level)

    def child(**numba):
        env = dict(os.environ, OPSNN_CPU_ISA=level, **numba)
        for var in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS"):
            env.pop(var, None)
        out = subprocess.run([sys.executable, "-c", _CHILD], env=env, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    got = child(NUMBA_CPU_NAME=name, NUMBA_CPU_FEATURES=feats)
    assert (got["level"], got["note"]) == (level, "capped with the rest"), got
    assert "numba's kernels target" not in got["describe"], got
    user = child(NUMBA_CPU_NAME="generic", NUMBA_CPU_FEATURES="")
    assert user["note"] == "set by the user" and "numba's kernels target" in user["describe"], user


@pytest.mark.skipif(
    cpu.detected() not in ("avx512", "avx512_bf16", "amx"),
    reason="the CPU's own level is AVX2 or below: the native run covers the AVX2 paths",
)
def test_kernel_choice_tests_pass_under_the_avx2_cap():
    """The tests marked ``isa_portable`` (kernel choices per ISA, model-level results) again, in a
    process capped at AVX2, so an AVX-512 machine also checks what an AVX2-only CPU runs. The
    capped process compiles its own numba kernels (numba's cache is keyed by the target): minutes
    on a cold cache, seconds warm."""
    env = dict(os.environ, OPSNN_CPU_ISA="avx2")
    for var in ("ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS", "NUMBA_CPU_NAME", "NUMBA_CPU_FEATURES"):
        env.pop(var, None)
    here = os.path.dirname(os.path.abspath(__file__))
    files = sorted(
        os.path.join(here, f)
        for f in os.listdir(here)
        if f.startswith("test_") and f.endswith(".py") and "mark.isa_portable" in open(os.path.join(here, f)).read()
    )
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-m", "isa_portable", "-p", "no:cacheprovider", "-o", "addopts=-q", *files],
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and " failed" not in r.stdout, r.stdout[-2000:]


def test_info_says_which_isa_is_in_force_and_why(capsys):
    from opsnn import cli

    assert cli.main(["info"]) == 0
    out = capsys.readouterr().out
    assert f"instruction sets: {cpu.describe()}\n" in out
    assert f"in one line: ISA {cpu.isa()}" in out
