-- Enrichment, any supported version: GoodJob's concurrency keys, hashed like its job keys.
SELECT 'good_job_concurrency', c, k
FROM (SELECT c, ('x' || pg_catalog.substr(pg_catalog.md5(c), 1, 16))::bit(64)::bigint AS k
      FROM (SELECT DISTINCT concurrency_key AS c FROM ONLY public.good_jobs
            WHERE finished_at IS NULL AND concurrency_key IS NOT NULL
            LIMIT %(row_limit)s) AS d) AS j
WHERE k = ANY(%(keys)s::bigint[])
