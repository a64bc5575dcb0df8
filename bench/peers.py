"""The peers of ``bench/models.py``: torch eager re-implementations of opsnn's ResNet, BERT and
LLaMA-style decoder (fed from the opsnn module's ``state_dict``), and onnxruntime sessions.

They live here, not in the package: they exist only to be measured against, in the same run.
"""

from __future__ import annotations

import os
import time

import opsnn  # noqa: F401 - before numpy: OpenBLAS reads opsnn's thread timeout and ISA cap when numpy loads it

# isort: split
import numpy as np

from opsnn import dtypes as _dt
from opsnn.runtime import cpu


def _np(t) -> np.ndarray:
    return np.asarray(t.numpy() if hasattr(t, "numpy") else t)


def load_torch():
    """``(torch, None)`` or ``(None, why not)``; under ``OPSNN_CPU_ISA`` its own kernels capped alike
    (``ATEN_CPU_CAPABILITY``, unless set; its MKL and oneDNN follow what ``import opsnn`` set)."""
    cap = cpu.aten_capability()
    if cap is not None:
        os.environ.setdefault("ATEN_CPU_CAPABILITY", cap)
    try:
        import torch
    except Exception as e:  # ImportError, or OSError from a half-installed runtime library
        return None, f"{type(e).__name__}: {e}"
    torch.set_num_threads(2)
    return torch, None


def ort_session(proto_bytes: bytes):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    return ort.InferenceSession(proto_bytes, so, providers=["CPUExecutionProvider"])


def _torch_state(model, torch) -> dict:
    """The model's tensors for torch; bfloat16 ones (ml_dtypes, which torch cannot take from
    numpy) go through float32, exactly, and come out as torch.bfloat16."""
    out = {}
    for k, v in model.state_dict().items():
        a = _np(v)
        if a.dtype == _dt.bfloat16:
            out[k] = torch.from_numpy(a.astype(np.float32)).to(torch.bfloat16)
        else:
            out[k] = torch.from_numpy(np.array(a, copy=True))
    return out


# -- torch re-implementations (fed from the opsnn module's state_dict) -----------------------------------------
class TorchResNet:
    """ResNet forward in torch eager: conv, batch norm (inference), ReLU, max/avg pool, fc."""

    def __init__(self, model, torch, dtype=None):
        """``dtype``: a torch dtype to run in (weights and activations; default the model's)."""
        self.torch, self.m, self.sd = torch, model, _torch_state(model, torch)
        self.dtype = dtype
        if dtype is not None:
            self.sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in self.sd.items()}

    def _cbn(self, x, cname, conv, bname, bn):
        F, sd = self.torch.nn.functional, self.sd
        x = F.conv2d(x, sd[cname + ".weight"], None, conv.stride, conv.padding, conv.dilation, conv.groups)
        return F.batch_norm(
            x,
            sd[bname + ".running_mean"],
            sd[bname + ".running_var"],
            sd[bname + ".weight"],
            sd[bname + ".bias"],
            False,
            0.0,
            bn.eps,
        )

    def __call__(self, feeds: dict) -> dict:
        torch, m = self.torch, self.m
        F = torch.nn.functional
        with torch.inference_mode():
            x = torch.from_numpy(feeds["input"])
            x = x if self.dtype is None else x.to(self.dtype)
            x = F.relu(self._cbn(x, "conv1", m.conv1, "bn1", m.bn1))
            x = F.max_pool2d(x, 3, 2, 1)
            for li in range(1, 5):
                for bi, blk in enumerate(getattr(m, f"layer{li}")):
                    p = f"layer{li}.{bi}"
                    n = 3 if hasattr(blk, "conv3") else 2
                    out = x
                    for c in range(1, n + 1):
                        out = self._cbn(
                            out, f"{p}.conv{c}", getattr(blk, f"conv{c}"), f"{p}.bn{c}", getattr(blk, f"bn{c}")
                        )
                        if c < n:
                            out = F.relu(out)
                    idn = (
                        x
                        if blk.downsample is None
                        else self._cbn(
                            x, f"{p}.downsample.0", blk.downsample[0], f"{p}.downsample.1", blk.downsample[1]
                        )
                    )
                    x = F.relu(out + idn)
            x = F.adaptive_avg_pool2d(x, 1).flatten(1)
            return {"logits": F.linear(x, self.sd["fc.weight"], self.sd["fc.bias"]).float().numpy()}


def torchvision_resnet(model, torch):
    """The opsnn ResNet as torchvision writes it (``nn.Conv2d``/``nn.BatchNorm2d`` modules,
    ``torch.flatten`` + ``nn.Linear`` head), in eval mode, with the opsnn module's weights: the
    model ``torch.onnx.export`` sees when a user exports their torchvision ResNet."""
    nn = torch.nn

    def conv(cin, cout, k, stride=1, groups=1):
        return nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False)

    class BasicBlock(nn.Module):
        def __init__(self, cin, planes, stride, downsample):
            super().__init__()
            self.conv1, self.bn1 = conv(cin, planes, 3, stride), nn.BatchNorm2d(planes)
            self.conv2, self.bn2 = conv(planes, planes, 3), nn.BatchNorm2d(planes)
            self.relu, self.downsample = nn.ReLU(inplace=True), downsample

        def forward(self, x):
            out = self.bn2(self.conv2(self.relu(self.bn1(self.conv1(x)))))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, cout, stride, downsample, groups):
            super().__init__()
            self.conv1, self.bn1 = conv(cin, width, 1), nn.BatchNorm2d(width)
            self.conv2, self.bn2 = conv(width, width, 3, stride, groups), nn.BatchNorm2d(width)
            self.conv3, self.bn3 = conv(width, cout, 1), nn.BatchNorm2d(cout)
            self.relu, self.downsample = nn.ReLU(inplace=True), downsample

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    class ResNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1, self.bn1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64)
            self.relu, self.maxpool = nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1)
            for i in range(1, 5):
                setattr(self, f"layer{i}", self._stage(getattr(model, f"layer{i}")))
            self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
            self.fc = nn.Linear(model.fc.in_features, model.fc.out_features)

        @staticmethod
        def _stage(stage):
            blocks = []
            for b in stage:
                stride = b.stride
                cin = b.conv1.in_channels
                ds = None
                if b.downsample is not None:
                    d = b.downsample[0]
                    ds = nn.Sequential(
                        nn.Conv2d(d.in_channels, d.out_channels, 1, stride, bias=False), nn.BatchNorm2d(d.out_channels)
                    )
                if hasattr(b, "conv3"):
                    blocks.append(
                        Bottleneck(cin, b.conv1.out_channels, b.conv3.out_channels, stride, ds, b.conv2.groups)
                    )
                else:
                    blocks.append(BasicBlock(cin, b.conv1.out_channels, stride, ds))
            return nn.Sequential(*blocks)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    net = ResNet()
    sd = _torch_state(model, torch)
    missing, unexpected = net.load_state_dict(sd, strict=False)
    bad = [k for k in missing if not k.endswith("num_batches_tracked")]
    if bad or unexpected:
        raise KeyError(f"torchvision_resnet: state dict mismatch, missing {bad[:4]}, unexpected {unexpected[:4]}")
    return net.eval()


def torch_onnx_export(net, torch, batch: int, image: int, dynamo: bool = False, opset=None, **options) -> bytes:
    """``torch.onnx.export`` of ``net`` (input ``input``, output ``logits``): the ONNX file a
    torch user brings. ``dynamo``: torch's export-based exporter (its default; needs onnxscript)
    at its own opset 18 (it fails to convert ResNet's ReduceMean to 17 and keeps 18), else the
    TorchScript one at 17; ``options``: more ``torch.onnx.export`` arguments."""
    import os
    import tempfile

    opset = opset or (18 if dynamo else 17)
    if dynamo:
        options.setdefault("external_data", False)
    x = torch.zeros(batch, 3, image, image)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "model.onnx")
        torch.onnx.export(
            net,
            (x,),
            path,
            input_names=["input"],
            output_names=["logits"],
            opset_version=opset,
            dynamo=dynamo,
            verbose=False,
            **options,
        )
        with open(path, "rb") as f:
            return f.read()


class TorchBert:
    """BERT encoder in torch eager (post-LayerNorm, erf GELU, additive attention mask, pooler)."""

    def __init__(self, model, torch):
        self.torch, self.cfg, self.sd = torch, model.config, _torch_state(model, torch)
        self.pooler = model.pooler is not None

    def _lin(self, x, name):
        return self.torch.nn.functional.linear(x, self.sd[name + ".weight"], self.sd.get(name + ".bias"))

    def _ln(self, x, name):
        sd = self.sd
        return self.torch.nn.functional.layer_norm(
            x, (x.shape[-1],), sd[name + ".weight"], sd[name + ".bias"], self.cfg.layer_norm_eps
        )

    def __call__(self, feeds: dict) -> dict:
        torch, cfg, sd = self.torch, self.cfg, self.sd
        F = torch.nn.functional
        with torch.inference_mode():
            ids = torch.from_numpy(feeds["input_ids"])
            B, S = ids.shape
            nh = cfg.num_attention_heads
            D = cfg.hidden_size // nh
            h = (
                F.embedding(ids, sd["embeddings.word_embeddings.weight"])
                + F.embedding(torch.from_numpy(feeds["token_type_ids"]), sd["embeddings.token_type_embeddings.weight"])
                + sd["embeddings.position_embeddings.weight"][:S]
            )
            h = self._ln(h, "embeddings.LayerNorm")
            am = torch.from_numpy(feeds["attention_mask"]).to(torch.float32)[:, None, None, :]
            mask = (1.0 - am) * torch.finfo(torch.float32).min
            for i in range(cfg.num_hidden_layers):
                p = f"encoder.layer.{i}."
                q, k, v = (
                    self._lin(h, p + "attention.self." + n).view(B, S, nh, D).transpose(1, 2)
                    for n in ("query", "key", "value")
                )
                a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).transpose(1, 2).reshape(B, S, -1)
                h = self._ln(self._lin(a, p + "attention.output.dense") + h, p + "attention.output.LayerNorm")
                f = F.gelu(self._lin(h, p + "intermediate.dense"))
                h = self._ln(self._lin(f, p + "output.dense") + h, p + "output.LayerNorm")
            out = {"last_hidden_state": h.numpy()}
            if self.pooler:
                out["pooler_output"] = torch.tanh(self._lin(h[:, 0], "pooler.dense")).numpy()
            return out


class TorchLlama:
    """The LLaMA decoder in torch eager (RMSNorm, half-split rotary, grouped-query SDPA,
    SwiGLU) with a preallocated KV cache written in place; logits of the last position."""

    def __init__(self, model, torch, max_seq: int):
        self.torch, self.cfg = torch, model.config
        sd = _torch_state(model, torch)
        cfg = self.cfg
        self.embed, self.norm = sd["model.embed_tokens.weight"], sd["model.norm.weight"]
        self.out = sd.get("lm_head.weight", self.embed)
        dt = self.embed.dtype  # a bfloat16 model runs in bfloat16 throughout (model.to(torch.bfloat16))
        cos, sin = (_np(t).astype(np.float32) for t in (model.model.rope_cos, model.model.rope_sin))
        self.cos = torch.from_numpy(np.concatenate([cos, cos], -1)).to(dt)
        self.sin = torch.from_numpy(np.concatenate([sin, sin], -1)).to(dt)
        names = (
            "input_layernorm.weight",
            "self_attn.q_proj.weight",
            "self_attn.k_proj.weight",
            "self_attn.v_proj.weight",
            "self_attn.o_proj.weight",
            "post_attention_layernorm.weight",
            "mlp.gate_proj.weight",
            "mlp.up_proj.weight",
            "mlp.down_proj.weight",
        )
        self.layers = [[sd[f"model.layers.{i}.{n}"] for n in names] for i in range(cfg.num_hidden_layers)]
        shape = (1, cfg.num_key_value_heads, max_seq, cfg.head_dim)
        self.k = [torch.zeros(shape, dtype=dt) for _ in self.layers]
        self.v = [torch.zeros(shape, dtype=dt) for _ in self.layers]

    def forward(self, ids: np.ndarray, start: int) -> np.ndarray:
        torch, cfg = self.torch, self.cfg
        F = torch.nn.functional
        Hq, Hkv, D, eps = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.rms_norm_eps

        def rope(x, cos, sin):
            h = D // 2
            return x * cos + torch.cat([-x[..., h:], x[..., :h]], -1) * sin

        with torch.inference_mode():
            x = torch.from_numpy(ids)
            B, S = x.shape
            h = F.embedding(x, self.embed)
            pos = torch.arange(start, start + S)
            cos, sin = self.cos[pos][None, None], self.sin[pos][None, None]
            L = start + S
            for i, (ln1, wq, wk, wv, wo, ln2, wg, wu, wd) in enumerate(self.layers):
                y = F.rms_norm(h, (h.shape[-1],), ln1, eps)
                q = rope(F.linear(y, wq).view(B, S, Hq, D).transpose(1, 2), cos, sin)
                k = rope(F.linear(y, wk).view(B, S, Hkv, D).transpose(1, 2), cos, sin)
                self.k[i].index_copy_(2, pos, k)
                self.v[i].index_copy_(2, pos, F.linear(y, wv).view(B, S, Hkv, D).transpose(1, 2))
                o = F.scaled_dot_product_attention(
                    q, self.k[i][:, :, :L], self.v[i][:, :, :L], is_causal=S > 1, enable_gqa=True
                )
                h = h + F.linear(o.transpose(1, 2).reshape(B, S, Hq * D), wo)
                y = F.rms_norm(h, (h.shape[-1],), ln2, eps)
                h = h + F.linear(F.silu(F.linear(y, wg)) * F.linear(y, wu), wd)
            logits = F.linear(F.rms_norm(h[:, -1:], (h.shape[-1],), self.norm, eps), self.out)
        return logits.float().numpy().reshape(B, -1)


# -- decoders: one greedy generation, timed the same way for every runtime ------------------------------------
def greedy(step, prompt: np.ndarray, new: int) -> dict:
    """``step(ids (1, S), start) -> logits (1, vocab)``; the first token comes from the prefill."""
    t0 = time.perf_counter()
    logits = step(prompt[None], 0)
    tok = int(np.argmax(logits[0]))
    t1 = time.perf_counter()
    toks = [tok]
    for i in range(new - 1):
        tok = int(np.argmax(step(np.array([[tok]], np.int64), len(prompt) + i)[0]))
        toks.append(tok)
    t2 = time.perf_counter()
    return {
        "ms": (t2 - t0) * 1e3,
        "prefill_ms": (t1 - t0) * 1e3,
        "decode_ms_per_token": (t2 - t1) / max(new - 1, 1) * 1e3,
        "tokens": toks,
        "prefill_logits": logits[0],
    }


class OrtLlama:
    """Greedy decoding with onnxruntime over the ``with_past`` export (present K/V fed back)."""

    def __init__(self, proto_bytes: bytes, cfg):
        self.sess = ort_session(proto_bytes)
        self.cfg = cfg
        self.out_names = [o.name for o in self.sess.get_outputs()]
        self.past = {}

    def step(self, ids: np.ndarray, start: int) -> np.ndarray:
        cfg = self.cfg
        if start == 0:
            empty = np.zeros((1, cfg.num_key_value_heads, 0, cfg.head_dim), np.float32)
            self.past = {
                f"past_key_values.{i}.{n}": empty for i in range(cfg.num_hidden_layers) for n in ("key", "value")
            }
        S = ids.shape[1]
        feeds = {"input_ids": ids, "position_ids": np.arange(start, start + S, dtype=np.int64)[None], **self.past}
        outs = self.sess.run(None, feeds)
        self.past = {
            n.replace("present.", "past_key_values."): o
            for n, o in zip(self.out_names, outs)
            if n.startswith("present.")
        }
        return outs[0][:, -1]
