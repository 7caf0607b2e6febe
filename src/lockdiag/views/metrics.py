"""Metrics as data: Prometheus series are built as :class:`Metric` values, labelled and merged
as data, and written out by prometheus_client (the exposition of `check --format prometheus`,
`sample --format prometheus` and the exporter alike).

A fleet's series carry a ``target`` label added to the data, never by editing text lines.
Label values (namespaces, application names, targets: chosen by whoever names them) are
written with their control characters made visible (:func:`inert`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from lockdiag.render import clean

if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric as PrometheusMetric

# prometheus_client is imported where series are written, not with this module: with the
# http.server it brings, it took 25 ms of every `check`, whatever its format

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


class Collected:
    """A prometheus_client collector of metric families made beforehand."""

    def __init__(self, metrics: Iterable[Metric]) -> None:
        self.metrics = list(metrics)

    def collect(self) -> Iterator[PrometheusMetric]:
        yield from families(self.metrics)


def families(metrics: Iterable[Metric]) -> Iterator[PrometheusMetric]:
    """The metrics as prometheus_client families (each sample's label names are its
    family's), their label values made inert (:func:`inert`)."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    for metric in metrics:
        names = [name for name, _ in metric.samples[0][0]] if metric.samples else []
        family: GaugeMetricFamily | CounterMetricFamily
        if metric.type == "counter":
            family = CounterMetricFamily(
                metric.name.removesuffix("_total"), metric.help, labels=names
            )
        else:
            family = GaugeMetricFamily(metric.name, metric.help, labels=names)
        for labels, value in metric.samples:
            family.add_metric([value_ for _, value_ in labels], value)
        yield inert(family)


def inert(family: PrometheusMetric) -> PrometheusMetric:
    """``family`` with every label value written as a terminal shows it
    (:func:`lockdiag.render.clean`): control characters, which prometheus_client passes
    through raw (it escapes only backslash, double quote and line feed), become visible
    text: an escape ``\\e``, a carriage return ``\\r``, a NUL ``\\x00``, a line feed ``\\n``;
    invisible direction marks too. Printable values, nearly all, are kept as they are. For
    any family, a prometheus_client metric's own as well."""
    family.samples = [
        sample._replace(labels={name: clean(value) for name, value in sample.labels.items()})
        for sample in family.samples
    ]
    return family


def exposition(metrics: Iterable[Metric]) -> list[str]:
    """The Prometheus text exposition format, by prometheus_client."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Collected(metrics))
    return generate_latest(registry).decode().splitlines()
