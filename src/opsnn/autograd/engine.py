"""The backward pass: walk the recorded nodes in reverse topological order, run each node's
gradient rule (through the same ops and executor as the forward), accumulate into leaves.

>>> import opsnn, numpy as np
>>> x = opsnn.tensor(np.array([1.0, 2.0], np.float32)).requires_grad_()
>>> opsnn.ops.sum(x * x).backward()
>>> x.grad.numpy()
array([2., 4.], dtype=float32)
"""

from __future__ import annotations

import contextlib
import threading

from .. import dtypes as _dt
from ..errors import InnerError, ParamInvalidError
from ..ops import executor as _executor
from ..ops.gradients import take_sole
from ..tensor import Tensor, as_tensor, ones, storage_mark, whole_storage
from .errors import (
    GradientShapeError,
    GraphFreedError,
    NoGradFnError,
    NoGradientError,
    NonScalarBackwardError,
)
from .graph import LEAF, get_meta
from .mode import no_grad


def _check_grad(t: Tensor, g, what: str) -> Tensor:
    g = as_tensor(g)
    if tuple(g.shape) != tuple(t.shape):
        raise GradientShapeError(
            f"{what}: gradient has shape {tuple(g.shape)}, the tensor it belongs to has shape {tuple(t.shape)}"
        )
    if g.dtype != t.dtype:
        raise GradientShapeError(f"{what}: gradient has dtype {_dt.name(g.dtype)}, the tensor has {_dt.name(t.dtype)}")
    return g


def _roots(tensors, grads, what: str) -> list:
    tensors = [tensors] if isinstance(tensors, Tensor) else list(tensors)
    if grads is None:
        grads = [None] * len(tensors)
    else:
        grads = [grads] if isinstance(grads, Tensor) else list(grads)
    if len(grads) != len(tensors):
        raise ParamInvalidError(f"{what}: {len(tensors)} outputs but {len(grads)} gradients")
    roots = []
    for i, (t, g) in enumerate(zip(tensors, grads)):
        m = get_meta(t)
        if m is None or not m.requires_grad:
            raise NoGradFnError(
                f"{what}: output {i} (shape {tuple(t.shape)}) does not require grad and has no "
                "grad_fn (was it computed under no_grad, or from tensors that do not require grad?)"
            )
        if g is None:
            if t.numel != 1:
                raise NonScalarBackwardError(
                    f"{what}: output {i} has shape {tuple(t.shape)}; a gradient can be "
                    "implied only for a one-element output: pass grad_outputs / gradient "
                    "of that shape"
                )
            g = ones(t.shape, t.dtype)
        else:
            g = _check_grad(t, g, f"{what}: gradient {i}")
        roots.append((m, g))
    return roots


def _add(a: Tensor | None, b: Tensor) -> Tensor:
    from .. import ops

    return b if a is None else ops.add(a, b)


def _run(roots: list, retain_graph: bool, targets: dict | None) -> dict:
    """Run the backward pass from ``roots`` [(meta, grad)]. ``targets`` (autograd.grad): maps
    (node, output_nr) or (LEAF, meta) keys to a slot; their gradients are returned by slot and no
    leaf's .grad is touched. Without targets every reached leaf accumulates into .grad."""
    tracer = _executor._tracer
    traced = tracer is not None and getattr(tracer, "records_tape", False)
    if traced:
        tracer.events.add("backward")  # a traced training step: its graph has gradients
    # storages made from here on are this pass's own; ``given`` counts where each one is handed
    # (buffers and leaves), so that a leaf keeps without a copy only a gradient nothing else holds
    mark = None if traced or targets is not None else storage_mark()
    given: dict = {}
    root_nodes = []
    for m, _ in roots:
        if m.grad_fn is not None and m.grad_fn not in root_nodes:
            root_nodes.append(m.grad_fn)
    # discover the graph (iteratively: graphs can be thousands of nodes deep)
    children: dict = {}
    order = []
    stack = list(root_nodes)
    seen = {id(n) for n in root_nodes}
    while stack:
        n = stack.pop()
        if n.freed:
            raise GraphFreedError(
                f"backward through {n.name} a second time: its saved tensors were freed by the "
                "first backward; pass retain_graph=True to the first one"
            )
        if traced and (n.hooks and any(n.hooks.values()) or n.retained):
            _refuse_traced(n.name)
        order.append(n)
        kids = []
        for e in n.edges:
            if e is not None and e[0] is not LEAF:
                kids.append(e[0])
                if id(e[0]) not in seen:
                    seen.add(id(e[0]))
                    stack.append(e[0])
        children[id(n)] = kids
    needed = None
    if targets is not None:
        needed = _needed(order, children, targets)
    pending = _leaf_contributions(roots, order)
    if traced and any(
        m.hooks
        for m in [m for m, _ in roots] + [e[1] for n in order for e in n.edges if e is not None and e[0] is LEAF]
    ):
        _refuse_traced("a leaf")
    held: dict = {}  # id(leaf meta) -> its gradient so far in this pass, while hooks wait for the sum
    deps: dict = {}
    for n in order:
        if needed is not None and id(n) not in needed:
            continue
        for c in children[id(n)]:
            if needed is None or id(c) in needed:
                deps[id(c)] = deps.get(id(c), 0) + 1
    found: dict = {}
    buffers: dict = {}
    for m, g in roots:
        if m.grad_fn is None:
            _to_leaf(m, g, targets, found, pending, held=held)
        else:
            buf = buffers.setdefault(id(m.grad_fn), [None] * len(m.grad_fn.out_shapes))
            buf[m.output_nr] = _add(buf[m.output_nr], g)
    ready = [n for n in root_nodes if deps.get(id(n), 0) == 0 and (needed is None or id(n) in needed)]
    from ..amp.autocast import suspended

    with no_grad(), suspended():
        while ready:
            n = ready.pop()
            grads = buffers.pop(id(n))
            if n.hooks or n.retained:
                _output_hooks(n, grads)
            if targets is not None:
                for k, g in enumerate(grads):
                    slot = targets.get((id(n), k))
                    if slot is not None and g is not None:
                        found[slot] = g
            if grads[0] is None:
                grads[0] = _zeros(n.out_shapes[0], n.out_dtypes[0])
            if n.fn is None:
                raise GraphFreedError(
                    f"backward through {n.name} a second time: its saved tensors were freed; pass "
                    "retain_graph=True to the first backward"
                )
            in_grads = n.fn(grads)
            if mark is not None:
                in_grads = _count_given(n, in_grads, given)
            for i, e in enumerate(n.edges):
                if e is None:
                    continue
                child = e[0]
                if needed is not None and (
                    child is LEAF and (LEAF, id(e[1])) not in targets or child is not LEAF and id(child) not in needed
                ):
                    continue
                gi = in_grads[i] if i < len(in_grads) else None
                if gi is None:
                    raise NoGradientError(
                        f"{n.name}: its gradient rule gives no gradient for input {i}, which requires grad", op=n.name
                    )
                if tuple(gi.shape) != n.in_shapes[i]:
                    raise InnerError(
                        f"{n.name}: gradient rule made shape {tuple(gi.shape)} for input {i} of shape {n.in_shapes[i]}",
                        op=n.name,
                    )
                if gi.dtype != n.in_dtypes[i]:
                    from .. import ops

                    gi = ops.cast(gi, n.in_dtypes[i])
                if child is LEAF:
                    _to_leaf(e[1], gi, targets, found, pending, _owned(gi, mark, given), held)
                    continue
                buf = buffers.setdefault(id(child), [None] * len(child.out_shapes))
                buf[e[1]] = _add(buf[e[1]], gi)
                deps[id(child)] -= 1
                if deps[id(child)] == 0:
                    ready.append(child)
            if not retain_graph:
                n.release()
    return found


def _count_given(n, in_grads, given: dict) -> list:
    """``in_grads`` cast to the inputs' dtypes, each storage counted once per edge it goes to."""
    res = list(in_grads)
    for i, e in enumerate(n.edges):
        gi = res[i] if e is not None and i < len(res) else None
        if gi is None:
            continue
        if gi.dtype != n.in_dtypes[i]:
            from .. import ops

            gi = res[i] = ops.cast(gi, n.in_dtypes[i])
        st = whole_storage(gi._array)
        if st is not None:
            given[st.serial] = given.get(st.serial, 0) + 1
    return res


def _owned(g: Tensor, mark, given: dict) -> bool:
    """Whether ``g`` may become a leaf's ``.grad`` as it is: eager, a whole pool storage made in this
    pass (no user tensor, saved activation or cached constant) and handed to this leaf only (not to
    another leaf, not also to a node that may pass it on, not a rule's shared result)."""
    if mark is None:
        return False
    st = whole_storage(g._array)
    return st is not None and st.serial > mark and given.get(st.serial, 0) == 1


def _zeros(shape, dtype) -> Tensor:
    from ..tensor import zeros

    return zeros(shape, dtype)


def _needed(order: list, children: dict, targets: dict) -> set:
    """Ids of the nodes from which some target is reachable (others need not run)."""
    needed: set = set()
    # ``order`` is a DFS pre-order from the roots: visiting it backwards sees children first
    # only for trees; iterate to a fixed point for shared subgraphs
    changed = True
    while changed:
        changed = False
        for n in reversed(order):
            if id(n) in needed:
                continue
            hit = any((id(n), k) in targets for k in range(len(n.out_shapes)))
            if not hit:
                for e in n.edges:
                    if e is None:
                        continue
                    if (e[0] is LEAF and (LEAF, id(e[1])) in targets) or (e[0] is not LEAF and id(e[0]) in needed):
                        hit = True
                        break
            if hit:
                needed.add(id(n))
                changed = True
    return needed


def _leaf_contributions(roots: list, order: list) -> dict:
    """How many gradients each hooked leaf will receive in this pass (its tensor hooks see their sum,
    its post-accumulate hooks fire after the last)."""
    pending: dict = {}

    def count(m):
        if m.post_hooks or m.hooks:
            pending[id(m)] = pending.get(id(m), 0) + 1

    for m, _ in roots:
        if m.grad_fn is None:
            count(m)
    for n in order:
        for e in n.edges:
            if e is not None and e[0] is LEAF:
                count(e[1])
    return pending


def _call_hooks(hooks: dict, g: Tensor, what: str) -> Tensor:
    """``g`` through each tensor hook in registration order (a hook's tensor result replaces it)."""
    for fn in list(hooks.values()):
        r = fn(g)
        if r is None:
            continue
        if not isinstance(r, Tensor):
            raise GradientShapeError(
                f"register_hook: a hook on {what} returned a {type(r).__name__}; return an opsnn Tensor or None"
            )
        g = _check_grad(g, r, f"register_hook: a hook on {what}")
    return g


def _output_hooks(n, grads: list) -> None:
    """Run the tensor hooks of ``n``'s outputs on their gradients (in place in ``grads``), then keep the
    gradients of retained outputs in their ``.grad`` (torch runs retain_grad's hook last)."""
    for k, g in enumerate(grads):
        if g is None:
            continue
        hooks = n.hooks.get(k) if n.hooks else None
        if hooks:
            g = grads[k] = _call_hooks(hooks, g, f"an output of {n.name}")
        m = n.retained.get(k) if n.retained else None
        if m is not None:
            m.grad = g.clone() if m.grad is None else _add(m.grad, g)


def _refuse_traced(where: str) -> None:
    from ..graph.tracing import TraceError

    raise TraceError(
        f"trace: a tensor hook or retain_grad() on {where} would run only while the step is traced, never at a "
        "compiled call; change the gradient in the loss or after backward (p.grad.mul_(...) before "
        "optimizer.step()), read gradients the step returns, or run the step eagerly"
    )


def _to_leaf(m, g: Tensor, targets, found, pending=None, owned: bool = False, held=None) -> None:
    left = 0
    if pending is not None and id(m) in pending:
        left = pending[id(m)] = pending[id(m)] - 1
    if m.hooks:
        # the hooks see the leaf's whole gradient of this pass, once (as torch's AccumulateGrad node)
        total = _add(held.pop(id(m), None), g)
        if left > 0:
            held[id(m)] = total
            return
        g, owned = _call_hooks(m.hooks, total, "a leaf"), False
    if targets is not None:
        slot = targets.get((LEAF, id(m)))
        if slot is not None:
            found[slot] = _add(found.get(slot), g)
        return
    tracer = _executor._tracer
    if tracer is not None and getattr(tracer, "records_tape", False):
        if m.grad is not None and not tracer.is_traced(m.grad):
            from ..graph.tracing import TraceError

            raise TraceError(
                f"trace: a gradient of shape {tuple(m.grad.shape)} from before the step would be accumulated "
                "into as a constant; call optimizer.zero_grad() inside the compiled step (gradients do not "
                "accumulate across compiled calls)"
            )
    if m.grad is None:
        sole = take_sole(g) and tracer is None  # a rule marked it as made for this input alone
        if m.grad_sink is not None and pending is not None and pending.get(id(m)) == 0 and not m.hooks:
            m.grad = m.grad_sink(g)  # the only gradient this pass brings: placed where its user wants it
        else:
            # a contiguous tensor of its own: rules may hand one gradient to several inputs
            m.grad = g if (owned or sole) else g.clone()
    else:
        m.grad = _add(m.grad, g)
    if m.post_hooks and left <= 0:
        _fire_post_hooks(m)


def _fire_post_hooks(m) -> None:
    t = m.ref() if m.ref is not None else None
    if t is not None:
        for fn in list(m.post_hooks.values()):
            fn(t)


# -- callbacks run once the current backward pass has finished (torch: the engine's queue_callback) ---------
_tls = threading.local()


@contextlib.contextmanager
def _pass():
    frames = _tls.__dict__.setdefault("frames", [])
    frames.append([])
    try:
        yield
        queue = frames[-1]
        while queue:  # a callback may queue more
            queue.pop(0)()
    finally:
        frames.pop()


def queue_callback(fn) -> None:
    """Run ``fn()`` once the backward pass now running has finished (after every leaf's gradient
    and hooks), on the thread that called ``backward``; only valid while a pass runs (from a
    gradient hook). DDP waits for its last gradient buckets here, as torch's final callback does.

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.array([3.0], np.float32)).requires_grad_()
    >>> h = x.register_post_accumulate_grad_hook(lambda t: opsnn.autograd.queue_callback(lambda: print("done")))
    >>> opsnn.ops.sum(x * x).backward()
    done
    """
    frames = getattr(_tls, "frames", None)
    if not frames:
        raise ParamInvalidError(
            "queue_callback: no backward pass is running; call it from a gradient hook during backward()"
        )
    if not callable(fn):
        raise ParamInvalidError(f"queue_callback: expected a callable, got {type(fn).__name__}")
    frames[-1].append(fn)


def backward(
    tensors, grad_tensors=None, retain_graph: bool | None = None, create_graph: bool = False, inputs=None
) -> None:
    """Accumulate d(tensors)/d(leaf) into every reached leaf's ``.grad`` (``inputs``: only those)."""
    if create_graph:
        raise ParamInvalidError("backward: create_graph=True (higher-order gradients) is not supported yet")
    roots = _roots(tensors, grad_tensors, "backward")
    with _pass():
        if inputs is None:
            _run(roots, bool(retain_graph), None)
            return
        inputs = [inputs] if isinstance(inputs, Tensor) else list(inputs)
        res = grad(tensors, inputs, grad_tensors, retain_graph=retain_graph, allow_unused=True)
        for t, g in zip(inputs, res):
            if g is not None:
                m = get_meta(t)
                m.grad = g.clone() if m.grad is None else _add(m.grad, g)
                if m.grad_fn is None and m.post_hooks:
                    _fire_post_hooks(m)


def grad(
    outputs,
    inputs,
    grad_outputs=None,
    retain_graph: bool | None = None,
    create_graph: bool = False,
    allow_unused: bool = False,
) -> tuple:
    """The gradients of ``outputs`` with respect to ``inputs`` (a tuple, one per input), like
    ``torch.autograd.grad``; no ``.grad`` is modified.

    >>> import opsnn, numpy as np
    >>> x = opsnn.tensor(np.array([3.0], np.float32)).requires_grad_()
    >>> opsnn.autograd.grad(opsnn.ops.sum(x * x), [x])[0].numpy()
    array([6.], dtype=float32)
    """
    if create_graph:
        raise ParamInvalidError("grad: create_graph=True (higher-order gradients) is not supported yet")
    roots = _roots(outputs, grad_outputs, "grad")
    single = isinstance(inputs, Tensor)
    inputs = [inputs] if single else list(inputs)
    targets = {}
    for i, t in enumerate(inputs):
        m = get_meta(t)
        if m is None or not m.requires_grad:
            raise NoGradFnError(f"grad: input {i} (shape {tuple(t.shape)}) does not require grad")
        key = (LEAF, id(m)) if m.grad_fn is None else (id(m.grad_fn), m.output_nr)
        targets[key] = i
    # a root that is itself an input
    found_roots = {}
    for m, g in roots:
        key = (LEAF, id(m)) if m.grad_fn is None else (id(m.grad_fn), m.output_nr)
        if key in targets and m.grad_fn is None:
            found_roots[targets[key]] = g
    with _pass():
        found = _run(roots, bool(retain_graph), targets)
    for k, g in found_roots.items():
        found[k] = _add(found.get(k), g)
    out = []
    for i, t in enumerate(inputs):
        g = found.get(i)
        if g is None and not allow_unused:
            raise NoGradFnError(
                f"grad: input {i} (shape {tuple(t.shape)}) was not used to compute the outputs; "
                "pass allow_unused=True to get None for it"
            )
        out.append(g)
    return tuple(out)


__all__ = ["backward", "grad", "queue_callback"]
