"""ASGI entry point: the whole site, with the node agents' sync long-poll served without a thread
per waiting agent (topoweb/agents_asgi.py). Run with `uvicorn topoweb.asgi:application`."""

import os

from django.core.asgi import get_asgi_application

from topoweb.startup import check_static_collected, tune_gc

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "topoweb.settings")

site = get_asgi_application()
# Fail at start-up, not with a 500 on every page.
check_static_collected()

from topoweb.agents_asgi import AgentSyncApplication  # noqa: E402 (needs the apps loaded)

application = AgentSyncApplication(site)
# Everything loaded so far stays; the collector need not look at it again.
tune_gc()
