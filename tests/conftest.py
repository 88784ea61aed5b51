import os

import pytest
import torch

# stable rich output: fixed width, no colour (../shared/STYLE.md habit 12)
os.environ["COLUMNS"] = "100"
os.environ["NO_COLOR"] = "1"
os.environ.setdefault("TERM", "dumb")

# Do not oversubscribe the cores: under pytest-xdist each worker gets cores / workers torch
# threads (at least 1).  On a 16-core GPU machine 16 workers with torch's default 16 threads each
# made every heavy test time out; OMP_NUM_THREADS, where set, still wins.
# sigprop's runs read the same number (environment.probe_threads reads OMP_NUM_THREADS), so a probe
# inside a worker does not raise it back to half the machine's cores.
_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _workers > 1 and "OMP_NUM_THREADS" not in os.environ:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _workers))
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


@pytest.fixture(autouse=True)
def _pin_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    monkeypatch.setenv("NO_COLOR", "1")
