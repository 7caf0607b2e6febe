"""What people and scripts read: one module per command's view, turning a diagnosis
into :class:`lockdiag.render.Output` blocks (and Nagios or Prometheus series as data); the
column catalogue; nothing here prints.

May import: ``lockdiag.core``, ``lockdiag.logs`` (the log's view), ``lockdiag.render``'s
blocks, the worker-facing modules, prometheus_client and itself; never ``lockdiag.pg``,
``cli``, psycopg or click.
"""
