"""The shipped alert rules and Grafana dashboard: `promtool check rules`, the rules' own unit tests
(`promtool test rules`), and every series they use is one /metrics exposes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import service_missing

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "topoweb-rules.yml"
RULE_TESTS = REPO / "deploy" / "prometheus" / "topoweb-rules.test.yml"
DASHBOARD = REPO / "deploy" / "grafana" / "topoweb.json"


def promtool() -> str:
    binary = shutil.which("promtool")
    if binary is None:
        service_missing("needs promtool (Debian's prometheus package)")
    return binary


@pytest.mark.parametrize(
    "args", [("check", "rules", RULES), ("test", "rules", RULE_TESTS)], ids=["check", "test"]
)
def test_promtool_accepts_the_rules_and_their_tests(args):
    done = subprocess.run([promtool(), *map(str, args)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def _exposed() -> set[str]:
    source = (REPO / "apps" / "metrics" / "ops.py").read_text()
    return set(re.findall(r'"(topoweb_[a-z_]+)"', source))


def test_rules_and_dashboard_use_only_exposed_series():
    exposed = _exposed()
    exprs = [r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs += [t["expr"] for p in panels for t in p.get("targets", [])]
    used = {name for e in exprs for name in re.findall(r"\btopoweb_[a-z_]+", e)}
    assert used and used <= exposed, used - exposed
    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    assert {"TopoWebNodeDown", "TopoWebGpusBookedWithoutRank", "TopoWebAgentsBehind"} <= alerts
    assert {"TopoWebQueueWaitLong", "TopoWebStepTimeOffPrediction"} <= alerts
