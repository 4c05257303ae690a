"""Swagger UI in Chromium under the site's Content-Security-Policy: served locally, it loads the
schema and lists the operations."""

from __future__ import annotations

from playwright.sync_api import expect


def test_swagger_ui_lists_the_api_under_the_csp(page, live_server, scenario, login, shot):
    login("alice")
    response = page.goto(f"{live_server.url}/api/docs/")
    assert "script-src 'self'" in response.headers["content-security-policy"]
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("TopoWeb API")
    expect(page.locator(".opblock-summary-path[data-path='/api/v1/jobs/']").first).to_be_visible()
    shot("api-docs")
