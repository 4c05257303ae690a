"""WSGI entry point (`gunicorn topoweb.wsgi:application`)."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "topoweb.settings")

application = get_wsgi_application()
