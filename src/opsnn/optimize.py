"""Graph optimization API: passes, rewrite rules, patterns.

>>> import opsnn
>>> opsnn.optimize.pass_names()[:2]
['variadic_to_binary', 'eliminate_noops']
"""

from .graph.passes import PASSES, OptimizeReport, disable_passes, optimize, pass_names
from .graph.pattern import GraphPattern, GraphTemplate, RewriteRule, is_const, is_op, rewrite, wildcard
from .graph.rules import register_rewrite_rule, unregister_rewrite_rule

__all__ = [
    "PASSES",
    "GraphPattern",
    "GraphTemplate",
    "OptimizeReport",
    "RewriteRule",
    "disable_passes",
    "is_const",
    "is_op",
    "optimize",
    "pass_names",
    "register_rewrite_rule",
    "rewrite",
    "unregister_rewrite_rule",
    "wildcard",
]
