"""A server's counters from its /metrics text, read by prometheus_client's parser.

The one Prometheus text parser of the project: the autoscaler
(operator/autoscaling/readings.py) reads pods with the same
`text_string_to_metric_families`, so a timestamp, an escaped label value or
a comment line means the same to both. Names come from
contracts/metric_names.py.
"""

from __future__ import annotations

from collections.abc import Iterable


def sample_totals(text: str, names: Iterable[str]) -> dict[str, float | None]:
    """For each sample name, the sum of its values over all label sets; None where the text has none.

    ValueError when the text is not Prometheus text exposition.
    """
    from prometheus_client.parser import text_string_to_metric_families

    totals: dict[str, float | None] = dict.fromkeys(names)
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in totals:
                    totals[sample.name] = (totals[sample.name] or 0.0) + float(sample.value)
    except Exception as exc:  # the parser raises ValueError, IndexError, ... on garbage
        raise ValueError(f"not Prometheus text exposition: {exc}") from None
    return totals
