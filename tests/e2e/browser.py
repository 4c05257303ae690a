"""The system Chromium and the flags it needs here (no sandbox as root, no background networking
on a closed network); shared by the e2e tests and bench/dashboard_render.py."""

CHROMIUM = "/usr/lib/chromium/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
