"""Training-step benchmark: forward + loss + backward + optimizer step of a ResNet-18-style CNN
(64x64, batch 32), a BERT-small-style encoder (4 layers, hidden 256, sequence 128, batch 8,
classifier on the pooled output) and a LLaMA-tiny decoder (4 layers, hidden 256, 4 heads, 2 KV
heads, sequence 256, batch 4, next-token loss), in

- ``opsnn_fp32``: opsnn eager, float32;
- ``opsnn_bf16``: opsnn eager under ``opsnn.autocast("bfloat16")`` (float32 master weights);
- ``torch_fp32``: torch eager, float32, a re-implementation of the same model loaded with the
  same weights, the same data and the same thread count;
- ``opsnn_compiled``: ``opsnn.compile(train_step)``, one traced graph of forward, backward and
  the in-place update; a model the tracer refuses is reported n/a with the tracer's reason, and
  an opsnn without compiled training says "compiled training not available";
- ``opsnn_compiled_bf16``: the same with the forward and loss under autocast inside the step.

Each (model, configuration) runs in its own process, so each has its own peak RSS
(``ru_maxrss``), and with AdamW (lr 1e-4, weight decay 0.01). A model's processes start one after
another, each running ``--warmup`` steps (kernel compiles, first touches of the allocator) while
the others wait; then ``--rounds`` rounds, each giving every configuration in turn one block of
``--block`` steps after a ``--settle`` pause (the others idle): the step time is the median of a
configuration's block means, and each ratio is the median over the rounds of the ratio of two
blocks of the same round (with its lowest and highest), so a machine that drifts between minutes
moves both sides of a ratio alike. Before timing, the torch twin's eval-mode logits are checked
against opsnn's on the same batch (the twin must be the same model). The parent prints a table
and the command, and writes JSON.

    python bench/train.py --json bench/results/train.json
    python bench/train.py --models llama --configs opsnn_fp32,torch_fp32 --threads 8
    python bench/train.py --tiny                   # tiny shapes, two steps: a correctness run
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import opsnn  # before numpy: OpenBLAS reads opsnn's thread timeout and ISA cap when numpy loads it

# isort: split
import numpy as np

from opsnn import nn
from opsnn.tools.text import table as _table

MODELS = ("resnet", "bert", "llama")
CONFIGS = ("opsnn_fp32", "opsnn_bf16", "torch_fp32", "opsnn_compiled", "opsnn_compiled_bf16")
DEFAULT_CONFIGS = CONFIGS


@dataclass
class Spec:
    model: str
    batch: int
    image: int = 64
    layers: int = 4
    hidden: int = 256
    heads: int = 4
    kv_heads: int = 2
    intermediate: int = 1024
    seq: int = 128
    vocab: int = 30522
    classes: int = 10

    def describe(self) -> str:
        if self.model == "resnet":
            return f"ResNet-18 {self.image}x{self.image}, batch {self.batch}"
        if self.model == "bert":
            return f"BERT {self.layers}L h{self.hidden} seq {self.seq}, batch {self.batch}"
        return f"LLaMA {self.layers}L h{self.hidden} seq {self.seq}, batch {self.batch}"


def specs(tiny: bool) -> dict:
    if tiny:
        return {
            "resnet": Spec("resnet", batch=2, image=16),
            "bert": Spec("bert", batch=2, layers=2, hidden=64, heads=2, intermediate=128, seq=16, vocab=100),
            "llama": Spec("llama", batch=2, layers=2, hidden=64, heads=4, intermediate=128, seq=16, vocab=100),
        }
    return {
        "resnet": Spec("resnet", batch=32, image=64),
        "bert": Spec("bert", batch=8, seq=128),
        "llama": Spec("llama", batch=4, seq=256, intermediate=768, vocab=32000),
    }


# -- opsnn models and data ---------------------------------------------------------------------------------
class BertClassifier(nn.Module):
    def __init__(self, spec: Spec):
        super().__init__()
        self.bert = opsnn.models.bert(
            "tiny",
            num_hidden_layers=spec.layers,
            hidden_size=spec.hidden,
            num_attention_heads=spec.heads,
            intermediate_size=spec.intermediate,
            vocab_size=spec.vocab,
            max_position_embeddings=spec.seq,
            seed=0,
        )
        with nn.init.seeded(1):
            self.classifier = nn.Linear(spec.hidden, spec.classes)

    def forward(self, ids):
        return self.classifier(self.bert(ids)[1])


def build_opsnn(spec: Spec):
    if spec.model == "resnet":
        return opsnn.models.resnet18(num_classes=spec.classes, seed=0)
    if spec.model == "bert":
        return BertClassifier(spec)
    return opsnn.models.llama(
        layers=spec.layers,
        hidden=spec.hidden,
        heads=spec.heads,
        kv_heads=spec.kv_heads,
        vocab=spec.vocab,
        intermediate=spec.intermediate,
        max_position=spec.seq,
        seed=0,
    )


def make_batch(spec: Spec):
    rng = np.random.default_rng(0)
    if spec.model == "resnet":
        x = rng.standard_normal((spec.batch, 3, spec.image, spec.image)).astype(np.float32)
        return x, rng.integers(0, spec.classes, spec.batch)
    if spec.model == "bert":
        return rng.integers(1, spec.vocab, (spec.batch, spec.seq)), rng.integers(0, spec.classes, spec.batch)
    ids = rng.integers(0, spec.vocab, (spec.batch, spec.seq + 1))
    return ids[:, :-1], ids[:, 1:]


def opsnn_logits(spec: Spec, model, x):
    if spec.model == "llama":
        return model(x)[0].reshape(-1, spec.vocab)  # a view, as torch_logits's
    return model(opsnn.tensor(x) if spec.model == "resnet" and not isinstance(x, opsnn.Tensor) else x)


def opsnn_loss(spec: Spec, model, x, y):
    return nn.functional.cross_entropy(opsnn_logits(spec, model, x), y.reshape(-1))


# -- torch twins (the same parameter names, loaded from the opsnn model's state dict) -----------------------
def torch_model(spec: Spec, torch):
    tnn, F = torch.nn, torch.nn.functional

    if spec.model == "resnet":

        class Basic(tnn.Module):
            def __init__(self, cin, cout, stride):
                super().__init__()
                self.conv1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
                self.bn1 = tnn.BatchNorm2d(cout)
                self.conv2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
                self.bn2 = tnn.BatchNorm2d(cout)
                self.downsample = None
                if stride != 1 or cin != cout:
                    self.downsample = tnn.Sequential(
                        tnn.Conv2d(cin, cout, 1, stride, bias=False), tnn.BatchNorm2d(cout)
                    )

            def forward(self, x):
                out = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
                return F.relu(out + (x if self.downsample is None else self.downsample(x)))

        class ResNet18(tnn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = tnn.Conv2d(3, 64, 7, 2, 3, bias=False)
                self.bn1 = tnn.BatchNorm2d(64)
                widths, cin = (64, 128, 256, 512), 64
                for i, w in enumerate(widths):
                    stride = 1 if i == 0 else 2
                    setattr(self, f"layer{i + 1}", tnn.Sequential(Basic(cin, w, stride), Basic(w, w, 1)))
                    cin = w
                self.fc = tnn.Linear(512, spec.classes)

            def forward(self, x):
                x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 3, 2, 1)
                x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
                return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))

        return ResNet18()

    if spec.model == "bert":
        H, nh = spec.hidden, spec.heads

        class Layer(tnn.Module):
            def __init__(self):
                super().__init__()
                self.query, self.key, self.value = tnn.Linear(H, H), tnn.Linear(H, H), tnn.Linear(H, H)
                self.attn_out, self.attn_ln = tnn.Linear(H, H), tnn.LayerNorm(H, eps=1e-12)
                self.inter, self.out = tnn.Linear(H, spec.intermediate), tnn.Linear(spec.intermediate, H)
                self.out_ln, self.drop = tnn.LayerNorm(H, eps=1e-12), tnn.Dropout(0.1)

            def forward(self, h):
                B, S, _ = h.shape
                q, k, v = (lin(h).view(B, S, nh, H // nh).transpose(1, 2) for lin in (self.query, self.key, self.value))
                a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, S, H)
                a = self.attn_ln(self.drop(self.attn_out(a)) + h)
                return self.out_ln(self.drop(self.out(F.gelu(self.inter(a)))) + a)

        class Bert(tnn.Module):
            def __init__(self):
                super().__init__()
                self.word = tnn.Embedding(spec.vocab, H, padding_idx=0)
                self.pos, self.tok_type = tnn.Embedding(spec.seq, H), tnn.Embedding(2, H)
                self.emb_ln, self.drop = tnn.LayerNorm(H, eps=1e-12), tnn.Dropout(0.1)
                self.layer = tnn.ModuleList(Layer() for _ in range(spec.layers))
                self.pooler, self.classifier = tnn.Linear(H, H), tnn.Linear(H, spec.classes)

            def forward(self, ids):
                S = ids.shape[1]
                h = self.word(ids) + self.tok_type.weight[:1] + self.pos.weight[:S]
                h = self.drop(self.emb_ln(h))
                for layer in self.layer:
                    h = layer(h)
                return self.classifier(torch.tanh(self.pooler(h[:, 0])))

        return Bert()

    D, Hq, Hkv = spec.hidden // spec.heads, spec.heads, spec.kv_heads

    class Decoder(tnn.Module):
        def __init__(self):
            super().__init__()
            self.embed = tnn.Embedding(spec.vocab, spec.hidden)
            self.layers = tnn.ModuleList()
            for _ in range(spec.layers):
                m = tnn.Module()
                m.ln1, m.ln2 = tnn.RMSNorm(spec.hidden, eps=1e-6), tnn.RMSNorm(spec.hidden, eps=1e-6)
                m.q = tnn.Linear(spec.hidden, Hq * D, bias=False)
                m.k = tnn.Linear(spec.hidden, Hkv * D, bias=False)
                m.v = tnn.Linear(spec.hidden, Hkv * D, bias=False)
                m.o = tnn.Linear(Hq * D, spec.hidden, bias=False)
                m.gate = tnn.Linear(spec.hidden, spec.intermediate, bias=False)
                m.up = tnn.Linear(spec.hidden, spec.intermediate, bias=False)
                m.down = tnn.Linear(spec.intermediate, spec.hidden, bias=False)
                self.layers.append(m)
            self.norm = tnn.RMSNorm(spec.hidden, eps=1e-6)
            self.lm_head = tnn.Linear(spec.hidden, spec.vocab, bias=False)
            inv = 1.0 / (10000.0 ** (np.arange(0, D, 2, dtype=np.float64) / D))
            ang = np.arange(spec.seq, dtype=np.float64)[:, None] * inv[None]
            self.register_buffer("cos", torch.from_numpy(np.cos(np.concatenate([ang, ang], -1)).astype(np.float32)))
            self.register_buffer("sin", torch.from_numpy(np.sin(np.concatenate([ang, ang], -1)).astype(np.float32)))

        def forward(self, ids):
            B, S = ids.shape
            cos, sin = self.cos[:S], self.sin[:S]

            def rope(x):
                return x * cos + torch.cat([-x[..., D // 2 :], x[..., : D // 2]], -1) * sin

            h = self.embed(ids)
            for m in self.layers:
                y = m.ln1(h)
                q = rope(m.q(y).view(B, S, Hq, D).transpose(1, 2))
                k = rope(m.k(y).view(B, S, Hkv, D).transpose(1, 2))
                v = m.v(y).view(B, S, Hkv, D).transpose(1, 2)
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                h = h + m.o(o.transpose(1, 2).reshape(B, S, Hq * D))
                y = m.ln2(h)
                h = h + m.down(F.silu(m.gate(y)) * m.up(y))
            return self.lm_head(self.norm(h))

    return Decoder()


def _torch_names(spec: Spec, name: str) -> str:
    """The twin's parameter name for an opsnn state-dict key."""
    if spec.model == "bert":
        rep = [
            ("bert.embeddings.word_embeddings.", "word."),
            ("bert.embeddings.position_embeddings.", "pos."),
            ("bert.embeddings.token_type_embeddings.", "tok_type."),
            ("bert.embeddings.LayerNorm.", "emb_ln."),
            ("bert.encoder.layer.", "layer."),
            ("attention.self.", ""),
            ("attention.output.dense.", "attn_out."),
            ("attention.output.LayerNorm.", "attn_ln."),
            ("intermediate.dense.", "inter."),
            ("output.dense.", "out."),
            ("output.LayerNorm.", "out_ln."),
            ("bert.pooler.dense.", "pooler."),
        ]
    elif spec.model == "llama":
        rep = [
            ("model.embed_tokens.", "embed."),
            ("model.layers.", "layers."),
            ("model.norm.", "norm."),
            ("self_attn.q_proj.", "q."),
            ("self_attn.k_proj.", "k."),
            ("self_attn.v_proj.", "v."),
            ("self_attn.o_proj.", "o."),
            ("mlp.gate_proj.", "gate."),
            ("mlp.up_proj.", "up."),
            ("mlp.down_proj.", "down."),
            ("input_layernorm.", "ln1."),
            ("post_attention_layernorm.", "ln2."),
        ]
    else:
        return name
    for a, b in rep:
        name = name.replace(a, b)
    return name


def load_torch_twin(spec: Spec, torch, weights: dict):
    tm = torch_model(spec, torch)
    mapped = {_torch_names(spec, k): torch.from_numpy(np.array(v)) for k, v in weights.items()}
    own = tm.state_dict()
    extra = sorted(set(mapped) - set(own))
    missing = sorted(
        k for k in set(own) - set(mapped) if not k.endswith("num_batches_tracked") and k not in ("cos", "sin")
    )
    if extra or missing:
        raise SystemExit(
            f"bench/train.py: the torch twin of {spec.model} does not fit: extra {extra}, missing {missing}"
        )
    tm.load_state_dict(mapped, strict=False)
    return tm


def torch_logits(spec: Spec, tm, x):
    return tm(x).reshape(-1, spec.vocab) if spec.model == "llama" else tm(x)


def torch_loss(spec: Spec, torch, tm, x, y):
    return torch.nn.functional.cross_entropy(torch_logits(spec, tm, x), y.reshape(-1))


# -- one case, in its own process -------------------------------------------------------------------------
def _compiled_available() -> str | None:
    """None when opsnn.compile takes a training step, else why not."""
    try:
        from opsnn.autograd import compiled  # noqa: F401
    except ImportError:
        return "compiled training not available (this opsnn has no opsnn.autograd.compiled)"
    return None


def prepare_case(spec: Spec, config: str, args, weights_path: str):
    """(step(), the eval-mode logits) of one case in this process."""
    opsnn.set_num_threads(args.threads)
    x, y = make_batch(spec)
    if config == "torch_fp32":
        _cap_torch()
        import torch

        torch.set_num_threads(args.threads)
        from safetensors.numpy import load_file

        tm = load_torch_twin(spec, torch, load_file(weights_path))
        xt, yt = torch.from_numpy(x), torch.from_numpy(np.asarray(y))
        opt = torch.optim.AdamW(tm.parameters(), lr=1e-4, weight_decay=0.01)
        tm.eval()
        with torch.no_grad():
            check = torch_logits(spec, tm, xt).numpy()
        tm.train()

        def step():
            opt.zero_grad()
            loss = torch_loss(spec, torch, tm, xt, yt)
            loss.backward()
            opt.step()
            return float(loss)

    else:
        model = build_opsnn(spec)
        opt = opsnn.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
        model.eval()
        with opsnn.no_grad():
            check = opsnn_logits(spec, model, x).numpy()
        model.train()
        if config.startswith("opsnn_compiled"):
            why = _compiled_available()
            if why is not None:
                raise SystemExit(why)
            cast = config.endswith("bf16")

            def train_step(xb, yb):
                opt.zero_grad()
                with opsnn.autocast("bfloat16", enabled=cast):
                    loss = opsnn_loss(spec, model, xb, yb)
                loss.backward()
                opt.step()
                return loss

            compiled = opsnn.compile(train_step)

            def step():
                return float(compiled(x, y).item())

        else:
            cast = config == "opsnn_bf16"

            def step():
                opt.zero_grad()
                with opsnn.autocast("bfloat16", enabled=cast):
                    loss = opsnn_loss(spec, model, x, y)
                loss.backward()
                opt.step()
                return float(loss.item())

    return step, check


#: the prefix of the worker's protocol lines on its stdout (a library's own prints pass through)
_SAY = "@@train "


def _say(text: str) -> None:
    print(_SAY + text, flush=True)


def serve_case(spec: Spec, config: str, args, weights_path: str) -> dict:
    """The worker: build the case, warm it up, say ``ready``; then one timed block per ``block`` line
    on stdin (its mean step time said back) until ``done``."""
    step, check = prepare_case(spec, config, args, weights_path)
    losses = [step() for _ in range(args.warmup)]
    _say("ready")
    means = []
    for line in sys.stdin:
        if line.strip() != "block":
            break
        t0 = time.perf_counter()
        for _ in range(args.block):
            losses.append(step())
        means.append((time.perf_counter() - t0) / args.block)
        _say(f"block {means[-1]!r}")
    med = statistics.median(means) if means else float("nan")
    return {
        "model": spec.model,
        "config": config,
        "eval_logits": check.ravel()[:256].astype(float).tolist(),  # the twin check compares these
        "step_ms": med * 1e3,
        "step_ms_min": min(means, default=float("nan")) * 1e3,
        "blocks_ms": [m * 1e3 for m in means],
        "samples_per_s": spec.batch / med,
        "loss_first": losses[0] if losses else float("nan"),
        "loss_last": losses[-1] if losses else float("nan"),
        "finite": bool(np.isfinite(losses).all()),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def _worker(argv) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--config", required=True)
    ap.add_argument("--weights", required=True)
    ap.add_argument("--out", required=True)
    for k in ("threads", "warmup", "block"):
        ap.add_argument(f"--{k}", type=int, required=True)
    a = ap.parse_args(argv)
    res = serve_case(Spec(**json.loads(a.spec)), a.config, a, a.weights)
    with open(a.out, "w") as f:
        json.dump(res, f)
    return 0


class _Case:
    """The parent's handle on one worker process: its protocol lines, read with a deadline."""

    def __init__(self, cmd: list, err_path: str):
        self.err_path = err_path
        self._err = open(err_path, "w")
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=False)
        self._buf = b""

    def send(self, line: str) -> None:
        self.p.stdin.write((line + "\n").encode())
        self.p.stdin.flush()

    def expect(self, word: str, timeout: float) -> str:
        """The rest of the worker's next ``word`` line; raises RuntimeError with its last stderr line when it
        exits first or says nothing in ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        fd = self.p.stdout.fileno()
        while True:
            while b"\n" in self._buf:
                raw, self._buf = self._buf.split(b"\n", 1)
                line = raw.decode(errors="replace")
                if line.startswith(_SAY + word):
                    return line[len(_SAY + word) :].strip()
            left = deadline - time.monotonic()
            if left <= 0:
                self.kill()
                raise RuntimeError(f"timed out after {timeout:g} s")
            ready, _, _ = select.select([fd], [], [], left)
            chunk = os.read(fd, 65536) if ready else b""
            if ready and not chunk:
                self.p.wait()
                raise RuntimeError(self.last_error())
            self._buf += chunk

    def last_error(self) -> str:
        self._err.flush()
        with open(self.err_path) as f:
            lines = f.read().strip().splitlines()
        return lines[-1] if lines else f"exit {self.p.returncode}"

    def finish(self, timeout: float) -> None:
        try:
            self.send("done")
            self.p.stdin.close()
            self.p.wait(timeout=timeout)
        finally:
            self.kill()

    def kill(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self._err.close()


def run_model(name: str, args, tmp: str) -> list:
    """Every configuration of one model: warmed up one after another, then interleaved blocks."""
    from safetensors.numpy import save_file

    spec = specs(args.tiny)[name]
    weights = os.path.join(tmp, f"{name}.safetensors")
    model = build_opsnn(spec)
    save_file({k: np.ascontiguousarray(v.numpy()) for k, v in model.state_dict().items()}, weights)
    del model
    rows, cases = {}, {}
    for config in args.configs:
        out = os.path.join(tmp, f"{name}-{config}.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--spec", json.dumps(asdict(spec))]
        cmd += ["--config", config, "--weights", weights, "--out", out, "--threads", str(args.threads)]
        cmd += ["--warmup", str(args.warmup), "--block", str(args.block)]
        rows[config] = {"model": name, "config": config, "shape": spec.describe(), "_out": out}
        print(f"{spec.describe()}: {config} warming up ...", file=sys.stderr, flush=True)
        case = _Case(cmd, os.path.join(tmp, f"{name}-{config}.err"))
        try:
            case.expect("ready", args.timeout)
            cases[config] = case
        except RuntimeError as e:
            case.kill()
            rows[config]["error"] = str(e)
    print(
        f"{spec.describe()}: {args.rounds} rounds of {len(cases)} interleaved blocks ...", file=sys.stderr, flush=True
    )
    for _ in range(args.rounds):
        for config, case in list(cases.items()):
            if args.settle > 0:
                time.sleep(args.settle)
            try:
                case.send("block")
                case.expect("block", args.timeout)
            except (RuntimeError, OSError) as e:
                case.kill()
                del cases[config]
                rows[config]["error"] = str(e)
    for config, case in cases.items():
        try:
            case.finish(args.timeout)
            with open(rows[config]["_out"]) as f:
                rows[config].update(json.load(f))
        except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError) as e:
            rows[config]["error"] = f"{type(e).__name__}: {e}"
    for r in rows.values():
        r.pop("_out", None)
    return [rows[c] for c in args.configs]


def paired_ratio(row: dict, base: dict) -> tuple | None:
    """(median, lowest, highest) over the rounds of ``row``'s block time over ``base``'s in the same round."""
    a, b = row.get("blocks_ms") or [], base.get("blocks_ms") or []
    ratios = sorted(x / y for x, y in zip(a, b) if y > 0)
    if not ratios:
        return None
    return statistics.median(ratios), ratios[0], ratios[-1]


def _torch_cap() -> str | None:
    from opsnn.runtime import cpu

    return cpu.aten_capability()


def _cap_torch() -> None:
    """Under ``OPSNN_CPU_ISA``, the torch twin runs at the same level (a value the user set wins)."""
    cap = _torch_cap()
    if cap is not None:
        os.environ.setdefault("ATEN_CPU_CAPABILITY", cap)


def _platform() -> str:
    """Which CPU, ISA and libraries ran, so that figures from two machines can be told apart."""
    from opsnn.kernels.cpu import libraries
    from opsnn.runtime.device import cpu_model

    cap = _torch_cap()
    torch_isa = (
        f"; torch capped alike (ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', cap)})" if cap else ""
    )
    return f"{cpu_model()}: {libraries.summary()}{torch_isa}"


# -- the parent: one process per case, a table, JSON -------------------------------------------------------------
def _cpu_bf16() -> str:
    from opsnn.kernels.cpu import onednn

    why = onednn.bf16_unavailable()
    return "native bf16 (AVX512-BF16/AMX)" if why is None else f"no native bf16 ({why})"


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="bench/train.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--configs", default=",".join(DEFAULT_CONFIGS), help=f"comma-separated, of {', '.join(CONFIGS)}")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="opsnn's and torch's (default: all cores)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--block", type=int, default=3, help="steps per timed block")
    ap.add_argument("--settle", type=float, default=1.0, help="seconds of pause before each block")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes, warm-up 1, 2 blocks of 1 step: correctness only")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per case")
    args = ap.parse_args(argv)
    models = [m for m in args.models.split(",") if m]
    configs = [c for c in args.configs.split(",") if c]
    bad = [m for m in models if m not in MODELS] + [c for c in configs if c not in CONFIGS]
    if bad:
        ap.error(f"unknown model/config {bad}; models: {', '.join(MODELS)}; configs: {', '.join(CONFIGS)}")
    if args.tiny:
        args.warmup, args.rounds, args.block, args.settle = 1, 2, 1, 0.0
    args.models, args.configs = models, configs
    return args


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--worker":
        return _worker(argv[1:])
    args = parse_args(argv)
    command = "python bench/train.py " + " ".join(shlex.quote(a) for a in argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            rows += run_model(name, args, tmp)
    check_twins(rows)
    print(format_table(rows, args))
    print(f"\ncommand: {command}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "command": command,
                    "platform": _platform(),
                    "threads": args.threads,
                    "cpu_bf16": _cpu_bf16(),
                    "results": rows,
                },
                f,
                indent=2,
            )
        print(f"wrote {args.json}")
    return 0 if all("error" not in r or r["config"] == "opsnn_compiled" for r in rows) else 1


def check_twins(rows) -> None:
    """The torch twin is the same model: its eval-mode logits on the batch are opsnn's."""
    by = {(r["model"], r["config"]): r for r in rows}
    for r in rows:
        if r["config"] != "torch_fp32" or "error" in r:
            continue
        mine = by.get((r["model"], "opsnn_fp32"))
        if mine is None or "error" in mine:
            continue
        a, b = np.array(mine["eval_logits"]), np.array(r["eval_logits"])
        rel = float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))
        r["twin_rel_err"] = rel
        if rel > 1e-3:  # float32 end to end, different summation orders
            r["error"] = f"the torch twin's eval-mode logits differ from opsnn's by {rel:.2e} (relative to the largest)"


def format_table(rows, args) -> str:
    by = {(r["model"], r["config"]): r for r in rows}
    out = []
    for r in rows:
        if "error" in r:
            out.append([r["shape"], r["config"], "n/a", "", "", "", ""])
            continue
        base = {"opsnn_fp32": "torch_fp32", "opsnn_compiled_bf16": "opsnn_bf16"}.get(r["config"], "opsnn_fp32")
        ref = by.get((r["model"], base)) if r["config"] != "torch_fp32" else None
        pr = paired_ratio(r, ref) if ref is not None and "error" not in ref else None
        if pr is not None:
            r["ratio"] = {"vs": base, "median": pr[0], "lowest": pr[1], "highest": pr[2]}
        vs = f"{pr[0]:.2f}x {base}" if pr else ""
        spread = f"{pr[1]:.2f}-{pr[2]:.2f}" if pr else ""
        out.append(
            [
                r["shape"],
                r["config"],
                f"{r['step_ms']:.1f}",
                vs,
                spread,
                f"{r['samples_per_s']:.1f}",
                f"{r['peak_rss_mib']:.0f}",
            ]
        )
    text = _table(
        out,
        [
            "model",
            "config",
            "ms/step (median)",
            "ratio (median by round)",
            "rounds' range",
            "samples/s",
            "peak RSS MiB",
        ],
    )
    notes = [_platform(), f"threads {args.threads}; {_cpu_bf16()}"]
    for r in rows:
        if "error" in r:
            notes.append(f"{r['model']} {r['config']}: {r['error']}")
    return text + "\n" + "\n".join(notes)


if __name__ == "__main__":
    sys.exit(main())
