import os

import pytest

# stable rich output: fixed width, no colour (STYLE.md habit 12)
os.environ["COLUMNS"] = "100"
os.environ["NO_COLOR"] = "1"
os.environ.setdefault("TERM", "dumb")


@pytest.fixture(autouse=True)
def _pin_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("NO_COLOR", "1")
