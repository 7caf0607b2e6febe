-- Any supported version: the cluster's databases by OID, and the connected one's OID, from the
-- catalog alone (no pg_locks read), for `log --dsn`. A shared catalog's names are in the
-- encoding of the database they were created from, which the server may fail to convert: each
-- is sent as its bytes, with the connected database's encoding (raw_text.py decodes them).
SELECT d.oid::bigint AS oid,
       pg_catalog.encode(pg_catalog.decode(pg_catalog.quote_literal(d.datname), 'escape'),
                         'hex') AS name,
       d.datname = pg_catalog.current_database() AS current,
       pg_catalog.getdatabaseencoding() AS encoding
FROM pg_catalog.pg_database AS d
