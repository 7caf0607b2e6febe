"""Django's manage.py for the example worker: ``python manage.py rebuild_summaries 73 74``.

The database comes from LOCKDIAG_DJANGO_HOST/PORT/NAME/USER (see worker_settings.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "worker_settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
