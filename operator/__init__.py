"""pagedinfer.operator: the kopf control plane. Imports no torch."""
