"""Every conversation with a server: --timeout as one value and the deadlines it sets,
connections and their pinned settings, the one read-only diagnostic session, the snapshot
queries (``queries/*.sql``, each one's columns named where its rows are read) and their
capture, the PgBouncer console, pooltest's scenarios and the one-backend actions (cancel,
terminate). Which server to read, and the reads themselves, one-off or over time, are
:mod:`lockdiag.evidence`'s, above this layer.

May import: psycopg, ``lockdiag.core`` (the model it fills), the worker-facing modules
(``errors``, ``durations``, ``keys``, ``registry``) and itself; never ``evidence``, ``views``,
``render``, ``cli`` or ``logs``.
"""
