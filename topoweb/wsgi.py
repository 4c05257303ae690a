"""WSGI entry point (`granian --interface wsgi topoweb.wsgi:application`)."""

import os

from django.core.wsgi import get_wsgi_application

from topoweb.startup import check_static_collected, tune_gc
from topoweb.wsgi_env import WithoutProcessEnvironment

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "topoweb.settings")

application = WithoutProcessEnvironment(get_wsgi_application(), os.environ)
# Fail at start-up, not with a 500 on every page.
check_static_collected()
# Everything loaded so far stays; the collector need not look at it again.
tune_gc()
