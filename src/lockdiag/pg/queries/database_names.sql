-- Any supported version: the cluster's databases by OID, and the connected one's OID, from the
-- catalog alone (no pg_locks read), for `log --dsn`.
SELECT d.oid::bigint, d.datname::text, d.datname = pg_catalog.current_database()
FROM pg_catalog.pg_database AS d
