"""``manage.py rebuild_summaries TENANT...``: one transaction per tenant, the lock tried first.

Inside ``transaction.atomic()`` the tenant's transaction-level lock lasts until the block
commits; outside one (Django's autocommit) xact_lock refuses, as the lock would end at once.
A session lock (``--export``) is unlocked when its block ends, before Django closes or reuses
the connection (CONN_MAX_AGE).
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import connection, transaction

from lockdiag.worker import NotInTransaction, session_lock, work, xact_lock


class Command(BaseCommand):  # type: ignore[misc]  # Django ships no type information
    help = "Rebuild tenants' summaries, one worker per tenant at a time."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenants", nargs="+", type=int)
        parser.add_argument("--export", type=int, default=None, help="an invoice batch")

    def handle(self, *args: Any, **options: Any) -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "CREATE TABLE IF NOT EXISTS tenant_summary "
                "(tenant int PRIMARY KEY, rebuilt timestamptz)"
            )
        try:
            xact_lock(connection, "tenant_summary", options["tenants"][0])
        except NotInTransaction:
            self.stdout.write("outside atomic(): refused")
        for tenant in options["tenants"]:
            self.stdout.write(f"tenant {tenant}: {self.rebuild(tenant)}")
        if options["export"] is not None:
            batch = options["export"]
            with session_lock(connection, "invoice_export", batch) as taken:
                self.stdout.write(f"invoices {batch}: {'exported' if taken else 'busy'}")

    def rebuild(self, tenant: int) -> str:
        with transaction.atomic():
            if not xact_lock(connection, "tenant_summary", tenant):
                return "busy"
            with work("tenant_summary"), connection.cursor() as cursor:
                cursor.execute(
                    "INSERT INTO tenant_summary (tenant, rebuilt) VALUES (%s, now()) "
                    "ON CONFLICT (tenant) DO UPDATE SET rebuilt = excluded.rebuilt",
                    [tenant],
                )
            return "rebuilt"
