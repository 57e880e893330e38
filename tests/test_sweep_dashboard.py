"""packrl sweep dashboard: optuna-dashboard serving a real sweep's study on localhost, looked at in a real headless
Chromium (Debian's package, installed by make system-deps): its rendered page names the study, and its screenshot
is a drawn page."""
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
SPACE = "defaults = false\n[train]\nlearning_rate = { low = 1e-4, high = 3e-2 }\nnum_steps = 32\nupdate_epochs = 2\n" \
        "[vec]\nnum_envs = 8\n"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# quiet: this file's tests take at most 15 s
def _chromium(*args, timeout=200):
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    assert browser, "chromium not found: install Debian's chromium (make system-deps)"
    return subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--window-size=1280,800",
                           "--virtual-time-budget=15000", *args], capture_output=True, text=True, timeout=timeout)


def test_the_dashboard_shows_the_sweeps_study_in_a_headless_browser(tmp_path):
    space = tmp_path / "space.toml"
    space.write_text(SPACE)
    out = tmp_path / "sweep"
    done = subprocess.run([sys.executable, "-m", "packrl", "sweep", "cartpole", "--trials", "2", "--budget", "2048",
                           "--space", str(space), "--pruner", "none", "--study", "dashboard-check", "--out", str(out),
                           # quiet: the whole test takes 15 s
                           "--no-live"], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "packrl", "sweep", "dashboard", str(out), "--port", str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        end = time.monotonic() + 200  # quiet: the whole test takes 15 s
        while True:
            try:
                # one try of a polling loop: the loop's deadline above bounds the wait
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/studies", timeout=5).read()
                break
            except OSError:
                assert server.poll() is None and time.monotonic() < end, server.stderr.read() if server.poll() else ""
                time.sleep(0.5)
        listed = _chromium("--dump-dom", f"http://127.0.0.1:{port}/dashboard/")
        assert "dashboard-check" in listed.stdout
        png = tmp_path / "study.png"
        _chromium(f"--screenshot={png}", f"http://127.0.0.1:{port}/dashboard/studies/1")
        image = np.asarray(Image.open(png).convert("RGB"))
        assert image.shape[:2] == (800, 1280)
        assert len(np.unique(image.reshape(-1, 3), axis=0)) > 50  # a drawn page, not a blank or an error screen
        page = _chromium("--dump-dom", f"http://127.0.0.1:{port}/dashboard/studies/1")
        assert "dashboard-check" in page.stdout and "History" in page.stdout
    finally:
        server.send_signal(signal.SIGTERM)
        stdout, _ = server.communicate(timeout=200)  # quiet: the whole test takes 15 s
    assert server.returncode == 0 and f"http://127.0.0.1:{port}/dashboard/" in stdout
