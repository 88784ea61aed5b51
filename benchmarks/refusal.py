"""How long sigprop takes to refuse a run that cannot fit (the estimate, before any allocation).

tests/verdicts/test_reliability.py::test_too_big_is_refused_before_allocating checks that nothing is
allocated; this prints the time of each refusal (whole process, import included).
Usage: python benchmarks/refusal.py
"""

import subprocess
import sys
import time

CASES = [
    ["mlp", "--depth", "400000", "--width", "4096", "--no-stream"],
    ["mlp", "--samples", "100000000", "--width", "4096"],
    ["resnet", "--dim", "5000000", "--blocks", "2", "--width", "4"],
]

for args in CASES:
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "sigprop", *args, "--device", "cpu"], capture_output=True, text=True
    )
    print(
        f"{' '.join(args)}: exit {out.returncode} in {time.perf_counter() - t0:.2f} s: "
        f"{out.stderr.strip().splitlines()[-1]}"
    )
