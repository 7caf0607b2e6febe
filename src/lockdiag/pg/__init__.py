"""Every conversation with a server: connections and their pinned settings, the one
read-only diagnostic session, the snapshot queries (``queries/*.sql``) and their capture, the
PgBouncer console, fleets, the sampling loops, and the one-backend actions (cancel, terminate).

May import: psycopg, ``lockdiag.core`` (the model it fills), the worker-facing modules
(``errors``, ``durations``, ``keys``, ``registry``) and itself; never ``views``, ``render``,
``cli`` or ``logs``.
"""
