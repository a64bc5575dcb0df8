"""Rank program for tests/test_ddp.py, run as ``opsnn launch -n 2 ddp.py SCENARIO`` (mpirun).

Each scenario checks DistributedDataParallel from inside the ranks (numpy asserts, with the
single-process reference computed on rank 0) and prints ``PASS <check>`` lines; an assertion
nobody catches aborts the whole job (opsnn.distributed's exception hook), so a failed rank never
leaves its peer waiting in a collective.
"""

from __future__ import annotations

import hashlib
import re
import sys

import numpy as np

import opsnn
import opsnn.distributed as dist
from opsnn import nn, ops, optim
from opsnn.nn.parallel import DDP, ModelMismatchError, ReducerStateError, UnusedParameterError
from opsnn.runtime import hooks

RANK = WORLD = 0
#: DDP against one process on the whole batch: float32, the gradients summed in another order
#: (two half-batch means averaged, against one mean) over 5 steps
RTOL, ATOL = 1e-5, 1e-7


def report(what: str) -> None:
    print(f"PASS {what}", flush=True)  # the launcher tags the line with the rank


# -- models ------------------------------------------------------------------------------------------------------
def cnn(seed: int) -> nn.Module:
    """conv-bn-relu-pool-linear; BatchNorm's running statistics are random (per seed), so the
    construction broadcast of buffers is visible."""
    with nn.init.seeded(seed):
        m = nn.Sequential(
            nn.Conv2d(3, 8, 3, padding=1),
            nn.BatchNorm2d(8),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(8 * 4 * 4, 5),
        )
    rng = np.random.default_rng(100 + seed)
    m[1].running_mean.copy_(rng.standard_normal(8).astype(np.float32) * 0.1)
    m[1].running_var.copy_(rng.uniform(0.5, 2.0, 8).astype(np.float32))
    return m


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        # no projection biases: the key bias has a true gradient of exactly 0 (softmax ignores a
        # constant per row), and AdamW would turn rounding noise there into full-size steps
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True, bias=False)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.ff1, self.act, self.ff2 = nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d)

    def forward(self, x, pad):
        a = self.attn(x, x, x, key_padding_mask=pad, need_weights=False)[0]
        x = self.norm1(x + a)
        return self.norm2(x + self.ff2(self.act(self.ff1(x))))


class Encoder(nn.Module):
    def __init__(self, vocab=11, d=16, heads=4, layers=2, classes=3):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.head = nn.Linear(d, classes)

    def forward(self, ids, pad):
        x = self.emb(ids)
        for b in self.blocks:
            x = b(x, pad)
        return self.head(x)


def encoder(seed: int) -> nn.Module:
    with nn.init.seeded(seed):
        return Encoder()


def batches(kind: str, steps: int, n: int = 8, seed: int = 7):
    """The same global batches on every rank."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        if kind == "cnn":
            out.append((rng.standard_normal((n, 3, 8, 8)).astype(np.float32), rng.integers(0, 5, size=n)))
        else:
            ids = rng.integers(0, 11, size=(n, 6))
            pad = np.zeros((n, 6), bool)
            pad[1::3, 4:] = True  # some padded keys (the labels stay valid: each shard's mean is over all tokens)
            out.append(((ids, pad), rng.integers(0, 3, size=(n, 6))))
    return out


def loss_of(kind: str, model, x, y):
    if kind == "cnn":
        return nn.functional.cross_entropy(model(opsnn.tensor(x)), y)
    ids, pad = x
    return nn.functional.cross_entropy(ops.transpose(model(ids, pad), [0, 2, 1]), y)


def shard(kind: str, x, y, rank: int, world: int):
    n = len(y) // world
    s = slice(rank * n, (rank + 1) * n)
    if kind == "cnn":
        return x[s], y[s]
    return (x[0][s], x[1][s]), y[s]


def make_opt(name: str, params):
    if name == "sgd":
        return optim.SGD(params, lr=0.05, momentum=0.9, weight_decay=1e-4)
    return optim.AdamW(params, lr=3e-3, weight_decay=0.05)


# -- cross-rank checks --------------------------------------------------------------------------------------------
def gather_bytes(data: bytes) -> list[bytes]:
    t = opsnn.tensor(np.frombuffer(data, np.uint8).copy())
    outs = [opsnn.empty(t.shape, "uint8") for _ in range(WORLD)]
    dist.all_gather(outs, t)
    return [o.numpy().tobytes() for o in outs]


def digest(module: nn.Module, grads: bool = False, buffers: bool = True) -> bytes:
    h = hashlib.sha256()
    for n, p in module.named_parameters():
        t = p.grad if grads else p
        h.update(n.encode())
        h.update(b"-" if t is None else np.ascontiguousarray(t.numpy()).tobytes())
    for n, b in module.named_buffers() if buffers else ():
        h.update(n.encode())
        h.update(np.ascontiguousarray(b.numpy()).tobytes())
    return h.digest()


def same_on_all_ranks(module: nn.Module, what: str, grads: bool = False, buffers: bool = True) -> None:
    ds = gather_bytes(digest(module, grads, buffers))
    assert all(d == ds[0] for d in ds), f"{what}: ranks differ"


def differ_across_ranks(module: nn.Module, what: str, grads: bool = False) -> None:
    ds = gather_bytes(digest(module, grads))
    assert len(set(ds)) == WORLD, f"{what}: expected the ranks to differ"


def assert_params_close(model, ref, what: str) -> None:
    refs = dict(ref.named_parameters())
    for n, p in model.named_parameters():
        np.testing.assert_allclose(p.numpy(), refs[n].numpy(), rtol=RTOL, atol=ATOL, err_msg=f"{what}: {n}")


# -- scenarios ---------------------------------------------------------------------------------------------------
def scenario_train() -> None:
    """2 ranks on half of every batch == 1 process on the whole batch, 5 SGD-momentum and 5 AdamW
    steps of the CNN and the encoder; bitwise-equal parameters on every rank after every step; at
    least one bucket launched before backward's last gradient (overlap)."""
    for kind, build in (("cnn", cnn), ("encoder", encoder)):
        for opt_name in ("sgd", "adamw"):
            model = build(RANK)  # a different init per rank: the construction broadcast makes rank 0's the model
            if kind == "cnn":
                model.eval()  # BatchNorm on its running statistics: half-batch statistics would differ from the whole's
            ddp = DDP(model, bucket_cap_mb=0.002)
            same_on_all_ranks(model, f"{kind}: after construction")
            assert len(ddp.bucket_sizes) > 1
            order = gather_bytes("|".join(",".join(b) for b in ddp.bucket_parameters).encode())
            assert all(o == order[0] for o in order), "bucket order differs between ranks"
            opt = make_opt(opt_name, ddp.parameters())
            ref = ref_opt = None
            if RANK == 0:
                ref = build(0)
                if kind == "cnn":
                    ref.eval()
                ref_opt = make_opt(opt_name, ref.parameters())
                assert_params_close(model, ref, f"{kind} initial")
            for step, (x, y) in enumerate(batches(kind, 5)):
                opt.zero_grad()
                xs, ys = shard(kind, x, y, RANK, WORLD)
                seen: list = []
                stop = hooks.subscribe("host", lambda ev: ev["category"] == "ddp" and seen.append(ev["name"]))
                loss_of(kind, ddp, xs, ys).backward()
                stop()
                # the profiler's timeline sees each bucket's launch and the wait at the end of backward
                assert seen == [f"DDP bucket {b} launch" for b in range(len(ddp.bucket_sizes))] + [
                    "DDP wait for buckets"
                ], seen
                ev = ddp.last_backward["events"]
                kinds = [e[0] for e in ev]
                last_grad = max(k for k, e in enumerate(kinds) if e == "grad")
                assert kinds.index("launch") < last_grad, f"no allreduce launched during backward: {kinds}"
                assert kinds.count("launch") == len(ddp.bucket_sizes) and kinds[-1] == "end"
                same_on_all_ranks(model, f"{kind}/{opt_name} step {step} gradients", grads=True)
                opt.step()
                same_on_all_ranks(model, f"{kind}/{opt_name} step {step} parameters")
                if RANK == 0:
                    ref_opt.zero_grad()
                    loss_of(kind, ref, x, y).backward()
                    ref_opt.step()
                    assert_params_close(model, ref, f"{kind}/{opt_name} step {step}")
            report(f"train {kind} {opt_name}")
    report("train")


def scenario_misc() -> None:
    check_no_sync()
    check_buffer_broadcast()
    check_mismatch()
    check_unused()
    check_resume(sys.argv[2])
    check_mixed_dtypes()
    report("misc")


def check_no_sync() -> None:
    """Two micro-batches, the first under no_sync(): one step == one process accumulating the two
    whole micro-batches; the no_sync backward communicates nothing (the ranks' gradients differ)."""
    model = encoder(RANK)
    ddp = DDP(model, bucket_cap_mb=0.002)
    opt = make_opt("sgd", ddp.parameters())
    ref = encoder(0)
    ref_opt = make_opt("sgd", ref.parameters())
    data = batches("encoder", 4, seed=11)
    for it in range(2):
        micro = data[2 * it : 2 * it + 2]
        opt.zero_grad()
        xs, ys = shard("encoder", *micro[0], RANK, WORLD)
        with ddp.no_sync():
            loss_of("encoder", ddp, xs, ys).backward()
        assert ddp._state == "idle"
        differ_across_ranks(model, "gradients after the no_sync backward", grads=True)
        xs, ys = shard("encoder", *micro[1], RANK, WORLD)
        loss_of("encoder", ddp, xs, ys).backward()
        same_on_all_ranks(model, "gradients after the synchronised backward", grads=True)
        opt.step()
        same_on_all_ranks(model, "parameters after the accumulated step")
        ref_opt.zero_grad()
        for x, y in micro:
            loss_of("encoder", ref, x, y).backward()
        ref_opt.step()
        assert_params_close(model, ref, f"no_sync accumulation, step {it}")
    report("no_sync")


def check_buffer_broadcast() -> None:
    """Train-mode BatchNorm updates its running statistics from each rank's own half batch; the
    next forward starts from rank 0's (broadcast_buffers=True), or from each rank's own (False)."""
    for broadcast in (True, False):
        model = cnn(RANK).train()
        ddp = DDP(model, broadcast_buffers=broadcast)
        bn = model[1]
        m = bn.momentum
        x = [np.random.default_rng(50 + r).standard_normal((4, 3, 8, 8)).astype(np.float32) for r in range(WORLD)]
        after = []
        for _ in range(2):
            ops.sum(ddp(opsnn.tensor(x[RANK]))).backward()
            rows = gather_bytes(bn.running_mean.numpy().astype(np.float64).tobytes())
            after.append([np.frombuffer(r, np.float64) for r in rows])
        # this rank's batch mean of the conv output, in float64 (the weights did not change: no step)
        with opsnn.no_grad():
            mean = model[0](opsnn.tensor(x[RANK])).numpy().astype(np.float64).mean(axis=(0, 2, 3))
        assert not np.array_equal(after[0][0], after[0][1]), "each rank updates from its own half batch"
        start = after[0][0] if broadcast else after[0][RANK]  # where this rank's second forward started
        np.testing.assert_allclose(after[1][RANK], (1 - m) * start + m * mean, rtol=1e-5, atol=1e-6)
        same_on_all_ranks(model, "gradients", grads=True, buffers=False)
    report("buffer broadcast")


def check_mismatch() -> None:
    """Ranks holding different models fail at construction, on every rank, naming the parameter and the ranks."""
    cases = [
        (
            lambda: nn.Sequential(nn.Linear(4, 3 if RANK == 0 else 5), nn.Linear(3 if RANK == 0 else 5, 2)),
            r"parameter '0.weight' \(position 0\) is \(3, 4\) float32 requires_grad=True on rank 0; "
            r"\(5, 4\) float32 requires_grad=True on rank 1",
        ),
        (
            lambda: nn.Sequential(nn.Linear(4, 3), nn.Linear(3, 2)) if RANK == 0 else nn.Sequential(nn.Linear(4, 3)),
            r"parameter '1.weight' \(position 2\) is \(2, 3\) float32 requires_grad=True on rank 0; nothing on rank 1",
        ),
        (
            lambda: nn.Sequential(nn.Linear(4, 3)).requires_grad_(RANK == 0),
            r"requires_grad=True on rank 0; \(3, 4\) float32 requires_grad=False on rank 1",
        ),
    ]
    for build, pattern in cases:
        try:
            DDP(build())
        except ModelMismatchError as exc:
            assert re.search(pattern, str(exc)), str(exc)
        else:
            raise AssertionError("different models on the ranks were accepted")
    report("mismatch")


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.body, self.a, self.b, self.never = nn.Linear(4, 6), nn.Linear(6, 2), nn.Linear(6, 2), nn.Linear(6, 2)

    def forward(self, x, use_b: bool):
        h = self.body(x)
        out = self.a(h)
        return out + self.b(h) if use_b else out


def check_unused() -> None:
    """A parameter without a gradient: an error explaining find_unused_parameters; with it, a head used
    on rank 0 only gets rank 0's gradient over the world size, a head used nowhere keeps .grad None."""
    x = opsnn.tensor(np.random.default_rng(RANK).standard_normal((3, 4)).astype(np.float32))
    with nn.init.seeded(0):
        ddp = DDP(TwoHeads())
    try:
        ops.sum(ddp(x, use_b=True)).backward()
    except UnusedParameterError as exc:
        assert "'never.weight', 'never.bias'" in str(exc) and "find_unused_parameters=True" in str(exc), str(exc)
    else:
        raise AssertionError("a parameter without a gradient passed")
    with nn.init.seeded(0):
        model = TwoHeads()
    ddp = DDP(model, find_unused_parameters=True)
    local = None
    if RANK == 0:
        with nn.init.seeded(0):
            alone = TwoHeads()
        ops.sum(alone(x, use_b=True)).backward()
        local = alone.b.weight.grad.numpy().copy()
    ops.sum(ddp(x, use_b=RANK == 0)).backward()
    assert model.never.weight.grad is None and model.never.bias.grad is None
    same_on_all_ranks(model, "gradients with unused parameters", grads=True)
    if RANK == 0:
        np.testing.assert_allclose(model.b.weight.grad.numpy(), local / WORLD, rtol=1e-6)
    try:  # a second backward after one forward would desynchronise the ranks
        out = ddp(x, use_b=True)
        ops.sum(out).backward(retain_graph=True)
        ops.sum(out).backward()
    except ReducerStateError as exc:
        assert "second backward" in str(exc)
    else:
        raise AssertionError("a second backward after one forward passed")
    report("unused parameters")


def check_resume(directory: str) -> None:
    """A checkpoint written by rank 0 alone mid-run: every rank loads it into a fresh model and
    continues bit-identically to the run that wrote it."""
    data = batches("encoder", 4, seed=21)

    def train(ddp, opt, steps):
        for x, y in steps:
            opt.zero_grad()
            loss_of("encoder", ddp, *shard("encoder", x, y, RANK, WORLD)).backward()
            opt.step()

    model = encoder(RANK)
    ddp = DDP(model)
    opt = make_opt("adamw", ddp.parameters())
    train(ddp, opt, data[:2])
    path = f"{directory}/ddp.safetensors"
    dist.run_on_rank0(opsnn.save_checkpoint, path, model, opt, step=2)
    train(ddp, opt, data[2:])
    resumed = encoder(RANK + 10)
    ddp2 = DDP(resumed)
    opt2 = make_opt("adamw", ddp2.parameters())
    assert opsnn.load_checkpoint(path, resumed, opt2)["step"] == 2
    train(ddp2, opt2, data[2:])
    theirs = dict(model.named_parameters())
    for n, p in resumed.named_parameters():
        np.testing.assert_array_equal(p.numpy(), theirs[n].numpy(), err_msg=f"resumed: {n}")
    same_on_all_ranks(resumed, "resumed parameters")
    report("resume")


class MixedDtypes(nn.Module):
    def __init__(self):
        super().__init__()
        self.low, self.high = nn.Linear(4, 3), nn.Linear(3, 2, dtype="float64")

    def forward(self, x):
        return self.high(ops.cast(ops.tanh(self.low(x)), np.float64))


def check_mixed_dtypes() -> None:
    """A float32 and a float64 layer: one bucket per dtype; each .grad is the mean over ranks of the
    local gradients (numpy's float64 mean of every rank's own autograd gradients)."""
    x = np.random.default_rng(30 + RANK).standard_normal((5, 4)).astype(np.float32)
    with nn.init.seeded(3):
        model = MixedDtypes()
    with nn.init.seeded(3):
        alone = MixedDtypes()
    ddp = DDP(model, bucket_cap_mb=1e-4)
    params = dict(model.named_parameters())
    kinds = [{np.dtype(params[n].dtype).name for n in b} for b in ddp.bucket_parameters]
    assert all(len(k) == 1 for k in kinds) and set().union(*kinds) == {"float32", "float64"}, kinds
    names = [n for n, _ in alone.named_parameters()]
    local = opsnn.autograd.grad(ops.sum(alone(opsnn.tensor(x))), list(alone.parameters()))
    ops.sum(ddp(opsnn.tensor(x))).backward()
    for n, g in zip(names, local):
        rows = gather_bytes(g.numpy().astype(np.float64).tobytes())
        want = np.mean([np.frombuffer(r, np.float64) for r in rows], axis=0).reshape(g.shape)
        have = params[n].grad
        assert have.dtype == g.dtype, n
        tol = 1e-6 if have.dtype == np.float32 else 1e-13
        np.testing.assert_allclose(have.numpy(), want, rtol=tol, atol=tol, err_msg=n)
    report("mixed dtypes")


# -- compiled training step --------------------------------------------------------------------------------------
def mlp(seed: int) -> nn.Module:
    with nn.init.seeded(seed):
        return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 12), nn.ReLU(), nn.Linear(12, 5))


def compiled_batches(kind: str, steps: int = 5, n: int = 8):
    if kind == "cnn":
        return batches("cnn", steps, n, seed=17)
    rng = np.random.default_rng(19)
    return [(rng.standard_normal((n, 6)).astype(np.float32), rng.integers(0, 5, size=n)) for _ in range(steps)]


def ddp_step(ddp, opt):
    def train_step(x, y):
        opt.zero_grad()
        loss = nn.functional.cross_entropy(ddp(x), y)
        loss.backward()
        opt.step()
        return loss

    return train_step


def check_allreduce_nodes(step, ddp) -> None:
    """The executed graph: one start and one wait per bucket, each in bucket order; the first start
    runs before backward has finished (a gradient op the last bucket depends on comes after it); the
    memory plan keeps each bucket's buffer to itself from its start to its wait."""
    g = step.compiled_graph.graph
    nodes = g.nodes
    starts = [k for k, nd in enumerate(nodes) if nd.op_type == "AllReduceStart"]
    waits = [k for k, nd in enumerate(nodes) if nd.op_type == "AllReduceWait"]
    nb = len(ddp.bucket_sizes)
    assert [nodes[k].attrs["bucket"] for k in starts] == list(range(nb)), [nodes[k].attrs for k in starts]
    assert [nodes[k].attrs["bucket"] for k in waits] == list(range(nb))
    update = min(k for k, nd in enumerate(nodes) if nd.op_type in ("ApplySGD", "ApplyAdamW"))
    assert max(starts) < min(waits) and max(waits) < update, (starts, waits, update)
    producer = {o: k for k, nd in enumerate(nodes) for o in nd.outputs if o}
    todo, ancestors = [nodes[starts[-1]].inputs[0]], set()
    while todo:
        k = producer.get(todo.pop())
        if k is not None and k not in ancestors:
            ancestors.add(k)
            todo.extend(i for i in nodes[k].inputs if i)
    overlapped = [
        nodes[k].op_type
        for k in ancestors
        if k > starts[0] and nodes[k].op_type not in ("Reshape", "Concat", "AllReduceStart", "Identity")
    ]
    assert overlapped, "no backward op of a later bucket runs after the first allreduce starts"
    mem = step.compiled_graph.latest_plan.memory
    spans = {b.name: b for b in mem.buffers}
    for k in starts:
        buf = nodes[k].outputs[0]
        b = spans[buf]
        assert b.end > b.start, (buf, b)
        lo, hi = mem.offsets[buf], mem.offsets[buf] + b.size
        for o in mem.buffers:
            if o.name == buf or o.end < b.start or o.start > b.end:
                continue
            olo = mem.offsets[o.name]
            assert olo + o.size <= lo or olo >= hi, f"{o.name} shares the bytes of {buf} while it is reduced"


def scenario_compiled() -> None:
    """DDP inside opsnn.compile(train_step): 2 ranks on half of every batch == eager DDP == one
    process on the whole batch, 5 SGD-momentum and 5 AdamW steps of an MLP and the CNN (eval-mode
    BatchNorm); parameters bitwise equal across ranks after every step; the graph's allreduces."""
    for kind, build in (("mlp", mlp), ("cnn", cnn)):
        for opt_name in ("sgd", "adamw"):
            models, ddps, opts, steps = [], [], [], []
            for compiled in (False, True):
                model = build(RANK)
                if kind == "cnn":
                    model.eval()
                ddp = DDP(model, bucket_cap_mb=0.0005)
                opt = make_opt(opt_name, ddp.parameters())
                fn = ddp_step(ddp, opt)
                models.append(model)
                ddps.append(ddp)
                opts.append(opt)
                steps.append(opsnn.compile(fn) if compiled else fn)
            assert len(ddps[1].bucket_sizes) > 1
            ref = build(0)
            if kind == "cnn":
                ref.eval()
            ref_opt = make_opt(opt_name, ref.parameters())
            ref_step = ddp_step(ref, ref_opt)
            for k, (x, y) in enumerate(compiled_batches(kind)):
                xs, ys = shard("cnn", x, y, RANK, WORLD)
                for fn in steps:
                    fn(opsnn.tensor(xs), opsnn.tensor(ys))
                same_on_all_ranks(models[1], f"compiled {kind}/{opt_name} step {k} parameters")
                ref_step(opsnn.tensor(x), opsnn.tensor(y))
                eager, comp, alone = (dict(m.named_parameters()) for m in (models[0], models[1], ref))
                for n in comp:
                    c = comp[n].numpy()
                    np.testing.assert_allclose(c, eager[n].numpy(), rtol=RTOL, atol=ATOL, err_msg=f"{kind} {n} eager")
                    np.testing.assert_allclose(c, alone[n].numpy(), rtol=RTOL, atol=ATOL, err_msg=f"{kind} {n} alone")
            assert steps[1].num_compiles == 1 and steps[1].mode == "compiled"
            check_allreduce_nodes(steps[1], ddps[1])
            report(f"compiled {kind} {opt_name}")
    check_compiled_no_sync()
    check_compiled_buffer_broadcast()
    check_compiled_unused()
    report("compiled")


def check_compiled_unused() -> None:
    """find_unused_parameters=True in a compiled step, head b used on rank 0 only and head never used
    nowhere: equals the eager DDP run over 3 SGD steps; b's update is the same on both ranks (rank 0's
    gradient over the world size), never's parameters keep .grad None and are not updated."""
    models, steps = [], []
    x = opsnn.tensor(np.random.default_rng(40 + RANK).standard_normal((3, 4)).astype(np.float32))
    for compiled in (False, True):
        with nn.init.seeded(0):
            model = TwoHeads()
        ddp = DDP(model, find_unused_parameters=True)
        opt = make_opt("sgd", ddp.parameters())

        def train_step(x, ddp=ddp, opt=opt):
            opt.zero_grad()
            loss = ops.sum(ddp(x, use_b=RANK == 0))
            loss.backward()
            opt.step()
            return loss

        models.append(model)
        steps.append(opsnn.compile(train_step) if compiled else train_step)
    with nn.init.seeded(0):
        start = TwoHeads()
    for k in range(3):
        for fn in steps:
            fn(x)
        same_on_all_ranks(models[1], f"compiled unused parameters step {k}")
        eager = dict(models[0].named_parameters())
        for n, p in models[1].named_parameters():
            np.testing.assert_allclose(p.numpy(), eager[n].numpy(), rtol=RTOL, atol=ATOL, err_msg=f"unused: {n}")
    assert steps[1].mode == "compiled" and steps[1].num_compiles == 1
    np.testing.assert_array_equal(models[1].never.weight.numpy(), start.never.weight.numpy())
    assert not np.array_equal(models[1].b.weight.numpy(), start.b.weight.numpy())
    report("compiled unused parameters")


def check_compiled_buffer_broadcast() -> None:
    """Train-mode BatchNorm with broadcast_buffers=True in a compiled step: rank 0's running statistics
    are broadcast by Broadcast nodes at the start of every replay, so the compiled run equals the eager
    DDP run (parameters and running statistics on each rank, 5 SGD-momentum steps)."""
    models, steps = [], []
    for compiled in (False, True):
        model = cnn(RANK).train()
        ddp = DDP(model, bucket_cap_mb=0.0005)
        fn = ddp_step(ddp, make_opt("sgd", ddp.parameters()))
        models.append(model)
        steps.append(opsnn.compile(fn) if compiled else fn)
    for k, (x, y) in enumerate(compiled_batches("cnn")):
        xs, ys = shard("cnn", x, y, RANK, WORLD)
        for fn in steps:
            fn(opsnn.tensor(xs), opsnn.tensor(ys))
        same_on_all_ranks(models[1], f"compiled train-mode cnn step {k} parameters", buffers=False)
        eager = dict(list(models[0].named_parameters()) + list(models[0].named_buffers()))
        for n, t in list(models[1].named_parameters()) + list(models[1].named_buffers()):
            np.testing.assert_allclose(t.numpy(), eager[n].numpy(), rtol=RTOL, atol=ATOL, err_msg=f"train-mode {n}")
    # each rank's statistics come from its own half batch, after starting from rank 0's
    differ_across_ranks(models[1][1], "running statistics after a step")
    nodes = steps[1].compiled_graph.graph.nodes
    kinds = [nd.op_type for nd in nodes]
    assert kinds.count("Broadcast") == 3 and max(k for k, t in enumerate(kinds) if t == "Broadcast") < kinds.index(
        "Conv"
    ), kinds[:12]
    report("compiled buffer broadcast")


def check_compiled_no_sync() -> None:
    """A compiled step accumulating two micro-batches, the first under no_sync(), == the eager step
    and one process on both whole micro-batches; a compiled step called under no_sync() gets a graph
    of its own without allreduces (the ranks then step on their own gradients)."""
    data = compiled_batches("mlp", 4)
    models, steps = [], []
    for compiled in (False, True):
        model = mlp(RANK)
        ddp = DDP(model, bucket_cap_mb=0.0005)
        opt = make_opt("sgd", ddp.parameters())

        def accumulate(x1, y1, x2, y2, ddp=ddp, opt=opt):
            opt.zero_grad()
            with ddp.no_sync():
                nn.functional.cross_entropy(ddp(x1), y1).backward()
            loss = nn.functional.cross_entropy(ddp(x2), y2)
            loss.backward()
            opt.step()
            return loss

        models.append(model)
        steps.append(opsnn.compile(accumulate) if compiled else accumulate)
    ref = mlp(0)
    ref_opt = make_opt("sgd", ref.parameters())
    for it in range(2):
        micro = data[2 * it : 2 * it + 2]
        args = [opsnn.tensor(a) for xy in micro for a in shard("cnn", *xy, RANK, WORLD)]
        for fn in steps:
            fn(*args)
        same_on_all_ranks(models[1], f"compiled no_sync accumulation step {it}")
        ref_opt.zero_grad()
        for x, y in micro:
            nn.functional.cross_entropy(ref(opsnn.tensor(x)), opsnn.tensor(y)).backward()
        ref_opt.step()
        eager, comp, alone = (dict(m.named_parameters()) for m in (models[0], models[1], ref))
        for n in comp:
            np.testing.assert_allclose(comp[n].numpy(), eager[n].numpy(), rtol=RTOL, atol=ATOL, err_msg=n)
            np.testing.assert_allclose(comp[n].numpy(), alone[n].numpy(), rtol=RTOL, atol=ATOL, err_msg=n)
    ops_of = [nd.op_type for nd in steps[1].graph().nodes]
    assert steps[1].num_compiles == 1 and ops_of.count("AllReduceStart") == ops_of.count("AllReduceWait") > 1

    model = mlp(RANK)
    ddp = DDP(model, bucket_cap_mb=0.0005)
    step = opsnn.compile(ddp_step(ddp, make_opt("sgd", ddp.parameters())))
    x, y = (opsnn.tensor(a) for a in shard("cnn", *data[0], RANK, WORLD))
    step(x, y)
    with ddp.no_sync():
        step(x, y)
        local = [nd.op_type for nd in step.graph().nodes]
        step(x, y)
    assert step.num_compiles == 2 and "AllReduceStart" not in local and "AllReduceWait" not in local, local
    differ_across_ranks(model, "parameters after compiled no_sync steps")
    step(x, y)  # synchronised again: the first graph, not a third
    assert step.num_compiles == 2 and "AllReduceStart" in [nd.op_type for nd in step.graph().nodes]
    report("compiled no_sync")


def main() -> None:
    global RANK, WORLD
    dist.init_process_group(backend="mpi")
    RANK, WORLD = dist.get_rank(), dist.get_world_size()
    {"train": scenario_train, "misc": scenario_misc, "compiled": scenario_compiled}[sys.argv[1]]()
    dist.barrier()


if __name__ == "__main__":
    main()
