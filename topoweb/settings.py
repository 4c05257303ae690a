"""TopoWeb settings: one module, every difference comes from environment variables.

With no variables set this is the embedded default (SQLite in the project folder, Celery tasks run
eagerly in-process, a generated secret key in `.secret_key`), so `make run` needs no services.
`DATABASE_URL` (postgres://...) and `CELERY_BROKER_URL` (redis://...) switch the same code to
Postgres and Redis. `ENV_VARS` lists every variable read here (the README documents each).
"""

import os
import secrets
import sys
import warnings
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent

ENV_VARS: dict[str, str] = {}


def _env(name: str, default: str = "") -> str:
    """The environment variable `name` (recorded in ENV_VARS), or `default`."""
    ENV_VARS[name] = default
    return os.environ.get(name, default)


def _env_bool(name: str, default: bool = False) -> bool:
    return _env(name, "1" if default else "0").strip().lower() in ("1", "true", "yes", "on")


def _env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in _env(name, default).split(",") if item.strip()]


def _embedded_secret_key(path: Path) -> str:
    """Read the embedded default's secret key, creating it (mode 0600) on first use."""
    if not path.exists():
        # Written aside, then linked into place: a concurrent reader never sees an empty file.
        scratch = path.with_name(f"{path.name}.{os.getpid()}")
        fd = os.open(scratch, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(secrets.token_urlsafe(50) + "\n")
        try:
            os.link(scratch, path)
        except FileExistsError:
            pass
        finally:
            scratch.unlink()
    return path.read_text(encoding="utf-8").strip()


# Under pytest: cheap password hashing and relaxed production checks.
TESTING = _env_bool("TOPOWEB_TESTING") or "pytest" in sys.modules
DEBUG = _env_bool("TOPOWEB_DEBUG")

DATABASES = {
    "default": dj_database_url.parse(
        _env("DATABASE_URL") or f"sqlite:///{BASE_DIR / 'db.sqlite3'}",
        conn_max_age=60,
        conn_health_checks=True,
    )
}
EMBEDDED = DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3"
if EMBEDDED:
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # IMMEDIATE makes SQLite writers queue for the lock up front instead of failing mid-transaction.
    DATABASES["default"]["OPTIONS"] = {"timeout": 20, "transaction_mode": "IMMEDIATE"}

SECRET_KEY = _env("SECRET_KEY")
if not SECRET_KEY:
    if not EMBEDDED and not TESTING:
        raise ImproperlyConfigured("SECRET_KEY must be set in the environment when DATABASE_URL is set")
    SECRET_KEY = _embedded_secret_key(BASE_DIR / ".secret_key")

ALLOWED_HOSTS = _env_list("ALLOWED_HOSTS", "localhost,127.0.0.1")
CSRF_TRUSTED_ORIGINS = _env_list("CSRF_TRUSTED_ORIGINS")
if _env_bool("TOPOWEB_HTTPS"):
    # Behind a TLS-terminating proxy: trust its scheme header and keep cookies on https.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "apps.api",
    "apps.topology",
    "apps.scheduling",
    "apps.dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "apps.api.middleware.reject_nul_bytes",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "topoweb.urls"
WSGI_APPLICATION = "topoweb.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
if TESTING:
    PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

STATIC_URL = "/static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STATICFILES_DIRS = [BASE_DIR / "static"]
# Production serves the hashed, compressed output of collectstatic; the embedded default and tests
# serve straight from the app folders so no collectstatic step is needed.
WHITENOISE_USE_FINDERS = EMBEDDED or TESTING or DEBUG
if WHITENOISE_USE_FINDERS:
    # Serving from the finders, a missing collectstatic output folder is expected.
    warnings.filterwarnings("ignore", message="No directory at", category=UserWarning)
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if WHITENOISE_USE_FINDERS
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

CACHE_URL = _env("CACHE_URL")
CACHES = {
    "default": (
        {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": CACHE_URL}
        if CACHE_URL
        else {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "topoweb"}
    )
}

# Roles and sign-in (apps/api/roles.py, apps/api/logins.py).
ANY_USER_SUBMITS = _env_bool("TOPOWEB_ANY_USER_SUBMITS", True)
AUTHENTICATION_BACKENDS = ["apps.api.logins.ThrottledModelBackend"]
LOGIN_FAILURE_LIMIT = int(_env("TOPOWEB_LOGIN_FAILURE_LIMIT") or 10)
LOGIN_FAILURE_LIMIT_PER_IP = int(_env("TOPOWEB_LOGIN_FAILURE_LIMIT_PER_IP") or 50)
LOGIN_FAILURE_WINDOW_S = 15 * 60

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.api.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_PARSER_CLASSES": ["apps.api.parsers.JSONParser"],
    "EXCEPTION_HANDLER": "apps.api.exceptions.exception_handler",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "DEFAULT_FILTER_BACKENDS": ["django_filters.rest_framework.DjangoFilterBackend"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_THROTTLE_CLASSES": [
        "apps.api.throttling.CallerRateThrottle",
        "apps.api.throttling.ScopedCallerThrottle",
    ],
    "DEFAULT_THROTTLE_RATES": {"user": "1000/min", "launcher": "1000/min", "submit": "120/min"},
    # Clients are told apart by the socket's address unless this many proxies add X-Forwarded-For.
    "NUM_PROXIES": int(_env("TOPOWEB_NUM_PROXIES") or 0),
}

SPECTACULAR_SETTINGS = {
    "TITLE": "TopoWeb API",
    "DESCRIPTION": "Topology-aware placement of multi-GPU training jobs.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # Swagger UI from the installed sidecar package: the docs page works without internet access.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    # Error responses and their body shapes on every operation (apps/api/schemas.py).
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "apps.api.schemas.error_responses",
    ],
    # Request bodies get their own components (JobSpecV1 in, Job out), as generated clients expect.
    "COMPONENT_SPLIT_REQUEST": True,
    # Job status appears in the job and job-list components: one named enum per status kind.
    "ENUM_NAME_OVERRIDES": {
        "JobStatusEnum": "apps.scheduling.choices.JobStatus",
        "CycleStatusEnum": "apps.scheduling.choices.CycleStatus",
        "ProposalStatusEnum": "apps.scheduling.choices.ProposalStatus",
        "PlacementPolicyEnum": "apps.topology.choices.PlacementPolicy",
    },
}

CELERY_BROKER_URL = _env("CELERY_BROKER_URL")
CELERY_RESULT_BACKEND = _env("CELERY_RESULT_BACKEND") or None
# Without a broker, tasks run in the calling process (embedded default and unit tests).
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
CELERY_TASK_EAGER_PROPAGATES = True
if not CELERY_BROKER_URL:
    CELERY_BROKER_URL = "memory://"
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = TIME_ZONE
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
from apps.scheduling.tasks import BEAT_SCHEDULE as CELERY_BEAT_SCHEDULE  # noqa: E402, F401

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": _env("TOPOWEB_LOG_LEVEL", "INFO").upper()},
}
