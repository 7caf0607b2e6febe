-- terminate, any supported version: whether the backend still exists after a signal.
SELECT count(*) AS alive FROM pg_catalog.pg_stat_activity WHERE pid = %(pid)s
