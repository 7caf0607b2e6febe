-- Enrichment, any supported version: may lockdiag read these user tables (trust.py)? Per table
-- (locked against DDL by the caller): its relkind; whether row-level security applies to the
-- current role; each column read that is missing, not of the built-in type expected, or under
-- a collation someone created (a nondeterministic one changes what DISTINCT and = see); and
-- each function, operator, type, operator class or operator family that an index, constraint
-- or statistics object on it (what the planner evaluates) reaches, neither built in (oid below
-- FirstNormalObjectId, 16384) nor owned by a superuser. Reached: what the object depends on
-- (pg_depend), then, step by step, what those depend on (an operator's code and estimators, a
-- type's functions, a SQL function's BEGIN ATOMIC body), an operator class's family and every
-- family member (support functions and operators, which index scans and the planner's
-- estimates call), and a domain's constraints. Extension membership proves nothing: the owner
-- of a trusted extension may ALTER EXTENSION ... ADD their own function to it, while the
-- objects of the extension's script belong to the bootstrap superuser. Policies run only where
-- row security applies (then the table is skipped anyway); rules on a plain table never fire
-- on SELECT. Only catalogs are read, through built-in functions: nothing here runs a user's
-- code.
-- %(tables)s: [{"name": "schema.table", "columns": {"column": ["typname", ...]}}]
WITH RECURSIVE wanted AS (
    SELECT w.name, w.columns
    FROM pg_catalog.json_to_recordset(%(tables)s::json) AS w(name text, columns json)
), relation AS (
    SELECT w.name, w.columns, c.oid, c.relkind, c.relrowsecurity
    FROM wanted AS w
    JOIN pg_catalog.pg_namespace AS n ON n.nspname = pg_catalog.split_part(w.name, '.', 1)
    JOIN pg_catalog.pg_class AS c
      ON c.relnamespace = n.oid AND c.relname = pg_catalog.split_part(w.name, '.', 2)
), reached (relation, classid, objid, refclassid, refobjid) AS (
    -- (table, index/constraint/statistics object of it, object it reaches)
    SELECT r.oid, d.classid, d.objid, u.refclassid, u.refobjid
    FROM relation AS r
    JOIN pg_catalog.pg_depend AS d
      ON d.refclassid = 'pg_catalog.pg_class'::pg_catalog.regclass AND d.refobjid = r.oid
     AND d.classid IN ('pg_catalog.pg_class'::pg_catalog.regclass,
                       'pg_catalog.pg_constraint'::pg_catalog.regclass,
                       'pg_catalog.pg_statistic_ext'::pg_catalog.regclass)
    JOIN pg_catalog.pg_depend AS u ON u.classid = d.classid AND u.objid = d.objid
    UNION
    SELECT x.relation, x.classid, x.objid, n.refclassid, n.refobjid
    FROM reached AS x
    CROSS JOIN LATERAL (
        SELECT u.refclassid, u.refobjid
        FROM pg_catalog.pg_depend AS u
        WHERE u.classid = x.refclassid AND u.objid = x.refobjid
          AND x.refclassid IN ('pg_catalog.pg_proc'::pg_catalog.regclass,
                               'pg_catalog.pg_operator'::pg_catalog.regclass,
                               'pg_catalog.pg_type'::pg_catalog.regclass,
                               'pg_catalog.pg_opclass'::pg_catalog.regclass)
        UNION ALL
        SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass, p.amproc::pg_catalog.oid
        FROM pg_catalog.pg_amproc AS p
        WHERE x.refclassid = 'pg_catalog.pg_opfamily'::pg_catalog.regclass
          AND p.amprocfamily = x.refobjid
        UNION ALL
        SELECT 'pg_catalog.pg_operator'::pg_catalog.regclass, a.amopopr
        FROM pg_catalog.pg_amop AS a
        WHERE x.refclassid = 'pg_catalog.pg_opfamily'::pg_catalog.regclass
          AND a.amopfamily = x.refobjid
        UNION ALL
        SELECT u.refclassid, u.refobjid
        FROM pg_catalog.pg_constraint AS k
        JOIN pg_catalog.pg_depend AS u
          ON u.classid = 'pg_catalog.pg_constraint'::pg_catalog.regclass AND u.objid = k.oid
        WHERE x.refclassid = 'pg_catalog.pg_type'::pg_catalog.regclass
          AND k.contypid = x.refobjid
    ) AS n
    WHERE n.refclassid IN ('pg_catalog.pg_proc'::pg_catalog.regclass,
                           'pg_catalog.pg_operator'::pg_catalog.regclass,
                           'pg_catalog.pg_type'::pg_catalog.regclass,
                           'pg_catalog.pg_opclass'::pg_catalog.regclass,
                           'pg_catalog.pg_opfamily'::pg_catalog.regclass)
)
SELECT r.name, r.relkind::text,
       r.relrowsecurity AND NOT EXISTS (
           SELECT 1 FROM pg_catalog.pg_roles AS u
           WHERE u.rolname = CURRENT_USER AND (u.rolsuper OR u.rolbypassrls)) AS row_security,
       ARRAY(SELECT CASE WHEN a.attnum IS NULL THEN 'no column ' || e.key
                         WHEN a.attcollation >= 16384
                         THEN 'column ' || e.key || ' under collation '
                              || pg_catalog.quote_ident(k.collname) || ' (not built in)'
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
             LEFT JOIN pg_catalog.pg_collation AS k ON k.oid = a.attcollation
             WHERE a.attnum IS NULL
                OR t.typnamespace <> 'pg_catalog'::pg_catalog.regnamespace
                OR t.typname::text NOT IN (SELECT pg_catalog.json_array_elements_text(e.value))
                OR a.attcollation >= 16384
             ORDER BY e.key) AS wrong_columns,
       -- each as its bytes (raw_text.py): an owner's name is a shared catalog's, in the encoding
       -- of the database it was created from, which the server may fail to convert
       ARRAY(SELECT pg_catalog.encode(pg_catalog.decode(pg_catalog.quote_literal(u.what),
                                                        'escape'), 'hex')
             FROM (
             SELECT DISTINCT pg_catalog.pg_describe_object(x.classid, x.objid, 0) || ' that uses '
                    || pg_catalog.pg_describe_object(x.refclassid, x.refobjid, 0)
                    || COALESCE(' owned by ' || owner.rolname, '') AS what
             FROM reached AS x
             LEFT JOIN pg_catalog.pg_proc AS p
               ON x.refclassid = 'pg_catalog.pg_proc'::pg_catalog.regclass AND p.oid = x.refobjid
             LEFT JOIN pg_catalog.pg_operator AS o
               ON x.refclassid = 'pg_catalog.pg_operator'::pg_catalog.regclass
              AND o.oid = x.refobjid
             LEFT JOIN pg_catalog.pg_type AS t
               ON x.refclassid = 'pg_catalog.pg_type'::pg_catalog.regclass AND t.oid = x.refobjid
             LEFT JOIN pg_catalog.pg_opclass AS c
               ON x.refclassid = 'pg_catalog.pg_opclass'::pg_catalog.regclass
              AND c.oid = x.refobjid
             LEFT JOIN pg_catalog.pg_opfamily AS f
               ON x.refclassid = 'pg_catalog.pg_opfamily'::pg_catalog.regclass
              AND f.oid = x.refobjid
             LEFT JOIN pg_catalog.pg_roles AS owner
               ON owner.oid = COALESCE(p.proowner, o.oprowner, t.typowner, c.opcowner,
                                       f.opfowner)
             WHERE x.relation = r.oid
               AND x.refclassid IN ('pg_catalog.pg_proc'::pg_catalog.regclass,
                                    'pg_catalog.pg_operator'::pg_catalog.regclass,
                                    'pg_catalog.pg_type'::pg_catalog.regclass,
                                    'pg_catalog.pg_opclass'::pg_catalog.regclass,
                                    'pg_catalog.pg_opfamily'::pg_catalog.regclass)
               AND x.refobjid >= 16384
               AND owner.rolsuper IS NOT TRUE) AS u
             ORDER BY u.what) AS untrusted,
       pg_catalog.getdatabaseencoding() AS encoding
FROM relation AS r
