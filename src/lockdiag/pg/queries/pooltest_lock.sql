-- pooltest, any supported version: the function is chosen from a fixed list in pooltest.py
-- (pg_try_advisory_lock, pg_advisory_lock, pg_advisory_xact_lock, pg_try_advisory_xact_lock,
-- pg_advisory_unlock) and composed as an identifier; the key is bound.
SELECT pg_catalog.{function}(%(a)s, %(b)s) AS answer
