"""TopoWeb settings: one module, every difference comes from environment variables.

With no variables set this is the embedded default (SQLite in the project folder, Celery tasks run
eagerly in-process, a generated secret key in `.secret_key`), so `make run` needs no services.
`DATABASE_URL` (postgres://...) and `CELERY_BROKER_URL` (redis://...) switch the same code to
Postgres and Redis. `ENV_VARS` lists every variable read here (docs/configuration.md documents each).
"""

import ipaddress
import os
import secrets
import sys
import warnings
from pathlib import Path

import dj_database_url
from csp.constants import NONE, SELF, UNSAFE_INLINE
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
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # The same backend, with a health check that polls the socket before it sends a SELECT 1.
    DATABASES["default"]["ENGINE"] = "topoweb.postgres"
if EMBEDDED:
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    # IMMEDIATE makes SQLite writers queue for the lock up front instead of failing mid-transaction.
    # WAL lets readers run beside the one writer (pages no longer fail while a pass writes);
    # the busy timeout is how long a writer waits for the lock before "database is locked".
    DATABASES["default"]["OPTIONS"] = {
        "timeout": 20,
        "transaction_mode": "IMMEDIATE",
        "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
    }

SECRET_KEY = _env("SECRET_KEY")
if not SECRET_KEY:
    if not EMBEDDED and not TESTING:
        raise ImproperlyConfigured("SECRET_KEY must be set in the environment when DATABASE_URL is set")
    SECRET_KEY = _embedded_secret_key(BASE_DIR / ".secret_key")

ALLOWED_HOSTS = _env_list("ALLOWED_HOSTS", "localhost,127.0.0.1")
CSRF_TRUSTED_ORIGINS = _env_list("CSRF_TRUSTED_ORIGINS")
HTTPS = _env_bool("TOPOWEB_HTTPS")
# Browsers keep Secure cookies on http://localhost too, so docker compose sets this without TLS.
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = HTTPS or _env_bool("TOPOWEB_SECURE_COOKIES")
_HSTS_SECONDS = _env("TOPOWEB_HSTS_SECONDS", "31536000")
_HSTS_SUBDOMAINS = _env_bool("TOPOWEB_HSTS_INCLUDE_SUBDOMAINS", True)
_HSTS_PRELOAD = _env_bool("TOPOWEB_HSTS_PRELOAD", True)
if HTTPS:
    # Behind a TLS-terminating proxy: trust its scheme header, redirect http, pin https by HSTS.
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SECURE_SSL_REDIRECT = True
    # The container health check calls /healthz over plain http on 127.0.0.1.
    SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
    try:
        SECURE_HSTS_SECONDS = int(_HSTS_SECONDS)
    except ValueError:
        raise ImproperlyConfigured("TOPOWEB_HSTS_SECONDS must be a whole number of seconds") from None
    SECURE_HSTS_INCLUDE_SUBDOMAINS = _HSTS_SUBDOMAINS
    SECURE_HSTS_PRELOAD = _HSTS_PRELOAD

# Content-Security-Policy (django-csp): scripts only from this site (the dashboard has no inline
# script; data rides in <script type="application/json">, which is not executed). Inline styles
# stay allowed: Plotly and Swagger UI set them. The e2e tests fail on any reported violation.
CONTENT_SECURITY_POLICY = {
    "DIRECTIVES": {
        "default-src": [SELF],
        "script-src": [SELF],
        "style-src": [SELF, UNSAFE_INLINE],
        "img-src": [SELF, "data:", "blob:"],
        "font-src": [SELF, "data:"],
        "connect-src": [SELF],
        "worker-src": [SELF, "blob:"],
        "object-src": [NONE],
        "base-uri": [SELF],
        "form-action": [SELF],
        "frame-ancestors": [NONE],
    }
}

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
    "csp",
    "apps.api",
    "apps.topology",
    "apps.scheduling",
    "apps.metrics",
    "apps.dashboard",
    "apps.simulations",
    "apps.executors",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "topoweb.bodylimits.BodyLimitMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "apps.api.middleware.reject_nul_bytes",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "topoweb.middleware.CSPMiddleware",
    "topoweb.middleware.DatabaseUnavailableMiddleware",
    "topoweb.middleware.WriteSlotsMiddleware",
]

# Messages live in the session (read only where a page shows them): the default cookie storage
# builds a cookie signer on every request, a tenth of an agent sync's CPU.
MESSAGE_STORAGE = "django.contrib.messages.storage.session.SessionStorage"
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
LOGIN_REDIRECT_URL = "/welcome/"  # operators go on to the now page, others to the graph
LOGOUT_REDIRECT_URL = "/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# API writes (POST, PUT, PATCH, DELETE to DRF views but the agents' sync long-poll) running at once
# in one web process; more wait up to TOPOWEB_API_WRITE_WAIT_S for a slot, then get a 503 with
# Retry-After (topoweb.middleware.WriteSlotsMiddleware). 0: no limit.
API_WRITE_SLOTS = int(_env("TOPOWEB_API_WRITE_SLOTS") or 1)
API_WRITE_WAIT_S = float(_env("TOPOWEB_API_WRITE_WAIT_S") or 10)

# Request bodies are limited per endpoint by topoweb.bodylimits (413 naming the limit); this is
# the largest of those limits, so the import page's pasted spec (a form field) is not refused first.
DATA_UPLOAD_MAX_MEMORY_SIZE = 33 * 1024 * 1024

STATIC_URL = "/static/"
STATIC_ROOT = Path(_env("TOPOWEB_STATIC_ROOT") or BASE_DIR / "staticfiles")
STATICFILES_DIRS = [BASE_DIR / "static"]
# Production serves the hashed, compressed output of collectstatic; the embedded default and tests
# serve straight from the app folders so no collectstatic step is needed.
WHITENOISE_USE_FINDERS = EMBEDDED or TESTING or DEBUG
if WHITENOISE_USE_FINDERS:
    # Serving from the finders, a missing collectstatic output folder is expected.
    warnings.filterwarnings("ignore", message="No directory at", category=UserWarning)
# Tests build many request handlers (each Django test client builds its own): each would list every
# static file under the finders at its first request. There they are looked up per request instead.
WHITENOISE_AUTOREFRESH = DEBUG or TESTING
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"
        if WHITENOISE_USE_FINDERS
        else "whitenoise.storage.CompressedManifestStaticFilesStorage"
    },
}

CACHE_URL = _env("CACHE_URL")
# Fails open (see topoweb/cache.py): with Redis down, throttling lets requests through, and a
# request waits at most this long for it.
CACHE_SOCKET_TIMEOUT_S = 1.0
CACHES = {
    "default": (
        {
            "BACKEND": "topoweb.cache.FailOpenRedisCache",
            "LOCATION": CACHE_URL,
            "OPTIONS": {
                "socket_connect_timeout": CACHE_SOCKET_TIMEOUT_S,
                "socket_timeout": CACHE_SOCKET_TIMEOUT_S,
            },
        }
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

# Accounts, priority limits and fair share (apps/scheduling/accounts.py, apps/placement/priority.py).
MAX_PRIORITY_USER = int(_env("TOPOWEB_MAX_PRIORITY_USER") or 100)
MAX_PRIORITY_OPERATOR = int(_env("TOPOWEB_MAX_PRIORITY_OPERATOR") or 10000)
FAIR_SHARE_HALF_LIFE_H = float(_env("TOPOWEB_FAIR_SHARE_HALF_LIFE_H") or 24)
PRIORITY_WEIGHT_REQUESTED = float(_env("TOPOWEB_PRIORITY_WEIGHT_REQUESTED") or 1)
PRIORITY_WEIGHT_AGE = float(_env("TOPOWEB_PRIORITY_WEIGHT_AGE") or 10)
PRIORITY_WEIGHT_FAIR_SHARE = float(_env("TOPOWEB_PRIORITY_WEIGHT_FAIR_SHARE") or 100)
PRIORITY_WEIGHT_QOS = float(_env("TOPOWEB_PRIORITY_WEIGHT_QOS") or 1)
# Refuse submissions of users in no account (Slurm's AccountingStorageEnforce=associations).
REQUIRE_ACCOUNT = _env_bool("TOPOWEB_REQUIRE_ACCOUNT", False)
BULK_MAX_JOBS = int(_env("TOPOWEB_BULK_MAX_JOBS") or 500)
# Most jobs a user may have waiting (queued or preempted) across every cluster; a submission that
# would go past it is refused whole (apps/scheduling/accounts.py queued_caps).
MAX_QUEUED_PER_USER = int(_env("TOPOWEB_MAX_QUEUED_PER_USER") or 1000)
if not 1 <= MAX_QUEUED_PER_USER <= 10_000_000:
    raise ImproperlyConfigured(
        f"TOPOWEB_MAX_QUEUED_PER_USER must be 1 .. 10,000,000, got {MAX_QUEUED_PER_USER}"
    )

# Retention in days, 0 keeps forever (apps/metrics/retention.py, a daily beat task).
RETAIN_REPORTS_DAYS = float(_env("TOPOWEB_RETAIN_REPORTS_DAYS") or 30)
RETAIN_RANK_RECORDS_DAYS = float(_env("TOPOWEB_RETAIN_RANK_RECORDS_DAYS") or 30)
RETAIN_OUTPUT_DAYS = float(_env("TOPOWEB_RETAIN_OUTPUT_DAYS") or 7)
RETAIN_JOB_SPECS_DAYS = float(_env("TOPOWEB_RETAIN_JOB_SPECS_DAYS") or 30)
RETAIN_AUDIT_DAYS = float(_env("TOPOWEB_RETAIN_AUDIT_DAYS") or 90)

REST_FRAMEWORK = {
    # The API's standard list, in order (apps.scheduling.api.authentication.AUTHENTICATION): the
    # views that name none, as the topology API, authenticate with it.
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "apps.api.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
        "apps.scheduling.api.authentication.LauncherAuthentication",
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
    "DEFAULT_THROTTLE_RATES": {
        "user": "1000/min",
        "launcher": "1000/min",
        "submit": "120/min",
        "submit_operator": _env("TOPOWEB_OPERATOR_SUBMIT_RATE") or "1200/min",
        "agent_sync": _env("TOPOWEB_AGENT_SYNC_RATE") or "300/min",
    },
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
        "apps.api.schemas.examples_attach",
        "apps.scheduling.api.schemas.status_descriptions",
    ],
    # Request bodies get their own components (JobSpecV1 in, Job out), as generated clients expect.
    "COMPONENT_SPLIT_REQUEST": True,
    # Job status appears in the job and job-list components: one named enum per status kind.
    "ENUM_NAME_OVERRIDES": {
        "JobStatusEnum": "apps.scheduling.choices.JobStatus",
        "CycleStatusEnum": "apps.scheduling.choices.CycleStatus",
        "ProposalStatusEnum": "apps.scheduling.choices.ProposalStatus",
        "MeasureSourceEnum": "apps.metrics.choices.MeasureSource",
        "NodeStateEnum": "apps.scheduling.choices.NodeState",
        "RankStateEnum": "apps.scheduling.choices.RankState",
        "PlacementPolicyEnum": "apps.topology.choices.PlacementPolicy",
    },
}

CELERY_BROKER_URL = _env("CELERY_BROKER_URL")
CELERY_RESULT_BACKEND = _env("CELERY_RESULT_BACKEND") or None
# Without a broker, tasks run in the calling process (embedded default and unit tests).
CELERY_TASK_ALWAYS_EAGER = not CELERY_BROKER_URL
CELERY_TASK_EAGER_PROPAGATES = True
if not CELERY_BROKER_URL:
    CELERY_BROKER_URL = "memory://localhost/"  # with a host: kombu warns without one
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_TIMEZONE = TIME_ZONE
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_TASK_ACKS_LATE = True
# A task whose worker process dies (SIGKILL, OOM) goes back to the queue instead of being acked.
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
# A message taken by a worker host that vanished is delivered again after this long; longer than
# any task may run, so a running task is never delivered twice.
CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": CELERY_TASK_TIME_LIMIT + 60}
# With the broker down, a request gives up queueing a task within about a second (beat retries).
CELERY_TASK_PUBLISH_RETRY_POLICY = {
    "max_retries": 2,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}
from apps.executors.tasks import BEAT_SCHEDULE as _EXECUTORS_BEAT  # noqa: E402
from apps.metrics.tasks import BEAT_SCHEDULE as _METRICS_BEAT  # noqa: E402
from apps.scheduling.tasks import BEAT_SCHEDULE as _SCHEDULING_BEAT  # noqa: E402

CELERY_BEAT_SCHEDULE = {**_SCHEDULING_BEAT, **_METRICS_BEAT, **_EXECUTORS_BEAT}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": _env("TOPOWEB_LOG_LEVEL", "INFO").upper()},
}

# Simulations: a folder of trace CSVs besides the bundled samples (examples/traces); the embedded
# default runs replays in a thread, since its eager Celery would hold the web request.
SIMULATION_TRACE_DIR = _env("SIMULATION_TRACE_DIR") or str(BASE_DIR.parent / "shared" / "data" / "traces")
SIMULATIONS_IN_THREAD = EMBEDDED and CELERY_TASK_ALWAYS_EAGER and not TESTING

# Node agents (apps/agent): the longest an agent's work poll waits on the server (the poll is
# also its heartbeat; a placement or stop answers it at once, so a long poll costs no launch
# latency), when a node silent that long is down, and how long a placed job may take until every
# rank started before it is requeued. An unchanged heartbeat is written once half of the down
# time has passed, so a node stays up only while the poll is at most a third of it (Slurm's
# SlurmdTimeout is 300 s); 60 s polls keep 2,048 nodes at a fraction of one web core.
try:
    TOPOWEB_AGENT_POLL_S = float(_env("TOPOWEB_AGENT_POLL_S", "60"))
    TOPOWEB_AGENT_DOWN_AFTER_S = float(_env("TOPOWEB_AGENT_DOWN_AFTER_S", "180"))
except ValueError:
    raise ImproperlyConfigured(
        "TOPOWEB_AGENT_POLL_S and TOPOWEB_AGENT_DOWN_AFTER_S must be seconds"
    ) from None
if not 0 < TOPOWEB_AGENT_POLL_S <= 60:
    raise ImproperlyConfigured("TOPOWEB_AGENT_POLL_S must be between 0 and 60 seconds")
if TOPOWEB_AGENT_DOWN_AFTER_S < 3 * TOPOWEB_AGENT_POLL_S:
    raise ImproperlyConfigured(
        "TOPOWEB_AGENT_DOWN_AFTER_S must be at least three times TOPOWEB_AGENT_POLL_S "
        "(an idle node's heartbeat is written once half of it has passed)"
    )
# TopoWeb's own Prometheus exposition (`/metrics`, apps/metrics/ops.py): with a token set, a
# scrape must send `Authorization: Bearer <token>`; without one, only addresses in
# TOPOWEB_METRICS_ALLOW (comma-separated IPs or networks; default loopback) may scrape.
TOPOWEB_METRICS_TOKEN = _env("TOPOWEB_METRICS_TOKEN")
if TOPOWEB_METRICS_TOKEN and not 16 <= len(TOPOWEB_METRICS_TOKEN) <= 256:
    raise ImproperlyConfigured("TOPOWEB_METRICS_TOKEN must be 16 to 256 characters")
try:
    TOPOWEB_METRICS_ALLOW = [
        ipaddress.ip_network(n, strict=False)
        for n in _env_list("TOPOWEB_METRICS_ALLOW", "127.0.0.1/32,::1/128")
    ]
except ValueError as exc:
    raise ImproperlyConfigured(f"TOPOWEB_METRICS_ALLOW: {exc}") from None
# The agents' lease: an agent whose syncs have not been answered this long stops its ranks. It
# is what a control-plane outage (web or database) may last without stopping any rank: 12
# minutes covers 10 minutes plus the long-poll in flight and the retry backoff. A node is down
# after TOPOWEB_AGENT_DOWN_AFTER_S of silence while the server answered others (it takes no new
# work); its jobs fail or requeue only at its fence deadline (about the lease plus half the down
# time plus the stop grace after its last heartbeat): see docs/operations.md.
try:
    TOPOWEB_AGENT_FENCE_AFTER_S = float(_env("TOPOWEB_AGENT_FENCE_AFTER_S", "720"))
except ValueError:
    raise ImproperlyConfigured("TOPOWEB_AGENT_FENCE_AFTER_S must be seconds") from None
if not TOPOWEB_AGENT_POLL_S < TOPOWEB_AGENT_FENCE_AFTER_S <= 86400:
    raise ImproperlyConfigured(
        "TOPOWEB_AGENT_FENCE_AFTER_S must be longer than TOPOWEB_AGENT_POLL_S and at most a day"
    )
TOPOWEB_START_TIMEOUT_S = float(_env("TOPOWEB_START_TIMEOUT_S", "600"))
# The MASTER_PORT range of agent-run jobs, "LOW-HIGH": each generation gets a port unique among
# the live generations on its rank 0's node. Keep it outside the nodes' ephemeral range
# (net.ipv4.ip_local_port_range, 32768-60999 on Linux by default), where the kernel would hand
# the same port to outgoing connections.
_ports = _env("TOPOWEB_MASTER_PORTS", "20000-29999").strip()
try:
    _low, _, _high = _ports.partition("-")
    TOPOWEB_MASTER_PORTS = (int(_low), int(_high))
except ValueError:
    raise ImproperlyConfigured(
        f"TOPOWEB_MASTER_PORTS must be LOW-HIGH, e.g. 20000-29999; got {_ports!r}"
    ) from None
if not 1024 <= TOPOWEB_MASTER_PORTS[0] <= TOPOWEB_MASTER_PORTS[1] <= 65535:
    raise ImproperlyConfigured(
        f"TOPOWEB_MASTER_PORTS must be LOW-HIGH with 1024 <= LOW <= HIGH <= 65535; got {_ports!r}"
    )
# Rank output the server keeps per rank (the agents ship it in chunks; `topoweb logs` pages it).
try:
    TOPOWEB_RANK_LOG_MAX_MB = float(_env("TOPOWEB_RANK_LOG_MAX_MB", "64"))
except ValueError:
    raise ImproperlyConfigured("TOPOWEB_RANK_LOG_MAX_MB must be a number of MiB") from None
# Thousands of agents' long-polls each take a connection briefly: a pool instead of one
# connection per thread (Postgres only; size = TOPOWEB_DB_POOL_MAX).
# The hot statements (agents' syncs) run prepared on Postgres (topoweb/postgres/prepared.py); off
# behind a pooler that does not keep prepared statements (PgBouncer before 1.21, transaction mode).
DB_PREPARED_STATEMENTS = not EMBEDDED and _env_bool("TOPOWEB_DB_PREPARED", True)
if DB_PREPARED_STATEMENTS:
    # Django turns psycopg's prepared statements off (None); they are prepared only where asked.
    DATABASES["default"].setdefault("OPTIONS", {})["prepare_threshold"] = 5
if _env("TOPOWEB_DB_POOL_MAX") and not EMBEDDED:
    DATABASES["default"]["CONN_MAX_AGE"] = 0
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = False
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 2,
        "max_size": int(_env("TOPOWEB_DB_POOL_MAX")),
        "timeout": 30,
    }
