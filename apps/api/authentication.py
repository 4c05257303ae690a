"""`Authorization: Launcher <key>`: a per-cluster launcher token (see LauncherToken)."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed

from apps.scheduling.models import LauncherToken


class LauncherAuthentication(BaseAuthentication):
    """Authenticates a launcher by its token; `request.auth` is the LauncherToken and
    `request.user` stays anonymous, so only the permissions that know launchers let it in."""

    keyword = "Launcher"

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.lower().encode():
            return None
        if len(parts) != 2:
            raise AuthenticationFailed("Invalid Launcher header: expected 'Authorization: Launcher <key>'.")
        try:
            key = parts[1].decode()
        except UnicodeDecodeError as exc:
            raise AuthenticationFailed("Invalid Launcher header: the key is not text.") from exc
        token = LauncherToken.objects.select_related("cluster").filter(key=key).first()
        if token is None:
            raise AuthenticationFailed("Invalid launcher token.")
        return AnonymousUser(), token

    def authenticate_header(self, request):
        return self.keyword


def launcher_of(request) -> LauncherToken | None:
    """The request's launcher token, if it authenticated as a launcher."""
    auth = getattr(request, "auth", None)
    return auth if isinstance(auth, LauncherToken) else None


class LauncherAuthenticationScheme(OpenApiAuthenticationExtension):
    """OpenAPI security scheme of LauncherAuthentication."""

    target_class = LauncherAuthentication
    name = "launcherAuth"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "Per-cluster launcher token: `Launcher <key>` (manage.py create_launcher_token)",
        }
