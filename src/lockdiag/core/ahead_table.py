"""The catalogue's part of the snapshot query, written from it (lockdiag.core.ahead):
do not edit; python scripts/write_ahead_table.py writes it again, and
tests/test_ahead.py fails while it is not what the catalogue computes."""

KEYS: tuple[tuple[int, int, int], ...] = (
    (0, 0, 2),
    (0, 1, 1),
    (0, 2, 1),
    (0, 1234567890, 1),
    (4294967295, 4294967295, 1),
    (4294967295, 4294967294, 1),
    (0, 99995, 1),
    (18028, 4163491309, 1),
    (0, 1230759186, 1),
    (0, 3978567709, 1),
    (0, 72707369, 1),
    (0, 75474063, 1),
    (0, 4097083626, 1),
    (1686128, 708954076, 1),
    (897169763, 17238259, 1),
    (2797599524, 3317543529, 2),
    (1100694, 573543859, 1),
    (2310019644, 3648988387, 1),
    (2241733, 3628731256, 1),
    (0, 2389487409, 1),
    (0, 4004, 1),
    (0, 41730001, 1),
    (4169312562, 2152881705, 1),
)
SPACES: tuple[tuple[int, int], ...] = ((2, 16185446),)
NAMES: tuple[str, ...] = (
    "pgqueuer_statistics",
    "default",
    "pg_partman run_maintenance",
    "pg_partman run_maintenance procedure",
    "pg_partman drop_partition_time",
    "pg_partman drop_partition_id",
    "pg_partman run_analyze",
    "pg_partman reapply_constraints",
    "pg_partman undo_partition_native",
    "pg_partman undo_partition",
    "pg_partman partition_data_proc",
    "pg_partman undo_partition_proc",
    "mimeo advisory lock",
)
SIGN_TABLES: tuple[str, ...] = (
    "commit_row_lock",
    "dag",
    "dag_run",
    "fact_table_deps",
    "fact_tables",
    "object_state",
    "operation_outputs",
    "queue_tables",
    "saq_jobs",
    "saq_versions",
    "task_instance",
    "workflow_status",
)
ROW_TABLES: tuple[str, ...] = (
    "pgboss.queue",
    "public.good_jobs",
    "public.good_job_processes",
    "public.que_jobs",
    "pgmq.meta",
    "dramatiq.queue",
)
EXTENSIONS: tuple[str, ...] = (
    "mimeo",
    "pg_fact_loader",
    "pg_partman",
    "pg_repack",
    "pgautofailover",
    "pgmq",
)
