"""Metrics as data: Nagios perfdata and Prometheus series are built as :class:`Metric` values,
labelled and merged as data, and written out in one place.

A fleet's series carry a ``target`` label added to the data, never by editing text lines. The
Prometheus text format groups every sample of a metric under its one HELP and TYPE.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Metric:
    name: str
    help: str
    samples: list[tuple[Labels, float]] = field(default_factory=list)
    type: str = "gauge"

    def add(self, value: float, **labels: str) -> Metric:
        self.samples.append((tuple(labels.items()), value))
        return self


def gauge(name: str, text: str, value: float | None = None) -> Metric:
    metric = Metric(name, text)
    return metric if value is None else metric.add(value)


def labelled(metrics: Iterable[Metric], name: str, value: str) -> list[Metric]:
    """The same metrics with one more label, first on every sample."""
    return [
        Metric(m.name, m.help, [(((name, value), *labels), v) for labels, v in m.samples], m.type)
        for m in metrics
    ]


def merged(groups: Iterable[Iterable[Metric]]) -> list[Metric]:
    """Metrics of the same name joined into one, in the order they first appear."""
    found: dict[str, Metric] = {}
    for group in groups:
        for metric in group:
            known = found.setdefault(metric.name, Metric(metric.name, metric.help, [], metric.type))
            known.samples.extend(metric.samples)
    return list(found.values())


_LABEL_UNSAFE = re.compile(r'["\\\n]')


def label_value(value: str) -> str:
    return _LABEL_UNSAFE.sub(lambda m: {"\n": "\\n"}.get(m.group(), "\\" + m.group()), value)


def number(value: float) -> str:
    """Exact: integers as integers, other values as Python's shortest round-trip float."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def exposition(metrics: Iterable[Metric]) -> list[str]:
    """The Prometheus text exposition format (version 0.0.4)."""
    lines: list[str] = []
    for metric in metrics:
        lines += [f"# HELP {metric.name} {metric.help}", f"# TYPE {metric.name} {metric.type}"]
        for labels, value in metric.samples:
            text = ",".join(f'{key}="{label_value(val)}"' for key, val in labels)
            lines.append(f"{metric.name}{{{text}}} {number(value)}" if text else
                         f"{metric.name} {number(value)}")  # fmt: skip
    return lines
