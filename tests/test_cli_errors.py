"""The command line reports every error opsnn or the OS raises as one line on stderr with exit
code 2 (no traceback), unless --traceback or OPSNN_DEBUG=1 asks for one."""

import os
import subprocess
import sys

import numpy as np
import pytest

from opsnn.cli import main
from opsnn.errors import DTypeError
from opsnn.graph import Graph, Node, Value
from opsnn.graph.serialize import save


@pytest.fixture
def files(tmp_path):
    model = save(
        Graph("g", inputs=[Value("x", np.float32, (2, 3))], outputs=[Value("y")], nodes=[Node("Relu", ["x"], ["y"])]),
        str(tmp_path / "m.onnx"),
    )
    (tmp_path / "text.onnx").write_text("not a model\n")
    (tmp_path / "empty.onnx").write_bytes(b"")
    return {"model": model, "text": str(tmp_path / "text.onnx"), "empty": str(tmp_path / "empty.onnx"), "dir": tmp_path}


def _one_line_error(capsys, argv, *must_contain):
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"opsnn {argv[0]}: ")
    for s in must_contain:
        assert s in lines[0], lines[0]
    return lines[0]


def test_plot_errors_are_one_line(files, capsys):
    _one_line_error(capsys, ["plot", files["model"], "-o", "/proc/nope/g.pdf"], "/proc/nope", "does not exist")
    _one_line_error(capsys, ["plot", files["text"], "-o", str(files["dir"] / "g.dot")], "not a valid ONNX model")
    _one_line_error(capsys, ["plot", files["empty"], "-o", str(files["dir"] / "g.dot")], "empty.onnx")
    _one_line_error(capsys, ["plot", str(files["dir"] / "missing.onnx")], "missing.onnx")


def test_plot_does_not_create_missing_folders(files, capsys):
    out = files["dir"] / "no" / "such" / "g.pdf"
    _one_line_error(capsys, ["plot", files["model"], "-o", str(out)], "does not exist")
    assert not (files["dir"] / "no").exists()


def test_compare_errors_are_one_line(files, capsys):
    _one_line_error(capsys, ["compare", files["text"]], "not a valid ONNX model")
    _one_line_error(capsys, ["compare", files["model"], "--dtype", "bogus"], "'bogus'")
    _one_line_error(capsys, ["compare", files["model"], "--dtype", "Relu=float16,Softmax"], "'Softmax'")


def test_traceback_on_request(files, capsys, monkeypatch):
    with pytest.raises(DTypeError, match="bogus"):
        main(["--traceback", "compare", files["model"], "--dtype", "bogus"])
    monkeypatch.setenv("OPSNN_DEBUG", "1")
    with pytest.raises(DTypeError, match="bogus"):
        main(["compare", files["model"], "--dtype", "bogus"])


def test_cli_process_exit_code_and_stderr(files):
    env = dict(os.environ, OPSNN_DEBUG="0")
    proc = subprocess.run(
        [sys.executable, "-m", "opsnn.cli", "plot", files["empty"]],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith("opsnn plot: ")
