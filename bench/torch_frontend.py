"""The torch frontend on real PyTorch models: ``torch.compile(backend="opsnn")`` against torch eager
and ``torch.compile(backend="inductor")``, in one process, in settled blocks.

Models (random weights, inference under ``torch.no_grad``): torchvision ``resnet50`` (batch 1,
224x224), Hugging Face ``BertModel(BertConfig())`` (sequence 128) and a ``LlamaForCausalLM``
(8 layers, hidden 512, sequence 128); ``--tiny`` shrinks all three to a smoke test. Training
(``resnet18_train``): the ResNet-18-style CNN of ``bench/train.py`` (batch 32, 64x64; ``--tiny``:
batch 4, 32x32), a step of cross-entropy forward, backward (aot_autograd: both graphs compiled) and
SGD; its check is the first step's gradients against eager's, and every runtime's (eager's too)
against a float64 run, since this batch's float32 backward is ill-conditioned; target <= 1.0x eager. Each
compiled model's first call is its compile time; its output is checked against eager (max error
relative to the largest eager value, target 1e-4) before anything is timed. The runtimes take
turns in blocks (rotating order, a pause before each, one untimed call) so that load from other
jobs hits all alike; latencies are medians. Targets (issue 33): opsnn <= 0.7x eager and <= 1.0x
inductor on ResNet-50 and BERT.

    $ python bench/torch_frontend.py --repeat 10 --json bench/results/torch_frontend.json
    $ python bench/torch_frontend.py --tiny --repeat 1      # a smoke test
    $ python bench/torch_frontend.py --models resnet18_train --runtimes opsnn

Needs the ``bench`` extra (torchvision, transformers) and torch.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

# bench/kernels.py would shadow the `kernels` package transformers imports: this script needs no neighbour
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]

SETTLE_S = 0.5
RUNTIMES = ("eager", "opsnn", "inductor")


def _torchvision_importable() -> None:
    """Make ``import torchvision...`` work: where torchvision's C extension does not load against this
    torch (PyPI's CUDA wheel beside a CPU torch; RuntimeError: operator torchvision::nms does not
    exist), ``torchvision`` becomes its bare package, whose pure-Python modules (the model definitions,
    the transforms transformers imports) load without the package's operator registrations. Called
    before torchvision or transformers is first imported, so that the rows run in any order."""
    try:
        import torchvision  # noqa: F401
    except (ImportError, OSError, RuntimeError) as exc:
        import importlib.util
        import types

        print(
            f"torchvision does not import ({type(exc).__name__}: {exc}); using its Python code alone", file=sys.stderr
        )
        for key in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
            del sys.modules[key]
        spec = importlib.util.find_spec("torchvision")
        pkg = types.ModuleType("torchvision")
        pkg.__path__, pkg.__spec__ = list(spec.submodule_search_locations), spec
        sys.modules["torchvision"] = pkg


def _torchvision_resnet():
    """``torchvision.models.resnet`` (see :func:`_torchvision_importable`)."""
    _torchvision_importable()
    from torchvision.models import resnet

    return resnet


def build(name: str, tiny: bool, torch):
    """``(model, inputs)`` with deterministic random weights."""
    torch.manual_seed(0)
    if name == "resnet50":
        resnet = _torchvision_resnet()
        model = resnet.resnet18() if tiny else resnet.resnet50()
        return model.eval(), (torch.randn(1, 3, 64 if tiny else 224, 64 if tiny else 224),)
    seq = 16 if tiny else 128
    _torchvision_importable()  # transformers imports torchvision where it finds it
    if name == "bert":
        from transformers import BertConfig, BertModel

        cfg = (
            BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128)
            if tiny
            else BertConfig()
        )
        model = BertModel(cfg)
    elif name == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        hidden, layers = (64, 2) if tiny else (512, 8)
        cfg = LlamaConfig(
            hidden_size=hidden,
            intermediate_size=hidden * 4,
            num_hidden_layers=layers,
            num_attention_heads=8,
            num_key_value_heads=8,
            vocab_size=1000 if tiny else 32000,
            max_position_embeddings=512,
        )
        model = LlamaForCausalLM(cfg)
    else:
        raise ValueError(f"unknown model {name!r}; choose from resnet50, bert, llama")
    ids = torch.randint(0, model.config.vocab_size, (1, seq))
    return model.eval(), (ids,)


def _tensor_out(out, torch):
    """The model's main output tensor (logits, last hidden state, or the tensor itself)."""
    if isinstance(out, torch.Tensor):
        return out
    for key in ("logits", "last_hidden_state"):
        if getattr(out, key, None) is not None:
            return getattr(out, key)
    return out[0]


def rel_err(got, want) -> float:
    return float((got - want).abs().max() / max(float(want.abs().max()), 1e-30))


def _train_spec_and_model(tiny: bool, torch):
    """bench/train.py's ResNet-18-style torch model and its batch (loaded by path: this script keeps
    its own folder off ``sys.path``)."""
    import dataclasses
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_train", os.path.join(_HERE, "train.py"))
    train = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look it up
    spec.loader.exec_module(train)
    s = train.specs(False)["resnet"]
    if tiny:  # not train.py's tiny 16x16 batch 2: batch norm over 2 values at 1x1 makes its gradients noise
        s = dataclasses.replace(s, batch=4, image=32)
    torch.manual_seed(0)
    model = train.torch_model(s, torch)
    x = torch.randn(s.batch, 3, s.image, s.image)
    y = torch.randint(0, s.classes, (s.batch,))
    return model, x, y


def run_training(args, torch) -> dict:
    """Training steps (forward, loss, backward, SGD) of the ResNet-18-style CNN, each runtime on its own
    copy of the same weights."""
    import copy

    model, x, y = _train_spec_and_model(args.tiny, torch)
    row = {"model": "resnet18_train", "compile_s": {}, "ms": {}, "rel_err": {}, "fallbacks": None}
    reports = []

    def opsnn_backend(gm, example_inputs):
        from opsnn.frontends import torch as fe

        fn, report = fe.compile_graph(gm, example_inputs)
        reports.append(report)
        return fn

    backends = {"opsnn": opsnn_backend, "inductor": "inductor"}
    steps, grads = {}, {}
    for rt in ["eager"] + [r for r in ("opsnn", "inductor") if r in args.runtimes]:
        m = copy.deepcopy(model)
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)

        def loss_of(x, y, m=m):
            return torch.nn.functional.cross_entropy(m(x), y)

        fn = loss_of if rt == "eager" else torch.compile(loss_of, backend=backends[rt], dynamic=False)

        def step(fn=fn, opt=opt):
            opt.zero_grad()
            loss = fn(x, y)
            loss.backward()
            opt.step()

        t0 = time.perf_counter()
        opt.zero_grad()
        fn(x, y).backward()  # the first gradients (before any update) are the check
        if rt != "eager":
            row["compile_s"][rt] = time.perf_counter() - t0
        grads[rt] = [p.grad.detach().clone() for p in m.parameters()]
        steps[rt] = step
    for rt in grads:
        if rt != "eager":
            row["rel_err"][rt] = max(rel_err(g, w) for g, w in zip(grads[rt], grads["eager"]))
    # each runtime's distance from the first gradients in float64 too: this batch's BN/ReLU backward is
    # ill-conditioned in float32 (a ReLU mask flip near zero moves a channel's sums), fp32 eager included
    m64 = copy.deepcopy(model).double()
    torch.nn.functional.cross_entropy(m64(x.double()), y).backward()
    g64 = [p.grad for p in m64.parameters()]
    row["rel_err_f64"] = {rt: max(rel_err(g.double(), w) for g, w in zip(grads[rt], g64)) for rt in grads}
    if "opsnn" in steps:
        row["fallbacks"] = sorted({t for r in reports for _, t, _ in r.fallbacks})
    return _timed(row, steps, args)


def run_model(name: str, args, torch) -> dict:
    if name == "resnet18_train":
        return run_training(args, torch)
    model, inputs = build(name, args.tiny, torch)
    fns = {"eager": model}
    row = {"model": name, "compile_s": {}, "ms": {}, "rel_err": {}, "fallbacks": None}
    if "opsnn" in args.runtimes:
        from opsnn.frontends import torch as fe

        reports = []

        def opsnn_backend(gm, example_inputs):
            fn, report = fe.compile_graph(gm, example_inputs)
            reports.append(report)
            return fn

        fns["opsnn"] = torch.compile(model, backend=opsnn_backend, dynamic=False)
    if "inductor" in args.runtimes:
        fns["inductor"] = torch.compile(model, backend="inductor", dynamic=False)
    with torch.no_grad():
        want = _tensor_out(model(*inputs), torch)
        for rt, fn in fns.items():
            if rt == "eager":
                continue
            t0 = time.perf_counter()
            got = _tensor_out(fn(*inputs), torch)
            row["compile_s"][rt] = time.perf_counter() - t0
            row["rel_err"][rt] = rel_err(got, want)
        if "opsnn" in fns:
            row["fallbacks"] = sorted({t for r in reports for _, t, _ in r.fallbacks})
        return _timed(row, {rt: (lambda fn=fn: fn(*inputs)) for rt, fn in fns.items()}, args)


def _timed(row: dict, calls: dict, args) -> dict:
    """``row`` with each runtime's median call time (``calls``: runtime -> a call with no arguments),
    the runtimes taking turns in settled blocks."""
    times = {rt: [] for rt in calls}
    order = list(calls)
    for block in range(args.repeat):
        for rt in order[block % len(order) :] + order[: block % len(order)]:
            time.sleep(SETTLE_S)
            calls[rt]()  # untimed: caches and thread pools warm
            for _ in range(args.block):
                t0 = time.perf_counter()
                calls[rt]()
                times[rt].append(time.perf_counter() - t0)
    row["ms"] = {rt: 1e3 * statistics.median(ts) for rt, ts in times.items()}
    if "opsnn" in row["ms"]:
        row["opsnn_vs_eager"] = row["ms"]["opsnn"] / row["ms"]["eager"]
        if "inductor" in row["ms"]:
            row["opsnn_vs_inductor"] = row["ms"]["opsnn"] / row["ms"]["inductor"]
    return row


def format_row(row: dict) -> str:
    ms = "  ".join(f"{rt} {v:.2f} ms" for rt, v in row["ms"].items())
    comp = "  ".join(f"{rt} {v:.1f} s" for rt, v in row["compile_s"].items())
    err = "  ".join(f"{rt} {v:.1e}" for rt, v in row["rel_err"].items())
    ratios = "  ".join(f"{k} {row[k]:.2f}x" for k in ("opsnn_vs_eager", "opsnn_vs_inductor") if k in row)
    lines = [f"{row['model']}: {ms}", f"  compile: {comp}", f"  rel err vs eager: {err}"]
    if row.get("rel_err_f64"):
        f64 = "  ".join(f"{rt} {v:.1e}" for rt, v in row["rel_err_f64"].items())
        lines.append(f"  rel err vs float64 (first gradients, eager included): {f64}")
    if ratios:
        lines.append(f"  {ratios}")
    if row["fallbacks"]:
        lines.append(f"  opsnn fallbacks: {', '.join(row['fallbacks'])}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="resnet50,bert,llama,resnet18_train")
    p.add_argument("--runtimes", default=",".join(RUNTIMES), help="of eager, opsnn, inductor (eager is always run)")
    p.add_argument("--repeat", type=int, default=10, help="timed blocks per runtime")
    p.add_argument("--block", type=int, default=3, help="timed calls per block")
    p.add_argument("--tiny", action="store_true", help="small configurations: a smoke test")
    p.add_argument("--json", metavar="PATH", help="write the rows here")
    args = p.parse_args(argv)
    args.runtimes = set(args.runtimes.split(",")) | {"eager"}
    import torch

    rows = []
    for name in args.models.split(","):
        row = run_model(name, args, torch)
        print(format_row(row), flush=True)
        rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"torch": torch.__version__, "tiny": args.tiny, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
