"""Graph patterns and rewrite rules (rules as data, one fixed-point driver).

Two ways to say what to match: a chain string, ``GraphPattern("MatMul -> LayerNorm -> Gelu")``
(each op feeds the next; intermediate values must have no other users), or combinators for
multi-input patterns, ``is_op("Add")(is_op("MatMul")(wildcard("x"), is_const("w")), wildcard("b"))``.
A rule pairs a pattern with a replacement: a :class:`GraphTemplate` (one fused node) or a
function ``fn(match) -> [Node] | None`` (None: does not apply). :func:`rewrite` applies
rules until nothing changes, with a loop guard; a rule whose result is not a valid graph is
rejected with its name and the graph is left as it was::

    >>> from opsnn.graph import Graph, Node, Value
    >>> g = Graph("g", inputs=[Value("x")], outputs=["z"],
    ...           nodes=[Node("Relu", ["x"], ["y"]), Node("Neg", ["y"], ["z"])])
    >>> rule = RewriteRule(GraphPattern("Relu -> Neg"), GraphTemplate("NegRelu"), name="negrelu")
    >>> rewrite(g, [rule]).applied
    [('negrelu', ['Relu_0', 'Neg_1'])]
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from ..errors import ParamInvalidError
from .ir import Graph, GraphError, Node, free_names

log = logging.getLogger("opsnn.graph.rewrite")

#: short names accepted in chain patterns
ALIASES = {
    "LayerNorm": "LayerNormalization",
    "BatchNorm": "BatchNormalization",
    "GroupNorm": "GroupNormalization",
    "RMSNorm": "RMSNormalization",
    "InstanceNorm": "InstanceNormalization",
}
COMMUTATIVE = {"Add", "Mul", "Max", "Min", "Sum", "And", "Or", "Xor", "Equal"}


class RewriteError(GraphError):
    """A rewrite rule produced an invalid graph (the graph was left unchanged)."""


class _Constants:
    """Value names known to be constant: the graph's initializers (read live, so initializers a
    replacement adds count) and the outputs of Constant nodes."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.nodes = {n.outputs[0] for n in graph.nodes if n.op_type == "Constant" and n.outputs}

    def __contains__(self, name) -> bool:
        return name in self.graph.initializers or name in self.nodes


class Matcher:
    """Matching state over one graph: producers, consumers, constants, bindings; kept up to date
    through :meth:`replaced` as the driver splices (no rebuild per rewrite)."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.producers = graph.producers()
        self.consumers = graph.consumers()
        self.constants = _Constants(graph)
        # a sort key per node in graph order; a node spliced in at a root's place gets the root's key
        # extended by its index, so keys stay in graph order without renumbering (see _splice)
        self.order = {id(n): (i,) for i, n in enumerate(graph.nodes)}
        self.bindings: dict = {}
        self.nodes: list[Node] = []

    def replaced(self, removed: list[Node], added: list[Node], root_key: tuple) -> None:
        """Forget ``removed`` and learn ``added`` (spliced in where the root of ``removed`` was)."""
        for n in removed:
            for o in n.outputs:
                if o and self.producers.get(o) is n:
                    del self.producers[o]
            for name in set(n.present_inputs()) | free_names(n):
                users = self.consumers.get(name)
                if users is not None:
                    users[:] = [u for u in users if u is not n]
            self.order.pop(id(n), None)
            self.constants.nodes.difference_update(n.outputs[:1] if n.op_type == "Constant" else ())
        for k, n in enumerate(added):
            for o in n.outputs:
                if o:
                    self.producers[o] = n
            for name in set(n.present_inputs()) | free_names(n):
                self.consumers.setdefault(name, []).append(n)
            self.order[id(n)] = root_key + (k,)
            if n.op_type == "Constant" and n.outputs:
                self.constants.nodes.add(n.outputs[0])

    def snapshot(self):
        return dict(self.bindings), list(self.nodes)

    def restore(self, snap) -> None:
        self.bindings, self.nodes = dict(snap[0]), list(snap[1])


class Pattern:
    """Base class: ``match(value_name, matcher) -> bool`` (binding as it goes)."""

    name: str | None = None

    def match(self, value: str, m: Matcher) -> bool:  # pragma: no cover - abstract
        raise NotImplementedError

    def _bind(self, value: str, m: Matcher) -> bool:
        if self.name is None:
            return True
        prev = m.bindings.get(self.name)
        if prev is not None and prev != value:
            return False
        m.bindings[self.name] = value
        return True


class Wildcard(Pattern):
    def __init__(self, name: str | None = None):
        self.name = name

    def match(self, value: str, m: Matcher) -> bool:
        return bool(value) and self._bind(value, m)

    def __repr__(self):
        return f"wildcard({self.name or ''})"


class ConstPattern(Pattern):
    def __init__(self, name: str | None = None):
        self.name = name

    def match(self, value: str, m: Matcher) -> bool:
        return value in m.constants and self._bind(value, m)


class OpPattern(Pattern):
    """Matches a value produced by a node of one of ``op_types`` whose inputs match ``inputs``
    (None: any inputs), whose attributes equal ``attrs``, and for which ``check(node)`` holds."""

    def __init__(self, op_types, inputs=None, attrs=None, check: Callable | None = None, name: str | None = None):
        op_types = (op_types,) if isinstance(op_types, str) else tuple(op_types)
        self.op_types = frozenset(ALIASES.get(o, o) for o in op_types)
        self.inputs = inputs
        self.attrs = attrs or {}
        self.check = check
        self.name = name

    def __call__(self, *inputs: Pattern) -> OpPattern:
        return OpPattern(self.op_types, list(inputs), self.attrs, self.check, self.name)

    def named(self, name: str) -> OpPattern:
        return OpPattern(self.op_types, self.inputs, self.attrs, self.check, name)

    def match(self, value: str, m: Matcher) -> bool:
        node = m.producers.get(value)
        if node is None or node.op_type not in self.op_types:
            return False
        if any(node.attrs.get(k) != v for k, v in self.attrs.items()):
            return False
        if self.check is not None and not self.check(node):
            return False
        if node in m.nodes:
            return self._bind(value, m)
        snap = m.snapshot()
        m.nodes.append(node)
        if self.inputs is not None:
            ins = list(node.inputs)
            orders = [ins]
            if node.op_type in COMMUTATIVE and len(ins) == 2 and len(self.inputs) == 2:
                orders.append(ins[::-1])  # x + y also matches a pattern written y + x
            for order in orders:
                m.restore((snap[0], snap[1] + [node]))
                if self._match_inputs(order, m):
                    break
            else:
                m.restore(snap)
                return False
        if not self._bind(value, m):
            m.restore(snap)
            return False
        return True

    def _match_inputs(self, ins: list, m: Matcher) -> bool:
        if len(ins) < len(self.inputs):
            return False
        return all(p.match(v, m) for p, v in zip(self.inputs, ins))

    def __repr__(self):
        ops = "|".join(sorted(self.op_types))
        return f"is_op({ops})" + (f"({', '.join(map(repr, self.inputs))})" if self.inputs is not None else "")


def is_op(*op_types: str, check: Callable | None = None, **attrs) -> OpPattern:
    """``is_op("Add")(x, y)``: a node of that type whose inputs match ``x``, ``y``."""
    return OpPattern(op_types, None, attrs, check)


def wildcard(name: str | None = None) -> Wildcard:
    return Wildcard(name)


def is_const(name: str | None = None) -> ConstPattern:
    return ConstPattern(name)


class GraphPattern(OpPattern):
    """A chain ``"A -> B -> C"``: A's output feeds some input of B, B's feeds C (the root).
    ``A|B`` alternatives are allowed at each step."""

    def __init__(self, chain: str):
        steps = [s.strip() for s in chain.split("->")]
        if not steps or any(not s for s in steps):
            raise ParamInvalidError(
                f"GraphPattern: cannot parse {chain!r}; expected e.g. 'MatMul -> LayerNorm -> Gelu'"
            )
        self.chain = chain
        self.steps = [tuple(ALIASES.get(o.strip(), o.strip()) for o in s.split("|")) for s in steps]
        super().__init__(self.steps[-1])

    def match(self, value: str, m: Matcher) -> bool:
        return self._match_step(len(self.steps) - 1, value, m)

    def _match_step(self, i: int, value: str, m: Matcher) -> bool:
        node = m.producers.get(value)
        if node is None or node.op_type not in self.steps[i]:
            return False
        m.nodes.append(node)
        if i == 0:
            return True
        for inp in node.inputs:  # the previous step may feed any input
            snap = m.snapshot()
            if inp and self._match_step(i - 1, inp, m):
                return True
            m.restore(snap)
        m.nodes.pop()
        return False

    def __repr__(self):
        return f"GraphPattern({self.chain!r})"


@dataclass
class Match:
    graph: Graph
    root: Node
    nodes: list  # in graph order
    bindings: dict

    @property
    def inputs(self) -> list[str]:
        """Values read by the matched nodes but produced outside the match, in first-use order."""
        inside = {o for n in self.nodes for o in n.outputs if o}
        seen, out = set(), []
        for n in self.nodes:
            for v in n.inputs:
                if v and v not in inside and v not in seen:
                    seen.add(v)
                    out.append(v)
        return out

    def node(self, op_type: str) -> Node | None:
        op_type = ALIASES.get(op_type, op_type)
        return next((n for n in self.nodes if n.op_type == op_type), None)


class GraphTemplate:
    """Replacement by one fused node: ``GraphTemplate("FusedMLP")`` takes the match's external
    inputs and the root's outputs; ``attrs(match) -> dict`` (or a dict) gives its attributes.
    By default the node carries the fused nodes' attributes as ``"<OpType>.<attr>"``."""

    def __init__(self, op_type: str, domain: str = "opsnn", attrs=None):
        self.op_type = op_type
        self.domain = domain
        self.attrs = attrs

    def __call__(self, match: Match) -> list[Node]:
        if callable(self.attrs):
            attrs = self.attrs(match)
        elif self.attrs is not None:
            attrs = dict(self.attrs)
        else:
            attrs = {f"{n.op_type}.{k}": v for n in match.nodes for k, v in n.attrs.items()}
        node = Node(
            self.op_type,
            match.inputs,
            list(match.root.outputs),
            attrs,
            domain=self.domain,
            name=match.graph.unique_name(f"{self.op_type}_{match.root.name}"),
        )
        node.attrs_origin = [n.name for n in match.nodes]  # for plots/explain: what was fused
        return [node]


@dataclass
class RewriteRule:
    pattern: Pattern
    replacement: Callable  # GraphTemplate or fn(match) -> list[Node] | None
    name: str = ""
    check: Callable | None = None  # check(match) -> True | False | "reason refused"

    def __post_init__(self):
        if not self.name:
            self.name = getattr(self.pattern, "chain", None) or repr(self.pattern)


@dataclass
class RewriteReport:
    applied: list = field(default_factory=list)  # (rule, [node names])
    refused: list = field(default_factory=list)  # (rule, root node, reason)
    iterations: int = 0


def find_match(rule: RewriteRule, graph: Graph, root: Node, m: Matcher) -> Match | None | str:
    """A match rooted at ``root``, None, or a string saying why a match was refused."""
    if not root.outputs or not root.outputs[0]:
        return None
    m.bindings, m.nodes = {}, []
    if not rule.pattern.match(root.outputs[0], m):
        return None
    order = m.order
    if any(id(n) not in order for n in m.nodes):  # the graph changed behind the matcher's back
        order = m.order = {id(n): (i,) for i, n in enumerate(graph.nodes)}
    nodes = sorted(set(m.nodes), key=lambda n: order[id(n)])
    match = Match(graph, root, nodes, dict(m.bindings))
    outputs = set(graph.output_names)
    inside = set(map(id, nodes))
    for n in nodes:
        if n is root:
            continue
        for o in n.outputs:
            if not o:
                continue
            if o in outputs:
                return f"intermediate {o!r} of node {n.name} is a graph output"
            users = [u for u in m.consumers.get(o, []) if id(u) not in inside]
            if users:
                return f"intermediate {o!r} of node {n.name} has other consumers ({users[0].name})"
    if rule.check is not None:
        ok = rule.check(match)
        if ok is not True and ok is not None:
            return ok if isinstance(ok, str) else "check callback rejected the match"
    return match


def rewrite(graph: Graph, rules: list[RewriteRule], max_iterations: int = 1000) -> RewriteReport:
    """Apply ``rules`` to a fixed point. Each applied rule is validated; an invalid result
    raises :class:`RewriteError` naming the rule, with ``graph`` restored.

    A rewrite costs about the size of its match, not of the graph: the matcher's maps are
    updated in place and a splice is checked where it happened (the whole graph is validated
    once at the end), so K rewrites of an N-node graph cost O(N + K) rather than O(N * K).
    A replacement returns new nodes and leaves the rest of the graph alone: an edit elsewhere is
    invisible to the matcher until the next sweep (the final validation still checks it)."""
    report = RewriteReport()
    refused_seen = set()
    original = list(graph.nodes)
    with graph.reserving_names():
        while True:
            report.iterations += 1
            if report.iterations > max_iterations:
                log.warning("rewrite: stopped after %d iterations (loop guard); rules keep matching", max_iterations)
                break
            changed = False
            for rule in rules:
                m = Matcher(graph)
                alive = set(map(id, graph.nodes))
                for root in list(graph.nodes):
                    if id(root) not in alive:  # removed by an earlier rewrite in this sweep
                        continue
                    res = find_match(rule, graph, root, m)
                    if res is None:
                        continue
                    if isinstance(res, str):
                        key = (rule.name, root.name, res)
                        if key not in refused_seen:
                            refused_seen.add(key)
                            report.refused.append((rule.name, root.name, res))
                            log.info("rewrite %s refused at %s: %s", rule.name, root.name, res)
                        continue
                    new_nodes = rule.replacement(res)
                    if new_nodes is None:
                        continue
                    new_nodes = list(new_nodes)
                    _splice(graph, res, new_nodes, rule.name, m)
                    report.applied.append((rule.name, [n.name for n in res.nodes]))
                    log.info("rewrite %s applied to %s", rule.name, [n.name for n in res.nodes])
                    changed = True
                    alive.difference_update(map(id, res.nodes))
                    alive.update(map(id, new_nodes))
            if not changed:
                break
    if report.applied:
        try:
            graph.validate()
        except GraphError as exc:  # a splice check missed it: still say which rules ran
            graph.nodes = original
            rules_run = sorted({r for r, _ in report.applied})
            raise RewriteError(
                f"rewrite rules {rules_run} produced an invalid graph ({exc}); the graph was left unchanged"
            ) from None
    return report


def _splice(graph: Graph, match: Match, new_nodes: list[Node], rule_name: str, m: Matcher | None = None) -> None:
    """Put ``new_nodes`` where ``match.root`` was and drop the matched nodes, checking locally
    that the result is a valid graph (every value read is defined earlier, none is defined twice,
    nothing still read is lost); on failure the graph is restored and :class:`RewriteError` raised."""
    if m is None:
        m = Matcher(graph)
    before = list(graph.nodes)
    nodes = graph.nodes
    removed = {id(n): n for n in match.nodes}
    removed[id(match.root)] = match.root
    idx = sorted(nodes.index(n) for n in removed.values())  # list.index: a C loop, not a Python one
    pos = nodes.index(match.root)
    for i in reversed(idx):
        del nodes[i]
    at = pos - sum(1 for i in idx if i < pos)
    nodes[at:at] = new_nodes
    why = _splice_problem(graph, m, removed, new_nodes, at)
    if why is not None:
        graph.nodes = before
        raise RewriteError(
            f"rewrite rule {rule_name!r} produced an invalid graph (graph {graph.name!r}: {why}); "
            "the graph was left unchanged"
        )
    m.replaced(list(removed.values()), new_nodes, m.order.get(id(match.root), (len(before),)))
    graph.reserve_names(new_nodes)


def _splice_problem(graph: Graph, m: Matcher, removed: dict, new_nodes: list[Node], at: int) -> str | None:
    """Why the splice of ``new_nodes`` at position ``at`` (``removed`` gone) is not a valid graph, or None."""
    inputs = set(graph.input_names)
    defined_here: dict = {}
    for k, n in enumerate(new_nodes):
        for name in sorted(set(n.present_inputs()) | free_names(n)):
            if name in defined_here or name in graph.initializers or name in inputs:
                continue
            p = m.producers.get(name)
            if p is None or id(p) in removed:
                later = [x for x in new_nodes[k:] if name in x.outputs]
                if later:
                    return f"node {n.name!r} ({n.op_type}) reads {name!r} before node {later[0].name!r} writes it"
                return f"node {n.name!r} ({n.op_type}) reads {name!r}, which nothing defines"
            if graph.nodes.index(p) >= at:
                return f"node {n.name!r} ({n.op_type}) reads {name!r} before node {p.name!r} writes it"
        for o in n.outputs:
            if not o:
                continue
            p = m.producers.get(o)
            if o in defined_here or (p is not None and id(p) not in removed) or o in graph.initializers or o in inputs:
                return f"node {n.name!r} ({n.op_type}) writes {o!r}, which is already defined"
            defined_here[o] = n
    end = at + len(new_nodes)
    outputs = set(graph.output_names)
    for n in removed.values():
        for o in n.outputs:
            if not o or o in defined_here:
                continue
            users = [u for u in m.consumers.get(o, []) if id(u) not in removed]
            if users or o in outputs:
                who = f"node {users[0].name!r} ({users[0].op_type})" if users else "the graph's outputs"
                return f"{who} reads {o!r}, which the replacement no longer writes"
    for o in defined_here:
        for u in m.consumers.get(o, []):
            if id(u) not in removed and graph.nodes.index(u) < end:
                return f"node {u.name!r} ({u.op_type}) reads {o!r} before the replacement writes it"
    return None
