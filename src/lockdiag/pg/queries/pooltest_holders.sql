-- pooltest, any supported version: backends holding the test key in the connected database,
-- read on the direct connection (never through the pool).
SELECT count(*) AS holders FROM pg_catalog.pg_locks
WHERE locktype = 'advisory' AND granted
  AND classid = %(classid)s AND objid = %(objid)s AND objsubid = %(objsubid)s
  AND database = (SELECT oid FROM pg_catalog.pg_database
                  WHERE datname = pg_catalog.current_database())
