# TopoWeb web/worker/beat image (see docker-compose.yml).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

WORKDIR /app

# Runtime dependencies only: the part of requirements.txt above "# Development and tests".
COPY requirements.txt .
RUN sed '/^# Development and tests/,$d' requirements.txt > requirements-runtime.txt \
    && pip install -r requirements-runtime.txt

COPY . .

# Hashed, compressed static files for WhiteNoise; the build-time values only let settings load.
RUN SECRET_KEY=collectstatic-only DATABASE_URL=postgres://build@localhost/build \
    python manage.py collectstatic --noinput

RUN useradd --create-home --uid 1000 topoweb && chown -R topoweb /app
USER topoweb

EXPOSE 8000 8001
# The users' web server. The node agents' endpoint runs from the same image as
# `uvicorn topoweb.asgi:application --port 8001` (the `agents` service of docker-compose.yml).
# Many threads per process: a node agent's work poll sent here holds one for up to 60 s.
CMD ["granian", "--interface", "wsgi", "--host", "0.0.0.0", "--port", "8000", "--workers", "2", \
     "--blocking-threads", "128", "--respawn-failed-workers", "--workers-kill-timeout", "30", \
     "--access-log", "topoweb.wsgi:application"]
