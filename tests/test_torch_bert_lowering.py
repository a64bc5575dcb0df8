"""Transformer models through ``torch.compile(backend="opsnn")`` lower to opsnn's fused ops: attention
(``scaled_dot_product_attention`` -> Attention), linear layers on (B, S, K) activations as N-D MatMuls
whose bias, GELU and residual add fuse, no fallback; outputs against torch eager (the oracle: torch's
own float32 kernels) within 1e-4 relative to the output's largest value."""

from __future__ import annotations

import collections
import importlib.util
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from opsnn.frontends import torch as fe  # noqa: E402
from opsnn.kernels.cpu import libraries as KL  # noqa: E402

RTOL = 1e-4
F = torch.nn.functional


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _transformers():
    """transformers, importable where torchvision (which it imports where it finds it) is installed
    but its C extension does not load against this torch: torchvision becomes its bare package then,
    as bench/torch_frontend.py does."""
    pytest.importorskip("transformers")
    if importlib.util.find_spec("torchvision") is not None:
        try:
            import torchvision  # noqa: F401
        except (ImportError, OSError, RuntimeError):
            for key in [k for k in sys.modules if k == "torchvision" or k.startswith("torchvision.")]:
                del sys.modules[key]
            spec = importlib.util.find_spec("torchvision")
            pkg = types.ModuleType("torchvision")
            pkg.__path__, pkg.__spec__ = list(spec.submodule_search_locations), spec
            sys.modules["torchvision"] = pkg
    try:
        import transformers

        transformers.BertModel, transformers.LlamaForCausalLM  # noqa: B018 - the lazy imports happen here
    except Exception as exc:  # noqa: BLE001 - any import failure of the optional extra
        pytest.skip(f"transformers does not import here ({type(exc).__name__}: {exc})")
    return transformers


def _compiled(model, *inputs, **kwargs):
    """(output, eager output, reports, op-type counts of the compiled opsnn graphs)."""
    reports = []

    def be(gm, example_inputs):
        fn, report = fe.compile_graph(gm, example_inputs)
        reports.append(report)
        return fn

    compiled = torch.compile(model, backend=be, dynamic=False)
    with torch.no_grad():
        got, want = compiled(*inputs, **kwargs), model(*inputs, **kwargs)
    ops = collections.Counter(n.op_type for r in reports for _, _, cg in r.partitions for n in cg.graph.nodes)
    return got, want, reports, ops


def _close(got, want):
    scale = float(want.abs().max())
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=RTOL, atol=RTOL * scale)


def _read_from_a_matmul(reports, op_types) -> list:
    """The nodes of ``op_types`` that read a (Fused)MatMul's output."""
    found = []
    for r in reports:
        for _, _, cg in r.partitions:
            made = {o: n.op_type for n in cg.graph.nodes for o in n.outputs}
            found += [
                n.name for n in cg.graph.nodes if n.op_type in op_types and made.get(n.inputs[0], "").endswith("MatMul")
            ]
    return found


def _all_on_opsnn(reports):
    assert [f for r in reports for f in r.fallbacks] == []
    assert all(not r.whole_graph_reason for r in reports)


@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "padding_mask"])
def test_bert_lowers_whole_to_attention_and_fused_matmuls(masked):
    tf = _transformers()
    torch.manual_seed(0)
    cfg = tf.BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=2, intermediate_size=128)
    model = tf.BertModel(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (2, 16))
    kwargs = {}
    if masked:
        mask = torch.ones(2, 16, dtype=torch.int64)
        mask[1, 11:] = 0
        kwargs["attention_mask"] = mask
    got, want, reports, ops = _compiled(model, ids, **kwargs)
    _close(got.last_hidden_state, want.last_hidden_state)
    _close(got.pooler_output, want.pooler_output)
    _all_on_opsnn(reports)  # the token type ids' int64 gather included
    assert ops["Attention"] == 2  # one per layer, not the decomposed matmul-softmax with its safe-softmax guard
    for decomposed in ("Softmax", "Equal", "Expand"):
        assert ops[decomposed] == 0, (decomposed, ops)
    # sdpa turns a bool mask into an additive one (a Where), once per layer
    assert ops["Where"] == (2 if masked else 0), ops
    fused = [n for r in reports for _, _, cg in r.partitions for n in cg.graph.nodes if n.op_type == "FusedMatMul"]
    # per layer: Q, K, V, attention output (+ residual), FFN in (+ GELU), FFN out (+ residual); the pooler.
    # Where the library rule says so (oneDNN's brgemm matmul), Q, K and V are one product and a Split
    siblings = KL.sibling_products() is None
    assert len(fused) == (9 if siblings else 13), ops
    assert ops["Split"] == (2 if siblings else 0), ops
    # the FFN's GELU, the biases and the residual adds in the matmuls' epilogues (the embeddings' sums stay)
    assert ops["Gelu"] == 0
    assert _read_from_a_matmul(reports, ("Add", "Gelu", "Reshape")) == []


def test_llama_causal_lm_with_grouped_query_attention_runs_whole_on_opsnn():
    tf = _transformers()
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # two query heads a key/value head
        vocab_size=500,
        max_position_embeddings=64,
    )
    model = tf.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 16))
    got, want, reports, ops = _compiled(model, ids)
    _close(got.logits, want.logits)
    _all_on_opsnn(reports)  # the KV cache's cat onto an empty tensor included
    attention = [n for r in reports for _, _, cg in r.partitions for n in cg.graph.nodes if n.op_type == "Attention"]
    assert len(attention) == 2 and all(n.attrs.get("is_causal") == 1 for n in attention)
    assert ops["RMSNormalization"] == 5  # two per layer and the final norm, recognized from pow-mean-rsqrt
    assert _read_from_a_matmul(reports, ("Add",)) == []  # o_proj's and down_proj's residual adds fused


def _sdpa(**kw):
    def fn(q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, **kw)

    return fn


@pytest.mark.parametrize(
    "case",
    [
        "plain",
        "scale",
        "bool_mask_with_a_dead_row",
        "float_mask_with_a_dead_row",
        "mask_broadcast_over_keys",
        "causal",
        "gqa",
        "causal_rect",
    ],
)
def test_sdpa_lowers_to_attention_as_torch_computes_it(case):
    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 8, 16), torch.randn(2, 4, 10, 16), torch.randn(2, 4, 10, 16)
    args, kw = [q, k, v], {}
    if case == "scale":
        kw["scale"] = 0.3
    elif case == "bool_mask_with_a_dead_row":
        mask = torch.rand(2, 1, 8, 10) > 0.3
        mask[0, 0, 3] = False  # a query no key may attend: zeros in torch, and in opsnn
        args.append(mask)
    elif case == "float_mask_with_a_dead_row":
        mask = torch.randn(8, 10)
        mask[2] = float("-inf")
        args.append(mask)
    elif case == "mask_broadcast_over_keys":  # torch broadcasts its one column; ONNX would pad it with -inf
        args.append(torch.randn(8, 1))
    elif case == "causal":
        args[1:] = [k[:, :, :8], v[:, :, :8]]
        kw["is_causal"] = True
    elif case == "gqa":
        args[1:] = [k[:, :2], v[:, :2]]
        kw["enable_gqa"] = True
    elif case == "causal_rect":  # torch's causal mask is top-left aligned, ONNX's bottom-right
        kw["is_causal"] = True
    got, want, reports, ops = _compiled(_sdpa(**kw), *args)
    _close(got, want)
    _all_on_opsnn(reports)
    assert ops["Attention"] == (0 if case in ("causal_rect", "mask_broadcast_over_keys") else 1)


class _Mlp(torch.nn.Module):
    def __init__(self, heads_view: bool):
        super().__init__()
        self.up, self.down, self.heads_view = torch.nn.Linear(16, 32), torch.nn.Linear(32, 16), heads_view

    def forward(self, x):
        y = self.down(F.gelu(self.up(x))) + x
        return y.view(*y.shape[:-1], 4, 4) if self.heads_view else y


@pytest.mark.parametrize("heads_view", [False, True], ids=["bsk", "split_heads"])
def test_linear_on_3d_activations_is_one_nd_matmul_with_its_epilogue(heads_view):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    got, want, reports, ops = _compiled(_Mlp(heads_view).eval(), x)
    _close(got, want)
    _all_on_opsnn(reports)
    assert ops["FusedMatMul"] == 2 and ops["Gelu"] == 0 and ops["Add"] == 0, ops
    # the flattening Reshapes torch's addmm needs are gone; a head split stays a Reshape
    assert ops["Reshape"] == (1 if heads_view else 0), ops


def test_sdpa_with_symbolic_sizes_is_decomposed_not_left_whole_to_torch():
    """A symbolic sequence length: the Attention lowering needs static shapes, so sdpa decomposes
    (symbolically) as before rather than staying one node that torch runs."""
    reports = []

    def be(gm, example_inputs):
        fn, report = fe.compile_graph(gm, example_inputs)
        reports.append(report)
        return fn

    fn = _sdpa()
    compiled = torch.compile(fn, backend=be)
    torch.manual_seed(0)
    with torch.no_grad():
        for s in (6, 9):
            q, k, v = (torch.randn(1, 2, s, 8) for _ in range(3))
            for t in (q, k, v):
                torch._dynamo.mark_dynamic(t, 2)  # the sequence; the head size stays a number
            _close(compiled(q, k, v), fn(q, k, v))
    assert len(reports) == 1 and reports[0].partitions  # one symbolic trace, its matmuls on opsnn
    assert not [f for f in reports[0].fallbacks if "scaled_dot_product" in f[1]]
    ops = collections.Counter(n.op_type for _, _, cg in reports[0].partitions for n in cg.graph.nodes)
    assert ops["Attention"] == 0 and ops["MatMul"] >= 1, ops
