"""Rewrite rules: the library's own (pattern recognition, fusions) and the user's.

>>> import opsnn
>>> rule = opsnn.optimize.register_rewrite_rule(opsnn.GraphPattern("MatMul -> Relu"),
...                                             opsnn.GraphTemplate("MatMulRelu"), name="matmul_relu")
>>> opsnn.optimize.unregister_rewrite_rule("matmul_relu")
"""

from __future__ import annotations

from ..errors import ParamInvalidError
from .pattern import GraphTemplate, Pattern, RewriteRule

#: user rules, applied by the ``user_rewrites`` pass in registration order
USER_RULES: list[RewriteRule] = []
#: the library's rule groups by pass name, each run to a fixed point by its pass
BUILTIN_GROUPS: dict[str, list[RewriteRule]] = {}


def register_rewrite_rule(pattern: Pattern, replacement, *, name: str | None = None, check=None) -> RewriteRule:
    """Add a rule: ``replacement`` is a :class:`GraphTemplate` or ``fn(match) -> [Node] | None``;
    ``check(match)`` may refuse a match (return False or a reason string)."""
    if not isinstance(pattern, Pattern):
        raise ParamInvalidError(
            f"register_rewrite_rule: pattern must be a GraphPattern or is_op(...) pattern, got {type(pattern).__name__}"
        )
    if not callable(replacement):
        raise ParamInvalidError("register_rewrite_rule: replacement must be a GraphTemplate or a function")
    rule = RewriteRule(pattern, replacement, name or "", check)
    if any(r.name == rule.name for r in USER_RULES):
        raise ParamInvalidError(f"register_rewrite_rule: a rule named {rule.name!r} already exists")
    USER_RULES.append(rule)
    return rule


def unregister_rewrite_rule(name: str) -> None:
    for i, r in enumerate(USER_RULES):
        if r.name == name:
            del USER_RULES[i]
            return
    raise ParamInvalidError(f"unregister_rewrite_rule: no rule named {name!r}; rules: {[r.name for r in USER_RULES]}")


__all__ = ["BUILTIN_GROUPS", "GraphTemplate", "USER_RULES", "register_rewrite_rule", "unregister_rewrite_rule"]
