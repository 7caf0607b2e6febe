-- terminate, any supported version (the timeout argument exists from 14): end the one backend
-- and wait up to %(wait_ms)s milliseconds for it to exit.
SELECT pg_catalog.pg_terminate_backend(%(pid)s, %(wait_ms)s)
