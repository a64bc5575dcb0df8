"""Model builders (ResNet-50, BERT, LLaMA, SD UNet block): layouts and names, deterministic init,
ONNX export checked against onnxruntime and against opsnn.compile of the imported export, real
weights from local files, typed errors. Small configs keep this file fast."""

import numpy as np
import pytest

import opsnn
from opsnn import nn
from opsnn.models import export
from opsnn.models.bert import BERT_CONFIGS, bert, bert_config
from opsnn.models.llama import llama
from opsnn.models.resnet import resnet18, resnet50
from opsnn.models.unet import unet_block
from opsnn.models.weights import load_weights, save_weights

ort = pytest.importorskip("onnxruntime")
RTOL = 1e-4  # max |a - b| / max |b|, fp32


def rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def run_ort(proto, feeds):
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def run_compiled(proto, feeds):
    cg = opsnn.compile(opsnn.onnx.load(proto))
    out = cg.run(feeds)
    if not isinstance(out, dict):
        out = dict(zip(cg.output_names, out))
    assert cg.pass_report.nodes_after < cg.pass_report.nodes_before
    return {k: v.numpy() for k, v in out.items()}, cg


def check_export(proto, feeds, expected: dict):
    """The export run by onnxruntime and by opsnn.compile both match the eager outputs."""
    assert proto.opset_import[0].version == 17
    got = run_ort(proto, feeds)
    assert list(got) == list(expected)
    for k, e in expected.items():
        assert got[k].shape == e.shape, k
        assert rel(got[k], e) < RTOL, (k, rel(got[k], e))
    comp, cg = run_compiled(proto, feeds)
    for k, e in expected.items():
        assert rel(comp[k], e) < RTOL, (k, rel(comp[k], e))
    return cg


def op_counts(proto):
    from collections import Counter

    return Counter(n.op_type for n in proto.graph.node)


# -- ResNet-50 -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rn50():
    net = resnet50(num_classes=10, seed=0)
    # non-trivial BatchNorm statistics so BN (and Conv+BN folding) is really exercised
    r = np.random.default_rng(5)
    for _name, m in net.named_modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.load_state_dict(
                {
                    "weight": r.uniform(0.5, 1.0, c),
                    "bias": r.normal(0, 0.1, c),
                    "running_mean": r.normal(0, 0.1, c),
                    "running_var": r.uniform(0.8, 1.5, c),
                },
                strict=False,
            )
    return net


def test_resnet50_layout_matches_torchvision(rn50):
    full = resnet50(seed=0)  # 1000 classes: the exact torchvision parameter count
    assert full.num_parameters() == 25_557_032
    sd = full.state_dict()
    assert len(sd) == 320  # torchvision's resnet50 state_dict: params + BN buffers (incl. num_batches_tracked)
    for k, shape in {
        "conv1.weight": (64, 3, 7, 7),
        "layer1.0.downsample.0.weight": (256, 64, 1, 1),
        "layer2.0.conv2.weight": (128, 128, 3, 3),
        "layer4.2.bn3.running_var": (2048,),
        "fc.weight": (1000, 2048),
        "fc.bias": (1000,),
    }.items():
        assert sd[k].shape == shape, k
    assert sd["layer3.5.bn2.num_batches_tracked"].shape == ()
    assert resnet50(seed=0).conv1.weight.numpy().tolist() == full.conv1.weight.numpy().tolist()


def test_resnet50_export_matches_onnxruntime_and_compile(rn50):
    x = np.random.default_rng(1).standard_normal((1, 3, 64, 64)).astype(np.float32)
    y = rn50(x).numpy()
    assert y.shape == (1, 10)
    proto = export.to_onnx(rn50)
    ops = op_counts(proto)
    assert ops["BatchNormalization"] == 53 and ops["Conv"] == 53 and ops["Gemm"] == 1
    cg = check_export(proto, {"input": x}, {"logits": y})
    kinds = {n.op_type for n in cg.graph.nodes}
    assert "BatchNormalization" not in kinds  # folded into the convs


def test_resnet_weights_from_a_torchvision_style_checkpoint(tmp_path, rng):
    """A DataParallel checkpoint ("module." prefix, no num_batches_tracked) in .safetensors loads
    into a differently seeded ResNet; onnxruntime on the source model's export is the oracle."""
    pytest.importorskip("safetensors")
    src = resnet18(num_classes=10, seed=0)
    x = rng.standard_normal((1, 3, 32, 32)).astype(np.float32)
    ref = run_ort(export.to_onnx(src), {"input": x})["logits"]
    sd = {"module." + k: v.numpy() for k, v in src.state_dict().items() if not k.endswith("num_batches_tracked")}
    path = nn.write_weights(sd, tmp_path / "rn18.safetensors")
    loaded = resnet18(num_classes=10, seed=1, weights=path)
    assert rel(resnet18(num_classes=10, seed=1)(x).numpy(), ref) > 1e-2  # the seed alone gives other logits
    assert rel(loaded(x).numpy(), ref) < RTOL
    sd["module.fc.weight"] = sd["module.fc.weight"][:, :100]
    bad = nn.write_weights(sd, tmp_path / "bad.safetensors")
    with pytest.raises(nn.StateDictError, match=r"fc\.weight \(expected \(10, 512\), got \(10, 100\)\)"):
        resnet18(num_classes=10, weights=bad)


# -- BERT -----------------------------------------------------------------------------------------------------------
def test_bert_configs():
    base = bert_config("base")
    assert (
        base.num_hidden_layers,
        base.hidden_size,
        base.num_attention_heads,
        base.intermediate_size,
        base.vocab_size,
        base.max_position_embeddings,
    ) == (12, 768, 12, 3072, 30522, 512)
    assert bert_config("tiny", vocab_size=99).vocab_size == 99 and set(BERT_CONFIGS) >= {"tiny", "base", "large"}
    with pytest.raises(opsnn.errors.ParamInvalidError, match="unknown config"):
        bert("huge")
    with pytest.raises(opsnn.errors.ParamInvalidError, match="unknown config fields"):
        bert("tiny", hidden=3)


def _bert_inputs(rng, vocab):
    ids = rng.integers(1, vocab, (2, 9)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 6:] = 0
    tt = np.zeros_like(ids)
    tt[:, 5:] = 1
    return ids, mask, tt


def test_bert_tiny_export_and_padding(rng):
    m = bert("tiny", vocab_size=1000, seed=0)
    ids, mask, tt = _bert_inputs(rng, 1000)
    seq, pooled = m(ids, mask, tt)
    # padding really is ignored: the unpadded prefix gives the same hidden states
    s1, _ = m(ids[1:, :6], mask[1:, :6], tt[1:, :6])
    assert rel(seq.numpy()[1, :6], s1.numpy()[0]) < 1e-5
    proto = export.to_onnx(m)
    ops = op_counts(proto)
    assert ops["Erf"] == 2 and ops["Softmax"] == 2 and ops["ReduceMean"] == 2 * 5  # decomposed LN x5, Gelu x2
    check_export(
        proto,
        {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt},
        {"last_hidden_state": seq.numpy(), "pooler_output": pooled.numpy()},
    )


def test_bert_weights_from_files_and_errors(tmp_path, rng):
    m = bert("tiny", vocab_size=500, seed=1)
    ids, mask, tt = _bert_inputs(rng, 500)
    ref = m(ids, mask, tt)[0].numpy()
    # Hugging Face style checkpoint: "bert." prefix, legacy gamma/beta, extra pre-training head and buffer
    sd = {
        ("bert." + k)
        .replace("LayerNorm.weight", "LayerNorm.gamma")
        .replace("LayerNorm.bias", "LayerNorm.beta"): v.numpy()
        for k, v in m.state_dict().items()
    }
    sd["cls.predictions.bias"] = np.zeros(500, np.float32)
    sd["bert.embeddings.position_ids"] = np.arange(512)[None]
    pytest.importorskip("safetensors")
    path = nn.write_weights(sd, tmp_path / "hf.safetensors")
    m2 = bert("tiny", vocab_size=500, seed=2, weights=path)
    assert rel(m2(ids, mask, tt)[0].numpy(), ref) == 0
    # from the initializers of an exported ONNX file (transposed MatMul weights read back)
    onnx_path = tmp_path / "bert.onnx"
    export.to_onnx(m, onnx_path)
    m3 = bert("tiny", vocab_size=500, seed=3, weights=onnx_path)
    assert rel(m3(ids, mask, tt)[0].numpy(), ref) == 0
    # npz with a mis-shaped, a missing and an unexpected tensor
    sd = {k: v.numpy() for k, v in m.state_dict().items()}
    sd["encoder.layer.1.output.dense.weight"] = np.zeros((128, 100), np.float32)
    del sd["pooler.dense.bias"]
    sd["decoder.weight"] = np.zeros(3, np.float32)
    bad = save_weights(m, tmp_path / "ok.npz") and nn.write_weights(sd, tmp_path / "bad.npz")
    with pytest.raises(nn.StateDictError) as ei:
        bert("tiny", vocab_size=500, weights=bad)
    e = ei.value
    assert e.missing == ["pooler.dense.bias"] and e.unexpected == ["decoder.weight"]
    assert e.mismatched == [("encoder.layer.1.output.dense.weight", (128, 512), (128, 100))]
    assert "pooler.dense.bias" in str(e) and "decoder.weight" in str(e)


def test_bert_errors():
    m = bert("tiny", vocab_size=100, max_position_embeddings=16)
    with pytest.raises(nn.OutOfVocabularyError, match="100"):
        m(np.array([[1, 2, 100]]))
    with pytest.raises(opsnn.errors.ParamInvalidError, match="max_position"):
        m(np.ones((1, 17), np.int64))
    with pytest.raises(opsnn.errors.ParamInvalidError, match="attention_mask"):
        m(np.ones((1, 4), np.int64), attention_mask=np.ones((1, 5), np.int64))


def test_bert_to_graph_compiles(rng):
    m = bert("tiny", vocab_size=200, num_hidden_layers=1, seed=0)
    ids, mask, tt = _bert_inputs(rng, 200)
    g = m.to_graph([ids, mask, tt])
    assert [v.name for v in g.inputs] == ["input_ids", "attention_mask", "token_type_ids"]
    cg = opsnn.compile(g)
    out = cg.run([ids, mask, tt])
    out = list(out.values()) if isinstance(out, dict) else list(out)
    seq, pooled = m(ids, mask, tt)
    assert rel(out[0].numpy(), seq.numpy()) < RTOL and rel(out[1].numpy(), pooled.numpy()) < RTOL
    # traced with a dynamic batch and sequence length, it runs at other lengths (the position ids
    # it reads are sliced by the input's length, not the example's)
    dyn = {"input_ids": {0: "b", 1: "s"}, "attention_mask": {0: "b", 1: "s"}, "token_type_ids": {0: "b", 1: "s"}}
    cg = opsnn.compile(m.to_graph([ids, mask, tt], dynamic_dims=dyn))
    for b, s in ((1, 5), (3, 11)):
        ids2, tt2 = rng.integers(0, 200, (b, s)).astype(np.int64), rng.integers(0, 2, (b, s)).astype(np.int64)
        mask2 = np.ones((b, s), np.int64)
        mask2[0, s - 2 :] = 0
        out = cg.run([ids2, mask2, tt2])
        out = list(out.values()) if isinstance(out, dict) else list(out)
        seq, pooled = m(ids2, mask2, tt2)
        assert out[0].shape == (b, s, 128)
        assert rel(out[0].numpy(), seq.numpy()) < RTOL and rel(out[1].numpy(), pooled.numpy()) < RTOL


# -- LLaMA -----------------------------------------------------------------------------------------------------------
def _tiny_llama(**kw):
    cfg = dict(layers=2, hidden=64, heads=4, kv_heads=2, vocab=120, intermediate=96, max_position=64, seed=0)
    cfg.update(kw)
    return llama(**cfg)


def test_llama_layout_and_cache_consistency(rng):
    lm = _tiny_llama()
    sd = lm.state_dict()
    assert sd["model.layers.1.self_attn.k_proj.weight"].shape == (32, 64)  # 2 kv heads x 16
    assert sd["model.layers.0.mlp.gate_proj.weight"].shape == (96, 64) and "lm_head.weight" in sd
    assert "model.rope_cos" not in sd  # derived buffers are not weights
    ids = rng.integers(0, 120, (2, 7)).astype(np.int64)
    full, _ = lm(ids)
    # prefill 4 tokens, then decode the rest one at a time with the cache
    logits, past = lm(ids[:, :4])
    steps = [logits.numpy()]
    for t in range(4, 7):
        logits, past = lm(ids[:, t : t + 1], past)
        steps.append(logits.numpy())
    assert past[0][0].shape == (2, 2, 7, 16)
    assert rel(np.concatenate(steps, axis=1), full.numpy()) < 1e-5
    # RoPE is relative: a uniform shift of positions keeps the logits; spreading them does not
    shifted, _ = lm(ids, position_offset=3)
    assert rel(shifted.numpy(), full.numpy()) < 1e-5
    same, _ = lm(ids, position_ids=np.broadcast_to(np.arange(3, 10), (2, 7)))
    assert rel(same.numpy(), shifted.numpy()) == 0
    spread, _ = lm(ids, position_ids=np.broadcast_to(np.arange(0, 14, 2), (2, 7)))
    assert rel(spread.numpy(), full.numpy()) > 1e-3


def test_llama_export_prefill_and_decode(rng):
    lm = _tiny_llama()
    ids = rng.integers(0, 120, (2, 5)).astype(np.int64)
    pos = np.broadcast_to(np.arange(5), (2, 5)).astype(np.int64)
    logits, past = lm(ids)
    expected = {"logits": logits.numpy()}
    for i, (k, v) in enumerate(past):
        expected[f"present.{i}.key"], expected[f"present.{i}.value"] = k.numpy(), v.numpy()
    proto = export.to_onnx(lm, with_past=False)
    ops = op_counts(proto)
    assert ops["Reciprocal"] == 5 and ops["Sigmoid"] == 2 and ops["Tile"] == 4  # RMSNorm x5, SiLU x2, GQA
    check_export(proto, {"input_ids": ids, "position_ids": pos}, expected)
    # one decode step against the cache
    nxt = rng.integers(0, 120, (2, 1)).astype(np.int64)
    logits2, past2 = lm(nxt, past)
    feeds = {"input_ids": nxt, "position_ids": np.full((2, 1), 5, np.int64)}
    expected = {"logits": logits2.numpy()}
    for i, ((pk, pv), (k, v)) in enumerate(zip(past, past2)):
        feeds[f"past_key_values.{i}.key"], feeds[f"past_key_values.{i}.value"] = pk.numpy(), pv.numpy()
        expected[f"present.{i}.key"], expected[f"present.{i}.value"] = k.numpy(), v.numpy()
    check_export(export.to_onnx(lm, with_past=True), feeds, expected)


def test_llama_tied_embeddings_and_weights(tmp_path, rng):
    lm = _tiny_llama(tie_word_embeddings=True, kv_heads=4, layers=1)
    assert lm.lm_head is None and "lm_head.weight" not in lm.state_dict()
    ids = rng.integers(0, 120, (1, 6)).astype(np.int64)
    logits, past = lm(ids)
    h = np.asarray(lm.model(ids, None, np.arange(6)[None])[0].numpy())
    assert rel(logits.numpy(), h @ lm.model.embed_tokens.weight.numpy().T) < 1e-5
    expected = {"logits": logits.numpy(), "present.0.key": past[0][0].numpy(), "present.0.value": past[0][1].numpy()}
    check_export(export.to_onnx(lm, with_past=False), {"input_ids": ids, "position_ids": np.arange(6)[None]}, expected)
    # an HF checkpoint of a tied model may still carry lm_head.weight and rotary inv_freq
    sd = {k: v.numpy() for k, v in lm.state_dict().items()}
    sd["lm_head.weight"] = sd["model.embed_tokens.weight"]
    sd["model.layers.0.self_attn.rotary_emb.inv_freq"] = np.ones(8, np.float32)
    path = nn.write_weights(sd, tmp_path / "llama.npz")
    lm2 = _tiny_llama(tie_word_embeddings=True, kv_heads=4, layers=1, seed=9, weights=path)
    assert rel(lm2(ids)[0].numpy(), logits.numpy()) == 0


def test_llama_errors():
    lm = _tiny_llama(layers=1)
    with pytest.raises(nn.OutOfVocabularyError, match="llama"):
        lm(np.array([[5, 120]]))
    with pytest.raises(opsnn.errors.ParamInvalidError, match="max_position"):
        lm(np.array([[1, 2]]), position_offset=63)
    _, past = lm(np.array([[1, 2]]))
    with pytest.raises(opsnn.errors.ParamInvalidError, match="past_key_values"):
        lm(np.array([[3]]), [(past[0][0], past[0][1][:, :, :1])])
    with pytest.raises(opsnn.errors.ParamInvalidError, match="multiple of kv_heads"):
        llama(heads=4, kv_heads=3)


# -- UNet block --------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("temb", [None, 40])
def test_unet_block_export(rng, temb):
    blk = unet_block(in_channels=32, out_channels=64, context_dim=48, heads=2, groups=8, temb_channels=temb, seed=0)
    assert blk.resnets[1].conv1.dilation == (2, 2) and blk.resnets[0].conv_shortcut is not None
    x = rng.standard_normal((2, 32, 8, 8)).astype(np.float32)
    ctx = rng.standard_normal((2, 7, 48)).astype(np.float32)
    feeds = {"sample": x, "encoder_hidden_states": ctx}
    args = [x, ctx]
    if temb:
        feeds["temb"] = t = rng.standard_normal((2, temb)).astype(np.float32)
        args.append(t)
    y = blk(*args).numpy()
    assert y.shape == (2, 64, 8, 8)
    proto = export.to_onnx(blk)
    ops = op_counts(proto)
    assert ops["InstanceNormalization"] == 5 and ops["Softmax"] == 2 and ops["Erf"] == 1
    check_export(proto, feeds, {"out_sample": y})


def test_unet_block_errors_and_weights(tmp_path, rng):
    blk = unet_block(in_channels=16, out_channels=16, context_dim=8, heads=2, groups=4, temb_channels=4)
    x = rng.standard_normal((1, 16, 4, 4)).astype(np.float32)
    ctx = rng.standard_normal((1, 3, 8)).astype(np.float32)
    with pytest.raises(opsnn.errors.ParamInvalidError, match="temb"):
        blk(x, ctx)
    with pytest.raises(opsnn.errors.ParamInvalidError, match="context"):
        blk(x, ctx[..., :4], np.zeros((1, 4), np.float32))
    with pytest.raises(opsnn.errors.ParamInvalidError, match="divisible"):
        unet_block(in_channels=10, out_channels=16, groups=4)
    onnx_path = tmp_path / "unet.onnx"
    export.to_onnx(blk, onnx_path)
    other = unet_block(in_channels=16, out_channels=16, context_dim=8, heads=2, groups=4, temb_channels=4, seed=5)
    load_weights(other, onnx_path)
    t = np.ones((1, 4), np.float32)
    assert rel(other(x, ctx, t).numpy(), blk(x, ctx, t).numpy()) == 0


def test_to_graph_llama_and_unet(rng):
    lm = _tiny_llama()
    ids = rng.integers(0, 120, (1, 5)).astype(np.int64)
    g = lm.to_graph([ids])
    assert [v.name for v in g.inputs] == ["input_ids"] and len(g.outputs) == 1 + 2 * 2  # logits + presents
    out = opsnn.compile(g).run([ids])
    out = list(out.values()) if isinstance(out, dict) else list(out)
    assert rel(out[0].numpy(), lm(ids)[0].numpy()) < RTOL
    # traced with a dynamic batch and length: the default positions (0..S-1) follow the input
    cg = opsnn.compile(lm, [ids], dynamic_dims={"input_ids": {0: "b", 1: "s"}})
    for b, s in ((2, 9), (1, 3)):
        ids2 = rng.integers(0, 120, (b, s)).astype(np.int64)
        assert rel(cg.run([ids2])[0].numpy(), lm(ids2)[0].numpy()) < RTOL
    blk = unet_block(in_channels=16, out_channels=32, context_dim=8, heads=2, groups=4, seed=0)
    x, c = rng.standard_normal((2, 16, 4, 4)).astype(np.float32), rng.standard_normal((2, 3, 8)).astype(np.float32)
    cg = opsnn.compile(blk.to_graph([x, c], dynamic_dims={"x": {0: "b"}, "context": {0: "b", 1: "l"}}))
    x3, c3 = rng.standard_normal((3, 16, 4, 4)).astype(np.float32), rng.standard_normal((3, 5, 8)).astype(np.float32)
    out = cg.run([x3, c3])
    out = list(out.values()) if isinstance(out, dict) else list(out)
    assert rel(out[0].numpy(), blk(x3, c3).numpy()) < RTOL
    # ... and with a dynamic image size (the attention's tokens are reshaped back by x's own size)
    cg = opsnn.compile(blk, [x, c], dynamic_dims={"x": {0: "b", 2: "h", 3: "w"}, "context": {0: "b"}})
    x5 = rng.standard_normal((2, 16, 6, 5)).astype(np.float32)
    out = cg.run([x5, c])
    out = list(out.values()) if isinstance(out, dict) else list(out)
    assert out[0].shape == (2, 32, 6, 5) and rel(out[0].numpy(), blk(x5, c).numpy()) < RTOL


def test_export_checks_the_graph_without_serializing_the_weights(rng):
    """``to_onnx`` runs onnx's checker on the model's structure (initializers as empty tensors of their
    types): the exported file passes the full checker, and a bad node is still refused by name."""
    import onnx

    proto = export.to_onnx(bert("tiny", vocab_size=1000, seed=0))
    onnx.checker.check_model(proto)  # weights included
    skel = export._skeleton(proto)
    assert [n.name for n in skel.graph.node] == [n.name for n in proto.graph.node]
    assert [(t.name, t.data_type) for t in skel.graph.initializer] == [
        (t.name, t.data_type) for t in proto.graph.initializer
    ]
    assert skel.ByteSize() < proto.ByteSize() // 100
    b = export.OnnxBuilder("bad")
    x = b.input("x", np.float32, [1, 4])
    w = b.weight("w", rng.standard_normal((4, 4)).astype(np.float32))
    b.outputs.append(onnx.helper.make_tensor_value_info(b.op("MatMulX", [x, w]), onnx.TensorProto.FLOAT, [1, 4]))
    with pytest.raises(onnx.checker.ValidationError, match="MatMulX"):
        b.model()
