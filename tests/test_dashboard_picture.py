"""The README's picture of the dashboard (docs/dashboard.png) is the demo's as it is now:
tools/dashboard_picture.py takes it from the demo agent and records beside it
(docs/dashboard.json) what the page showed and the picture's SHA-256. The record must
be this picture's, and what it showed must be agent/modelzoo.py's demo with every panel
of the page: a change to the demo or to the page's panels without a new picture fails
here (run ``.venv/bin/python tools/dashboard_picture.py``)."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from agent.modelzoo import DEMO_APP, DEMO_APP_MEMBERS, demo_models

ROOT = Path(__file__).resolve().parent.parent
PICTURE = ROOT / "docs" / "dashboard.png"
RECORD = PICTURE.with_suffix(".json")
RETAKE = "take it again: .venv/bin/python tools/dashboard_picture.py"


def test_the_record_is_this_pictures():
    record = json.loads(RECORD.read_text())
    assert record["png_sha256"] == hashlib.sha256(PICTURE.read_bytes()).hexdigest(), \
        f"docs/dashboard.png is not the picture docs/dashboard.json describes: {RETAKE}"


def test_the_picture_shows_the_demo_as_it_is():
    record = json.loads(RECORD.read_text())
    shown = sorted(record["models"] + [a["app"] for a in record["apps"]])
    assert shown == demo_models(), f"the picture shows {shown}, the demo is " \
                                   f"{demo_models()}: {RETAKE}"
    (app,) = record["apps"]
    assert app["app"] == DEMO_APP
    assert [m.split(":")[0] for m in app["members"]] == list(DEMO_APP_MEMBERS)


def test_the_picture_shows_every_panel_of_the_page():
    record = json.loads(RECORD.read_text())
    page = (ROOT / "agent" / "http" / "static" / "node.html").read_text()
    headings = [re.sub(r"<[^>]+>.*", "", h).strip()
                for h in re.findall(r"<h2>(.*?)</h2>", page)]
    assert record["panels"] == headings, RETAKE
    assert "Selection apps" not in record["hidden"]  # the demo's app is in the picture
    assert record["devices"] == ["cpu", "disk"]
    node_js = (ROOT / "agent" / "http" / "static" / "node.js").read_text()
    series = re.findall(r'key: "(\w+_seconds)"', node_js)
    assert record["whatif_series"] == series and len(series) == 3, RETAKE


def test_the_readme_shows_the_picture_and_says_how_it_is_made():
    readme = (ROOT / "README.md").read_text()
    assert "](docs/dashboard.png)" in readme
    assert "tools/dashboard_picture.py" in readme
