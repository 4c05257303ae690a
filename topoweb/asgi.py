"""ASGI entry point."""

import os

from django.core.asgi import get_asgi_application

from topoweb.startup import check_static_collected

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "topoweb.settings")

application = get_asgi_application()
# Fail at start-up, not with a 500 on every page.
check_static_collected()
