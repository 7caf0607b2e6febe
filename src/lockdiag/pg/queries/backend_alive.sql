-- terminate, any supported version: whether the backend still exists after a signal.
SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE pid = %(pid)s
