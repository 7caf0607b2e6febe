-- Any supported version: the cluster's databases by OID, and the connected one's OID, from the
-- catalog alone (no pg_locks read), for `log --dsn`. datname stays of type name: a shared
-- catalog's names are in the encoding of the database they were created from, and lockdiag
-- decodes names forgivingly (connection.tolerate_undecodable).
SELECT d.oid::bigint, d.datname, d.datname = pg_catalog.current_database()
FROM pg_catalog.pg_database AS d
