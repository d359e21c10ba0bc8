"""The kopf registry every pagedinfer operator handler registers into.

An explicit registry (not kopf's global default) keeps handlers from other
imported modules out of the operator. Handler modules decorate with
`registry=REGISTRY`; `pagedinfer operator` runs `kopf.operator(registry=REGISTRY)`.
"""

from __future__ import annotations

import kopf

REGISTRY = kopf.OperatorRegistry()
