"""The import page's paste box in Chromium: an `nvidia-smi topo -m` matrix quoted from an issue
(space-aligned, `> ` prefixes) previews with its notes and imports as one node."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import expect

from .test_dashboard import GPU_COUNT_JS, GRAPH_DRAWN

PASTE = (
    Path(__file__).resolve().parents[1] / "data" / "converters" / "nvsmi-h20-quoted-roce-frontend.txt"
).read_text()


def test_a_pasted_nvidia_smi_matrix_previews_its_notes_and_imports(page, live_server, scenario, login, shot):
    login("ops")
    page.goto(f"{live_server.url}/import/")
    page.select_option("#id_format", "nvidia-smi")
    page.fill("#id_text", PASTE)
    page.fill("#id_defaults", "name: h20-lab\n")
    page.click("button[value=preview]")
    page.wait_for_selector(GRAPH_DRAWN)
    assert page.evaluate(GPU_COUNT_JS) == 8
    expect(page.locator("#import-shapes")).to_contain_text("8 GPUs × 1 node; NVLink domains: 1 × 8 GPUs")
    expect(page.locator("#convert-notes")).to_contain_text("rocep152s0f0 left out: Ethernet/RoCE front end")
    shot("import-paste-preview")
    page.click("button[value=import]")
    page.wait_for_url(f"{live_server.url}/clusters/h20-lab/")
    expect(page.locator(".messages")).to_contain_text("Imported cluster h20-lab")
