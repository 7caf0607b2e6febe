-- Snapshot for PostgreSQL 14 and later (pg_locks.waitstart appeared in 14).
-- One statement, one round trip, and pg_locks referenced once: every reference to the view
-- copies the whole lock table again (lock.c, GetLockStatusData), so nothing else reads it.
-- pg_blocking_pids() runs only for rows that wait (NOT granted), never per held lock.
-- Three kinds of rows: 'lock' (typed lock columns), then 'session' and 'server' (a JSON
-- detail column), so session text is sent once per session, not once per lock.
-- %(all_types)s: false keeps advisory locks only; lockdiag's own backend is left out.
-- %(names)s: names whose keys only hashtext() computes (pg_partman's, the registry's [known]
-- hashtext and pgmq queues): hashed here, once, for the locks of every database.
-- The session runs with search_path = pg_catalog: regclass prints other schemas qualified.
-- Text another database may hold in its own encoding (pg_stat_activity's query, the shared
-- catalogs' names: datname, usename, CURRENT_USER) and the connected database's relation names
-- (in SQL_ASCII any bytes) are sent as their bytes, in hex, through quote_literal (byte by
-- byte), which nothing can fail: raw_text.py decodes them in their database's encoding.
SELECT 'lock' AS kind, l.locktype, l.database, l.relation, l.page, l.tuple, l.virtualxid,
       l.transactionid::text AS transactionid, l.classid, l.objid, l.objsubid,
       l.virtualtransaction, l.pid, l.mode, l.granted, l.waitstart,
       CASE WHEN NOT l.granted THEN pg_catalog.pg_blocking_pids(l.pid) END AS blocked_by,
       -- a relation's name is only known to pg_class of its own database (or shared)
       CASE WHEN l.relation IS NOT NULL
             AND l.database IN (0, (SELECT d.oid FROM pg_catalog.pg_database AS d
                                    WHERE d.datname = pg_catalog.current_database()))
            THEN pg_catalog.encode(pg_catalog.decode(pg_catalog.quote_literal(
                     l.relation::pg_catalog.regclass::text), 'escape'), 'hex') END AS relation_name,
       NULL::json AS detail
FROM pg_catalog.pg_locks AS l
WHERE (%(all_types)s OR l.locktype = 'advisory')
  AND l.pid IS DISTINCT FROM pg_catalog.pg_backend_pid()
UNION ALL
SELECT 'session', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL,
       pg_catalog.json_build_object(
           'pid', a.pid,
           'database', pg_catalog.encode(pg_catalog.decode(pg_catalog.quote_literal(a.datname),
                                                           'escape'), 'hex'),
           'user', pg_catalog.encode(pg_catalog.decode(pg_catalog.quote_literal(a.usename),
                                                       'escape'), 'hex'),
           -- a background worker's names are set by its C code: pg_auto_failover 2.0's
           -- launcher and pg_partman 4.7's worker show bytes that are no text at all
           'application_name', pg_catalog.encode(pg_catalog.decode(
               pg_catalog.quote_literal(a.application_name), 'escape'), 'hex'),
           'client_addr', a.client_addr,
           'client_port', a.client_port, 'backend_start', a.backend_start,
           'xact_start', a.xact_start, 'query_start', a.query_start,
           'state_change', a.state_change, 'state', a.state,
           'wait_event_type', a.wait_event_type, 'wait_event', a.wait_event,
           -- as its bytes too: a background worker's is whatever its C code left there
           -- (pg_partman 4.7's and pg_auto_failover 2.0's are never set: random bytes)
           'backend_type', pg_catalog.encode(pg_catalog.decode(
               pg_catalog.quote_literal(a.backend_type), 'escape'), 'hex'),
           'leader_pid', a.leader_pid,
           'query', pg_catalog.encode(pg_catalog.decode(pg_catalog.quote_literal(a.query),
                                                        'escape'), 'hex'),
           -- the query's database's encoding, and whether the query may be cut short (the
           -- server keeps track_activity_query_size - 1 bytes, then cuts by the connected
           -- database's encoding, not the query's: up to 3 bytes of a character may be left)
           'encoding', pg_catalog.pg_encoding_to_char(d.encoding),
           -- (current_setting() says "1kB": pg_size_bytes() reads it; pg_settings would
           -- build every setting's row to find this one, some 0.8 ms of each read)
           'cut', pg_catalog.octet_length(a.query) + 4 >= pg_catalog.pg_size_bytes(
               pg_catalog.current_setting('track_activity_query_size')),
           -- 0 for none, so a file from before this column reads as unknown, not as none
           'backend_xid', COALESCE(a.backend_xid::text::bigint, 0))
FROM pg_catalog.pg_stat_activity AS a
LEFT JOIN pg_catalog.pg_database AS d ON d.oid = a.datid
WHERE a.pid <> pg_catalog.pg_backend_pid()
UNION ALL
SELECT 'server', NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
       NULL, NULL, NULL, NULL, NULL,
       pg_catalog.json_build_object(
           'now', pg_catalog.now(),
           'current_user', pg_catalog.encode(pg_catalog.decode(pg_catalog.quote_literal(
                               CURRENT_USER), 'escape'), 'hex'),
           'backend_pid', pg_catalog.pg_backend_pid(),
           'in_recovery', pg_catalog.pg_is_in_recovery(),
           'read_all_stats', pg_catalog.pg_has_role('pg_read_all_stats', 'USAGE'),
           'database', pg_catalog.encode(pg_catalog.decode(pg_catalog.quote_literal(
                           pg_catalog.current_database()), 'escape'), 'hex'),
           'encoding', pg_catalog.getdatabaseencoding(),
           'hashed', (SELECT pg_catalog.json_object_agg(s, pg_catalog.hashtext(s))
                      FROM pg_catalog.unnest(%(names)s::text[]) AS s),
           -- tables (in any schema) whose presence confirms a guessed key's software, such
           -- as Airflow's dag, dag_run, task_instance: %(software_tables)s, by name only
           'software_tables', (SELECT pg_catalog.json_agg(DISTINCT c.relname::text)
                               FROM pg_catalog.pg_class AS c
                               WHERE c.relname = ANY (%(software_tables)s::pg_catalog.name[])
                                 AND c.relkind IN ('r', 'p')),
           -- the extensions of the catalogue's programs installed here: %(extensions)s
           'extensions', (SELECT pg_catalog.json_agg(e.extname) FROM pg_catalog.pg_extension AS e
                          WHERE e.extname = ANY (%(extensions)s::pg_catalog.name[])),
           'databases', (SELECT pg_catalog.json_object_agg(d.oid, pg_catalog.encode(
                                    pg_catalog.decode(pg_catalog.quote_literal(d.datname),
                                                      'escape'), 'hex'))
                         FROM pg_catalog.pg_database AS d),
           -- tables of well-known software whose rows name advisory keys (the catalogue's
           -- entries declare them: %(row_schemas)s and %(row_names)s, in pairs), read
           -- from the catalog (to_regclass() raises without USAGE on the schema); a table
           -- we may not read is listed with a leading '!', one we may read but not lock
           -- against DDL before reading it (trust.py: LOCK TABLE needs one of these) with '?'
           'tables', (SELECT pg_catalog.json_agg(
                                 CASE WHEN NOT (pg_catalog.has_schema_privilege(n.oid, 'USAGE')
                                       AND pg_catalog.has_table_privilege(c.oid, 'SELECT'))
                                      THEN '!'
                                      WHEN NOT pg_catalog.has_table_privilege(
                                          c.oid, 'UPDATE, DELETE, TRUNCATE')
                                      THEN '?' ELSE '' END || n.nspname || '.' || c.relname)
                      FROM pg_catalog.pg_class AS c
                      JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
                      WHERE (n.nspname, c.relname) IN (
                          SELECT * FROM ROWS FROM (
                              pg_catalog.unnest(%(row_schemas)s::pg_catalog.name[]),
                              pg_catalog.unnest(%(row_names)s::pg_catalog.name[])))))
