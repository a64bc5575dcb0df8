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
from dataclasses import dataclass, field
from typing import Callable

from ..errors import ParamInvalidError
from .ir import Graph, GraphError, Node

log = logging.getLogger("opsnn.graph.rewrite")

#: short names accepted in chain patterns
ALIASES = {"LayerNorm": "LayerNormalization", "BatchNorm": "BatchNormalization", "GroupNorm": "GroupNormalization",
           "RMSNorm": "RMSNormalization", "InstanceNorm": "InstanceNormalization"}
COMMUTATIVE = {"Add", "Mul", "Max", "Min", "Sum", "And", "Or", "Xor", "Equal"}


class RewriteError(GraphError):
    """A rewrite rule produced an invalid graph (the graph was left unchanged)."""


class Matcher:
    """Matching state over one graph: producers, consumers, constants, bindings."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.producers = graph.producers()
        self.consumers = graph.consumers()
        self.constants = set(graph.initializers) | {n.outputs[0] for n in graph.nodes
                                                    if n.op_type == "Constant" and n.outputs}
        self.bindings: dict = {}
        self.nodes: list[Node] = []

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

    def __call__(self, *inputs: Pattern) -> "OpPattern":
        return OpPattern(self.op_types, list(inputs), self.attrs, self.check, self.name)

    def named(self, name: str) -> "OpPattern":
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
            raise ParamInvalidError(f"GraphPattern: cannot parse {chain!r}; expected e.g. 'MatMul -> LayerNorm -> Gelu'")
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
        node = Node(self.op_type, match.inputs, list(match.root.outputs), attrs, domain=self.domain,
                    name=match.graph.unique_name(f"{self.op_type}_{match.root.name}"))
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
    applied: list = field(default_factory=list)   # (rule, [node names])
    refused: list = field(default_factory=list)   # (rule, root node, reason)
    iterations: int = 0


def find_match(rule: RewriteRule, graph: Graph, root: Node, m: Matcher) -> Match | None | str:
    """A match rooted at ``root``, None, or a string saying why a match was refused."""
    if not root.outputs or not root.outputs[0]:
        return None
    m.bindings, m.nodes = {}, []
    if not rule.pattern.match(root.outputs[0], m):
        return None
    order = {id(n): i for i, n in enumerate(graph.nodes)}
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
    raises :class:`RewriteError` naming the rule, with ``graph`` restored."""
    report = RewriteReport()
    refused_seen = set()
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
                _splice(graph, res, list(new_nodes), rule.name)
                report.applied.append((rule.name, [n.name for n in res.nodes]))
                log.info("rewrite %s applied to %s", rule.name, [n.name for n in res.nodes])
                changed = True
                m = Matcher(graph)  # the graph changed: fresh producers/consumers, keep sweeping
                alive = set(map(id, graph.nodes))
        if not changed:
            break
    return report


def _splice(graph: Graph, match: Match, new_nodes: list[Node], rule_name: str) -> None:
    before = list(graph.nodes)
    removed = set(map(id, match.nodes))
    pos = next(i for i, n in enumerate(graph.nodes) if n is match.root)
    kept_before = [n for n in graph.nodes[:pos] if id(n) not in removed]
    kept_after = [n for n in graph.nodes[pos + 1:] if id(n) not in removed]
    graph.nodes = kept_before + new_nodes + kept_after
    try:
        graph.validate()
    except GraphError as exc:
        graph.nodes = before
        raise RewriteError(f"rewrite rule {rule_name!r} produced an invalid graph ({exc}); "
                           "the graph was left unchanged") from None
