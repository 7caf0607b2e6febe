"""`lockdiag exporter`: a Prometheus exporter of advisory-lock contention, for a fleet."""

from __future__ import annotations

import ipaddress
from typing import Any

import click

from lockdiag.cli.alerts import threshold_option
from lockdiag.cli.common import (
    DURATION,
    fleet_options,
    get_registry,
    get_targets,
    pooler_options,
    registry_option,
)
from lockdiag.core.findings import CheckPolicy
from lockdiag.errors import EXIT_INTERRUPTED, InputError
from lockdiag.exporter import DEFAULT_PORT, MIN_READ_INTERVAL, Exporter


@click.command("exporter")
@click.option(
    "--listen",
    default=f"127.0.0.1:{DEFAULT_PORT}",
    show_default=True,
    metavar="HOST:PORT",
    help="Where to serve /metrics, /probe, / and /-/healthy. Loopback unless you name another "
    "address (every series and the page show session details); :PORT is every interface.",
)
@click.option(
    "--interval",
    **DURATION,
    default="1s",
    show_default=True,
    help="Time between two probes of each target's backends (pg_stat_activity only); the lock "
    "table is read when they changed, within --duty-cycle.",
)
@click.option(
    "--duty-cycle",
    "duty",
    type=click.FloatRange(0.0001, 1.0),
    default=0.01,
    show_default=True,
    help="Share of wall time the sampler's reads of pg_locks (each with its analysis) may take, "
    "keeping the server's lock manager busy: a read that took 0.3s waits 30s for the next at "
    "0.01.",
)
@click.option(
    "--min-read-interval",
    **DURATION,
    default=f"{MIN_READ_INTERVAL:g}s",
    show_default=True,
    help="A scrape this soon after a target's last read is answered with that read: bursts "
    "of scrapes, from any number of clients, read each server's lock table once.",
)
@threshold_option("--session-age", "5m,1h", "A certain session-level advisory lock held this long.")
@threshold_option("--wait-age", "30s,5m", "A session waiting for a lock this long.")
@threshold_option("--idle-age", "1m,10m", "A holder idle in transaction while others wait.")
@threshold_option("--max-blocked", "5,20", "More than N sessions behind one root blocker.")
@pooler_options
@fleet_options
@registry_option
def exporter_command(
    listen: str,
    interval: float,
    duty: float,
    min_read_interval: float,
    session_age: Any,
    wait_age: Any,
    idle_age: Any,
    max_blocked: Any,
    registry: str | None,
) -> None:
    """Serve advisory-lock contention to Prometheus, for one server or a fleet.

    Each scrape takes at most one snapshot per target (concurrent scrapes share it); a
    sampler per target probes its backends every --interval and reads the lock table when
    they changed, within --duty-cycle, for the hold and wait histograms. A dead
    target shows lockdiag_up 0 and leaves the others untouched; one that does not answer
    in time costs one deadline, then is retried in the background while scrapes report it
    down at once. Prometheus' scrape timeout shortens the deadline. Targets are named by host,
    port and database, never with a password; /probe?target=NAME serves one of them.

    \b
    Examples:
      lockdiag exporter --dsn postgresql://db1/app --dsn postgresql://db2/app
      lockdiag exporter --targets fleet.txt --listen 0.0.0.0:9714
    """
    host, port = parse_listen(listen)
    listen = f"{host}:{port}" if listen.startswith(":") else listen  # said as it is bound
    if interval <= 0:
        raise InputError("--interval must be more than zero")
    names = get_registry(registry)
    targets = get_targets(names)  # named and completed as every command's
    policy = CheckPolicy(
        session_age, wait_age, idle_age, max_blocked, names.unregistered or "report"
    )
    exporter = Exporter(targets, policy, interval, duty, min_read_interval)
    try:
        server = exporter.serve(host, port)
    except (OSError, ValueError, OverflowError) as error:
        # a host that does not resolve (gaierror), one IDNA cannot encode (UnicodeError), a
        # port the socket module refuses (OverflowError): its words, on one line
        reason = getattr(error, "strerror", None) or str(error) or type(error).__name__
        raise InputError(f"cannot listen on {listen!r}: {reason}") from None
    if not _loopback(host):
        click.echo(
            f"lockdiag exporter: warning: serving on {listen}, beyond this machine: the series "
            "and the page show application names and queries' lock keys",
            err=True,
        )
    click.echo(
        f"lockdiag exporter: http://{listen}/metrics for {len(targets)} target(s): "
        + ", ".join(target.label for target in targets),
        err=True,
    )
    exporter.start_samplers()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        raise SystemExit(EXIT_INTERRUPTED) from None
    finally:
        server.server_close()
        exporter.close()


def parse_listen(listen: str) -> tuple[str, int]:
    """``HOST:PORT`` of --listen (an IPv6 address in brackets: ``[::1]:9714``) as the host to
    bind, brackets removed, and a port from 1 to 65535; else an InputError in one line.
    ``:PORT`` alone is every interface (0.0.0.0), as Prometheus' own --web.listen-address."""
    usage = f"--listen {listen!r}: give HOST:PORT, e.g. 127.0.0.1:{DEFAULT_PORT}"
    host, colon, port_text = listen.rpartition(":")
    if colon and not host:
        host = "0.0.0.0"  # noqa: S104 - asked for: ':PORT' is every interface, and said so
    if host.startswith("[") != host.endswith("]"):
        raise InputError(f"{usage} (an IPv6 address in brackets: [::1]:{DEFAULT_PORT})")
    host = host[1:-1] if host.startswith("[") else host
    if (
        not host.strip()
        or not host.isprintable()
        or not (port_text.isascii() and port_text.isdigit())
    ):
        raise InputError(usage)
    port = int(port_text)
    if port == 0:
        raise InputError(
            f"--listen {listen!r}: port 0 would be any free port, unknown to Prometheus: "
            "give a port from 1 to 65535"
        )
    if port > 65535:
        raise InputError(f"--listen {listen!r}: port {port} is out of range (1 to 65535)")
    return host, port


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"
