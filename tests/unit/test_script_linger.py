"""A finished SCRIPT task serves its metrics a little longer, as the built-in trainer does: without it
Prometheus' last scrape predated the final steps, and `make status` kept a finished worker at
`step 110 of 200 (55%)` (seen on `make up SCRIPT=tests/scripts/fit_cnn.py`, 2 epochs of 100 steps)."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_finished_script_keeps_serving_its_metrics(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('trained')\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    probe = textwrap.dedent(
        f"""
        import sys, threading, urllib.request
        from trainer.script import wrapper
        seen = []
        def scrape():  # while the wrapper lingers, after the script is over
            import time
            while not seen:
                try:
                    body = urllib.request.urlopen("http://127.0.0.1:{port}/metrics", timeout=1).read().decode()
                except OSError:
                    time.sleep(0.05)
                    continue
                if 'trainer_state="done"}} 1.0' in body:
                    seen.append(body)
                time.sleep(0.05)
        threading.Thread(target=scrape, daemon=True).start()
        code = wrapper.run({str(script)!r}, [], {{"TRAINER_METRICS_PORT": "{port}", "{"TRAINER_METRICS_LINGER"}": "2"}})
        print("code", code, "seen", bool(seen))
        """
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "code 0 seen True" in out.stdout, out.stdout + out.stderr[-2000:]
