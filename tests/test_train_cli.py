"""``opsnn train``: each built-in model trains a few steps at tiny sizes and leaves a checkpoint and
a loss-curve PNG; the loss falls on the fixed synthetic data; a resumed run continues
bit-identically; argument errors are one line naming the flag and what it accepts."""

import io
import struct
import zlib

import numpy as np
import pytest

from opsnn import trainer
from opsnn.cli import main
from opsnn.tools.plot import plot_curve

TINY = {
    "resnet18": ["--image-size", "16", "--batch", "2", "--num-classes", "3"],
    "bert-tiny": ["--seq-len", "8", "--vocab", "60", "--batch", "2"],
    "llama-tiny": ["--seq-len", "8", "--vocab", "60", "--batch", "2"],
}


def _png_size_and_text(path) -> tuple:
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, text, idat, size = 8, {}, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + n]
        assert struct.unpack(">I", data[pos + 8 + n : pos + 12 + n])[0] == zlib.crc32(kind + body) & 0xFFFFFFFF
        if kind == b"IHDR":
            size = struct.unpack(">II", body[:8])
        elif kind == b"tEXt":
            k, v = body.split(b"\x00", 1)
            text[k.decode()] = v.decode("latin-1")
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    return size, text, idat


@pytest.mark.parametrize("model", list(TINY))
def test_each_model_trains_and_writes_checkpoint_and_curve(model, tmp_path, capsys):
    out = tmp_path / "run"
    dtype = ["--dtype", "bfloat16"] if model == "bert-tiny" else []
    assert main(["train", "--model", model, "--steps", "2", "--out", str(out), *TINY[model], *dtype]) == 0
    stdout = capsys.readouterr().out
    assert "steps 1..2: loss" in stdout and "samples/s" in stdout
    assert (out / "checkpoint.safetensors").is_file()
    size, _, _ = _png_size_and_text(out / "loss_curve.png")
    assert size[0] > 0 and size[1] > 0
    cfg, step = trainer.read_resume_config(out / "checkpoint.safetensors")
    assert step == 2 and cfg["model"] == model and cfg["dtype"] == ("bfloat16" if dtype else "float32")


def test_loss_falls_on_the_fixed_data():
    cfg = trainer.TrainConfig(model="llama-tiny", steps=30, batch=4, seq_len=16, vocab=50)
    losses = trainer.train(cfg).losses
    assert len(losses) == 30 and np.all(np.isfinite(losses))
    # next-token loss starts near ln(50) = 3.9 and the arithmetic sequences are learnable (measured: 3.96 -> 1.07)
    assert np.mean(losses[-4:]) < 0.6 * np.mean(losses[:4]), losses


def test_resume_continues_bit_identically(tmp_path, capsys):
    args = ["train", "--model", "bert-tiny", "--optimizer", "sgd", *TINY["bert-tiny"], "--log-every", "1"]
    assert main([*args, "--steps", "4", "--out", str(tmp_path / "straight")]) == 0
    assert main([*args, "--steps", "2", "--out", str(tmp_path / "resumed")]) == 0
    ckpt = tmp_path / "resumed" / "checkpoint.safetensors"
    capsys.readouterr()
    # the checkpoint carries the config: --resume alone with a new --steps continues the same run
    resume = ["train", "--resume", str(ckpt), "--steps", "4", "--out", str(tmp_path / "resumed"), "--log-every", "1"]
    assert main(resume) == 0
    out = capsys.readouterr()
    assert "steps 3..4" in out.out and "step 3/4" in out.err and "step 2/4" not in out.err
    a = trainer.read_resume_config(tmp_path / "straight" / "checkpoint.safetensors")
    b = trainer.read_resume_config(ckpt)
    assert a[1] == b[1] == 4
    from opsnn.checkpoint import checkpoint_info

    la = checkpoint_info(tmp_path / "straight" / "checkpoint.safetensors")["extra"]["losses"]
    lb = checkpoint_info(ckpt)["extra"]["losses"]
    assert la == lb and len(la) == 4
    from safetensors.numpy import load_file

    ta, tb = load_file(tmp_path / "straight" / "checkpoint.safetensors"), load_file(ckpt)
    assert ta.keys() == tb.keys()
    for k in ta:
        np.testing.assert_array_equal(ta[k], tb[k], err_msg=k)


def _one_line(capsys, argv, *needles):
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("opsnn train: "), err
    for n in needles:
        assert n in err[0], err[0]


def test_argument_errors_are_one_line(tmp_path, capsys):
    _one_line(capsys, ["train", "--model", "vgg"], "--model", "resnet18", "bert-tiny", "llama-tiny")
    _one_line(capsys, ["train", "--steps", "0"], "--steps", "positive integer")
    _one_line(capsys, ["train", "--dtype", "float64"], "--dtype", "float32", "bfloat16")
    _one_line(capsys, ["train", "--optimizer", "lamb"], "--optimizer", "sgd", "adamw")
    _one_line(capsys, ["train", "--lr", "0"], "--lr", "positive")
    _one_line(capsys, ["train", "--batch", "4", "--samples", "2"], "--samples", ">= --batch")
    _one_line(capsys, ["train", "--resume", str(tmp_path / "none.safetensors")], "No such file")
    (tmp_path / "bad.safetensors").write_bytes(b"not a checkpoint")
    _one_line(capsys, ["train", "--resume", str(tmp_path / "bad.safetensors")], "bad.safetensors")
    out = tmp_path / "r"
    assert main(["train", "--model", "llama-tiny", "--steps", "1", "--out", str(out), *TINY["llama-tiny"]]) == 0
    ck = str(out / "checkpoint.safetensors")
    capsys.readouterr()
    _one_line(capsys, ["train", "--resume", ck, "--model", "bert-tiny"], "--model 'bert-tiny'", "'llama-tiny'")
    _one_line(capsys, ["train", "--resume", ck, "--steps", "1"], "--steps 1", "at step 1")


def test_progress_lines_off_a_terminal():
    s = io.StringIO()
    p = trainer.Progress(total=5, start=0, every=2, stream=s)
    for step in range(1, 6):
        p(step, 1.0 / step, 10.0)
    p.close()
    lines = s.getvalue().splitlines()
    assert [ln.split()[1] for ln in lines] == ["2/5", "4/5", "5/5"]
    assert "loss 0.2000" in lines[-1] and "10.0 samples/s" in lines[-1]


def test_progress_bar_on_a_terminal():
    s = io.StringIO()
    p = trainer.Progress(total=3, start=1, every=1, stream=s, bar=True)  # a tqdm bar, as on a tty
    for step in (2, 3):
        p(step, 0.5, 8.0)
    p.close()
    assert "3/3" in s.getvalue() and "loss 0.5000" in s.getvalue() and "samples/s" in s.getvalue()


def test_matplotlib_curve_where_installed(tmp_path):
    pytest.importorskip("matplotlib")
    path = str(tmp_path / "m.png")
    assert plot_curve([3.0, 2.0, 1.5], path, title="t") == "matplotlib"
    (w, h), _, _ = _png_size_and_text(path)
    assert (w, h) == (640, 400)


def test_builtin_curve_png_draws_the_values(tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *a, **k):  # the renderer used where matplotlib is not installed
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    values = [4.0, 3.0, 2.0, 1.0]
    path = str(tmp_path / "c.png")
    assert plot_curve(values, path, title="t1") == "builtin"
    (w, h), text, idat = _png_size_and_text(path)
    assert text["Title"] == "t1"
    raw = np.frombuffer(zlib.decompress(idat), np.uint8).reshape(h, 1 + 3 * w)
    assert (raw[:, 0] == 0).all()  # filter type 0 on every row
    img = raw[:, 1:].reshape(h, w, 3)
    blue = np.argwhere((img == (31, 119, 180)).all(-1))
    # a falling curve: its leftmost pixels sit high (small row numbers), its rightmost low
    left, right = blue[blue[:, 1] < blue[:, 1].min() + 5], blue[blue[:, 1] > blue[:, 1].max() - 5]
    assert left[:, 0].mean() < 0.3 * h and right[:, 0].mean() > 0.7 * h
    with pytest.raises(Exception, match="PNG"):
        plot_curve(values, str(tmp_path / "c.pdf"))
