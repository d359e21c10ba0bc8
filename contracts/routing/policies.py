"""The router's routing policies (`pagedinfer router --policy`, `spec.router.policy`); router/policy.py
implements them, the operator validates the spec against them.
"""

POLICIES = ("prefix", "least-load", "round-robin")
