"""A minimal Django settings module for the example worker: one app, one database."""

from __future__ import annotations

import os

SECRET_KEY = "example-only"  # noqa: S105 - an example, no secrets here
INSTALLED_APPS = ["summaries"]
USE_TZ = True
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "HOST": os.environ.get("LOCKDIAG_DJANGO_HOST", "localhost"),
        "PORT": os.environ.get("LOCKDIAG_DJANGO_PORT", "5432"),
        "NAME": os.environ.get("LOCKDIAG_DJANGO_NAME", "postgres"),
        "USER": os.environ.get("LOCKDIAG_DJANGO_USER", "postgres"),
    }
}
