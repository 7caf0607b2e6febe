-- Enrichment, any supported version: GoodJob's process locks, 'good_job_processes-<id>'.
SELECT 'good_job_process', id::text, k
FROM (SELECT id, ('x' || pg_catalog.substr(pg_catalog.md5('good_job_processes-' || id::text),
                                           1, 16))::bit(64)::bigint AS k
      FROM ONLY public.good_job_processes LIMIT %(row_limit)s) AS p
WHERE k = ANY(%(keys)s::bigint[])
