"""A Prometheus `/api/v1/query` stand-in that evaluates the PromQL it is sent.

Queries are parsed by promql_parser (the Rust `promql-parser` crate that
follows Prometheus' own grammar), so a query Prometheus would refuse, e.g. a
string with the escape `\\-`, is answered 400 as Prometheus answers it. The
evaluated subset is what the autoscaler sends: a vector selector with `=` and
`=~` matchers (fully anchored, like Prometheus' regex matchers),
`increase(selector[window])`, and `max|sum by (labels) (...)`.

Stored series are (labels, value) per metric name; for a counter the value
stands for its increase over any window. The same pod may be stored under
two `job`s, as when a PodMonitor and a `prometheus.io/scrape` annotation job
both scrape it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import promql_parser
from aiohttp import web

Series = tuple[Mapping[str, str], float]


@dataclass
class PrometheusApi:
    series: Mapping[str, Sequence[Series]]
    queries: list[str] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        query = request.query["query"]
        self.queries.append(query)
        try:
            expr = promql_parser.parse(query)
        except ValueError as e:
            return web.json_response({"status": "error", "errorType": "bad_data", "error": str(e)}, status=400)
        result = [{"metric": dict(labels), "value": [0, str(value)]} for labels, value in self.evaluate(expr)]
        return web.json_response({"status": "success", "data": {"resultType": "vector", "result": result}})

    def evaluate(self, expr) -> list[Series]:
        kind = type(expr).__name__
        if kind == "AggregateExpr":
            return _aggregate(str(expr.op), list(expr.modifier.labels), self.evaluate(expr.expr))
        if kind == "Call" and expr.func.name == "increase":
            return self.evaluate(expr.args[0].vector_selector)
        if kind == "VectorSelector":
            return [
                (labels, value)
                for labels, value in self.series.get(expr.name, ())
                if all(_matches(m, labels.get(m.name, "")) for m in expr.matchers.matchers)
            ]
        raise NotImplementedError(f"this stand-in does not evaluate {kind}")


def _matches(matcher, value: str) -> bool:
    op = str(matcher.op)
    if op == "MatchOp.Equal":
        return value == matcher.value
    if op == "MatchOp.Re":
        return re.fullmatch(matcher.value, value) is not None
    raise NotImplementedError(f"this stand-in does not evaluate the matcher {op}")


def _aggregate(op: str, by: list[str], series: list[Series]) -> list[Series]:
    combine = {"max": max, "sum": lambda a, b: a + b}[op]
    groups: dict[tuple[str, ...], float] = {}
    for labels, value in series:
        key = tuple(labels.get(name, "") for name in by)
        groups[key] = combine(groups[key], value) if key in groups else value
    return [(dict(zip(by, key)), value) for key, value in groups.items()]
