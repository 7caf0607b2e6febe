-- Enrichment, any supported version: may lockdiag read these user tables (trust.py)? Per table
-- (locked against DDL by the caller): its relkind; whether row-level security applies to the
-- current role; each column read that is missing or not of the built-in type expected; each
-- index, constraint or statistics object on it (what the planner evaluates) that uses a
-- function, operator or type neither built in (oid below FirstNormalObjectId, 16384) nor a
-- member of an extension. Policies run only where row security applies (then the table is
-- skipped anyway); rules on a plain table never fire on SELECT.
-- Only catalogs are read, through built-in functions: nothing here runs a user's code.
-- %(tables)s: [{"name": "schema.table", "columns": {"column": ["typname", ...]}}]
WITH wanted AS (
    SELECT w.name, w.columns
    FROM pg_catalog.json_to_recordset(%(tables)s::json) AS w(name text, columns json)
), relation AS (
    SELECT w.name, w.columns, c.oid, c.relkind, c.relrowsecurity
    FROM wanted AS w
    JOIN pg_catalog.pg_namespace AS n ON n.nspname = pg_catalog.split_part(w.name, '.', 1)
    JOIN pg_catalog.pg_class AS c
      ON c.relnamespace = n.oid AND c.relname = pg_catalog.split_part(w.name, '.', 2)
)
SELECT r.name, r.relkind::text,
       r.relrowsecurity AND NOT EXISTS (
           SELECT 1 FROM pg_catalog.pg_roles AS u
           WHERE u.rolname = CURRENT_USER AND (u.rolsuper OR u.rolbypassrls)) AS row_security,
       ARRAY(SELECT CASE WHEN a.attnum IS NULL THEN 'no column ' || e.key
                         ELSE 'column ' || e.key || ' of type '
                              || pg_catalog.format_type(a.atttypid, NULL) || ' (expected '
                              || pg_catalog.array_to_string(ARRAY(
                                     SELECT pg_catalog.json_array_elements_text(e.value)),
                                     ' or ') || ')' END
             FROM pg_catalog.json_each(r.columns) AS e
             LEFT JOIN pg_catalog.pg_attribute AS a
               ON a.attrelid = r.oid AND a.attname = e.key AND a.attnum > 0
              AND NOT a.attisdropped
             LEFT JOIN pg_catalog.pg_type AS t ON t.oid = a.atttypid
             WHERE a.attnum IS NULL
                OR t.typnamespace <> 'pg_catalog'::pg_catalog.regnamespace
                OR t.typname::text NOT IN (SELECT pg_catalog.json_array_elements_text(e.value))
             ORDER BY e.key) AS wrong_columns,
       ARRAY(SELECT DISTINCT pg_catalog.pg_describe_object(d.classid, d.objid, 0) || ' that uses '
                    || pg_catalog.pg_describe_object(u.refclassid, u.refobjid, 0)
             FROM pg_catalog.pg_depend AS d
             JOIN pg_catalog.pg_depend AS u ON u.classid = d.classid AND u.objid = d.objid
             WHERE d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass
               AND d.refobjid = r.oid
               AND d.classid IN ('pg_catalog.pg_class'::pg_catalog.regclass,
                                 'pg_catalog.pg_constraint'::pg_catalog.regclass,
                                 'pg_catalog.pg_statistic_ext'::pg_catalog.regclass)
               AND u.refclassid IN ('pg_catalog.pg_proc'::pg_catalog.regclass,
                                    'pg_catalog.pg_operator'::pg_catalog.regclass,
                                    'pg_catalog.pg_type'::pg_catalog.regclass)
               AND u.refobjid >= 16384
               AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_depend AS x
                               WHERE x.classid = u.refclassid AND x.objid = u.refobjid
                                 AND x.deptype = 'e')
             ORDER BY 1) AS untrusted
FROM relation AS r
