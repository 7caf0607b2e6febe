-- The locks an answer needs, for PostgreSQL 14 and later (pg_locks.waitstart appeared in 14):
-- what check and who-holds read. It takes the place of the lock rows of
-- snapshot_post_140000.sql, whose session and server rows follow it (capture.py).
-- pg_locks is read once: a MATERIALIZED CTE is one copy of the lock table, however often it is
-- referenced, so the rows sent singly and the groups come from the same instant. The copy is of
-- pg_locks' own rows, no column added: a column computed into it makes the server build every
-- row anew (some 40 ms of 210 at 100k locks); a waiter's blockers are asked in waiters, once.
-- Sent singly, as the full read sends them: a lock that is not advisory (with %(all_types)s),
-- that waits, on an object somebody waits for (so every holder a waiter's pg_blocking_pids()
-- names, read in the same copy), of a prepared transaction, a key sent (the catalogue's and
-- the registry's listed keys, who-holds' key) or of a space sent (where every key is decoded
-- alone), and keys hashtext() names (%(names)s). A blocker's
-- other locks may be spans: findings count a span's every lock (core.findings.locks_in).
-- A space is a group's (classid, objsubid): asked once per group, never per lock (some 10 ms a
-- scan at 100k locks), its group's rows come singly like a small group's.
-- The rest, granted advisory locks nobody waits for, grouped by backend, database, mode and key
-- space (classid, objsubid): a group of GROUP_MIN rows or more comes back as one row, its
-- lowest key in objid, with a detail {"count", "objid_last"}; a smaller group as its rows.
-- A pair's objid is a signed int4 to the registry (an oid here): the group's lowest and
-- highest are by that signed value, so the span's first and last resources are its ends.
-- A dump asks for each span's keys too (capture.MEMBERS: "members" in the detail, every objid
-- of the group, in no order): the line ending "AS members" is replaced by an array_agg, which
-- the hash aggregate gathers as it counts (some 12 ms at 100k locks, where ordering them
-- here would sort the group's rows on disk first).
WITH l AS MATERIALIZED (
    SELECT l.*
    FROM pg_catalog.pg_locks AS l
    WHERE (%(all_types)s OR l.locktype = 'advisory')
      AND l.pid IS DISTINCT FROM pg_catalog.pg_backend_pid()
), hashed AS (
    SELECT pg_catalog.hashtext(s)::bigint AS h FROM pg_catalog.unnest(%(names)s::text[]) AS s
), keys AS (  -- unnest of several arrays is FROM syntax, never schema-qualified
    SELECT * FROM unnest(%(key_classids)s::bigint[], %(key_objids)s::bigint[],
                         %(key_subids)s::bigint[]) AS k(classid, objid, objsubid)
    UNION ALL  -- hashtext()'s int4 as a bigint key, and as the second int of a pair (SAQ)
    SELECT (h >> 32) & 4294967295, h & 4294967295, 1 FROM hashed
    UNION ALL
    SELECT 0, h & 4294967295, 2 FROM hashed
), spaces AS (
    SELECT * FROM unnest(%(space_classids)s::bigint[], %(space_subids)s::bigint[])
         AS s(classid, objsubid)
    UNION ALL  -- hashtext()'s int4 as the first int of a pair: a prefix of every key
    SELECT h & 4294967295, 2 FROM hashed
), waiters AS MATERIALIZED (  -- a backend waits for one lock at most
    SELECT w.pid, w.locktype, w.classid, w.objid, pg_catalog.pg_blocking_pids(w.pid) AS blocked_by
    FROM l AS w
    WHERE NOT w.granted
), probe AS MATERIALIZED (
    -- a key sent singly, as one bigint (classid << 32 | objid): a key waited for (waiters) or
    -- one of keys. A row is tested against it alone, in one hashed look-up where three
    -- of rows of columns took three times as long (20 ms of 200 at 100k locks): it matches
    -- in any database and key form too, which sends at most a few more rows singly, never
    -- fewer
    SELECT w.classid::bigint << 32 | w.objid::bigint FROM waiters AS w
    WHERE w.locktype = 'advisory'
    UNION ALL
    SELECT k.classid << 32 | k.objid FROM keys AS k
), sorted AS NOT MATERIALIZED (  -- read twice (groups, rows sent singly): computed in each
    -- scan of l rather than copied into a second tuplestore (a twentieth of the query at 100k)
    SELECT l.*,
           COALESCE(l.locktype <> 'advisory' OR NOT l.granted OR l.pid IS NULL
           OR (l.classid::bigint << 32 | l.objid::bigint) IN (TABLE probe), true) AS single,
           CASE WHEN l.objsubid = 2 AND l.objid::bigint > 2147483647
                THEN l.objid::bigint - 4294967296 ELSE l.objid::bigint END AS ordinal
    FROM l
), groups AS (
    SELECT s.pid, s.database, s.mode, s.classid, s.objsubid, pg_catalog.count(*) AS count,
           pg_catalog.min(s.ordinal) AS first, pg_catalog.max(s.ordinal) AS last,
           pg_catalog.min(s.virtualtransaction) AS virtualtransaction,
           NULL::pg_catalog.int8[] AS members,
           (s.classid::bigint << 16 | s.objsubid::bigint) IN (
               SELECT p.classid << 16 | p.objsubid FROM spaces AS p) AS spaced
    FROM sorted AS s
    WHERE NOT s.single
    GROUP BY s.pid, s.database, s.mode, s.classid, s.objsubid
)
SELECT 'lock' AS kind, s.locktype, s.database, s.relation, s.page, s.tuple, s.virtualxid,
       s.transactionid::text AS transactionid, s.classid, s.objid, s.objsubid,
       s.virtualtransaction, s.pid, s.mode, s.granted, s.waitstart,
       CASE WHEN NOT s.granted THEN (SELECT w.blocked_by FROM waiters AS w
                                     WHERE w.pid = s.pid LIMIT 1) END AS blocked_by,
       -- a relation's name is only known to pg_class of its own database (or shared); sent
       -- as its bytes, as the full read sends it
       CASE WHEN s.relation IS NOT NULL
             AND s.database IN (0, (SELECT d.oid FROM pg_catalog.pg_database AS d
                                    WHERE d.datname = pg_catalog.current_database()))
            THEN pg_catalog.encode(pg_catalog.decode(pg_catalog.quote_literal(
                     s.relation::pg_catalog.regclass::text), 'escape'), 'hex') END AS relation_name,
       NULL::json AS detail
FROM sorted AS s
WHERE s.single OR (s.pid, s.database, s.mode, s.classid, s.objsubid) IN (
    SELECT g.pid, g.database, g.mode, g.classid, g.objsubid FROM groups AS g
    WHERE g.count < %(group_min)s OR g.spaced)
UNION ALL
SELECT 'lock', 'advisory', g.database, NULL, NULL, NULL, NULL, NULL, g.classid,
       (g.first & 4294967295)::oid, g.objsubid, g.virtualtransaction, g.pid, g.mode, true,
       NULL, NULL, NULL,
       pg_catalog.json_build_object('count', g.count, 'objid_last', g.last & 4294967295,
                                 'members', g.members)
FROM groups AS g
WHERE g.count >= %(group_min)s AND NOT g.spaced
