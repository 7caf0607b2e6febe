-- terminate --cancel, any supported version: cancel the one backend's current query.
SELECT pg_catalog.pg_cancel_backend(%(pid)s)
