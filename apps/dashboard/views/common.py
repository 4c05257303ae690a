"""Helpers shared by the dashboard views."""

from __future__ import annotations

import json
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.utils.safestring import SafeString, mark_safe

from apps.api import roles


def script_json(value) -> SafeString:
    """`value` as compact JSON safe to embed in a <script type="application/json"> element.

    Raises ValueError on NaN or infinity (JSON has neither)."""
    text = json.dumps(value, separators=(",", ":"), allow_nan=False)
    # What json_script escapes, so the document cannot close the element; replace() is fast on MBs.
    text = text.replace("<", "\\u003C").replace(">", "\\u003E").replace("&", "\\u0026")
    return mark_safe(text)


def perm_required(perm: str):
    """Login required, then 403 for users without `perm` (the permission the API checks too)."""

    def decorate(view):
        @wraps(view)
        @login_required
        def wrapped(request, *args, **kwargs):
            if not roles.can(request.user, perm):
                raise PermissionDenied(f"this page needs the {perm} permission")
            return view(request, *args, **kwargs)

        return wrapped

    return decorate


def refresh_s(value: str | None, default: int) -> int:
    """A page's `?refresh=S`: seconds between its refreshes, 2 to 300; `default` without one."""
    try:
        return min(300, max(2, int(value))) if value else default
    except ValueError:
        return default
