"""Real browser: JupyterLab in headless Chromium runs 00_setup and a quiz answer is clicked."""

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

from conftest import ROOT

pytestmark = pytest.mark.browser
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def lab_server(tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(ROOT / "notebooks" / "00_setup.ipynb", work)  # JupyterLab may autosave: use a copy
    config = tmp_path / "config"
    (config / "labconfig").mkdir(parents=True)
    (config / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    port, token = _free_port(), "gpumem-browser-test"
    env = {k: v for k, v in os.environ.items() if k != "GPUMEM_QUIZ_MODE"}
    env |= {"JUPYTER_CONFIG_DIR": str(config), "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
            "GPUMEM_HOME": str(tmp_path / "home")}
    cmd = [sys.executable, "-m", "jupyter", "lab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={work}", "--allow-root"]
    log = open(tmp_path / "jupyter.log", "w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if time.time() > deadline or proc.poll() is not None:
                    raise RuntimeError("JupyterLab did not start: " + (tmp_path / "jupyter.log").read_text()[-2000:])
                time.sleep(0.5)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def test_run_setup_notebook_and_answer_a_quiz(lab_server, tmp_path):
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: .ci/run must install Debian's chromium")
        pytest.skip("chromium not installed (apt-get install chromium) — browser test skipped")
    from playwright.sync_api import TimeoutError as PlaywrightTimeout, sync_playwright

    base, token = lab_server
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(f"{base}/lab/tree/00_setup.ipynb?token={token}")
            try:  # a fresh JupyterLab may ask which kernel to start
                page.locator('.jp-Dialog button:has-text("Select")').click(timeout=15_000)
            except PlaywrightTimeout:
                pass
            page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=60_000)
            page.click('.lm-MenuBar-itemLabel:text-is("Run")')
            page.click('.lm-Menu-itemLabel:text-is("Run All Cells")')
            # .last: JupyterLab can hold a second, hidden view of the same output
            question = page.locator(".gpumem-question-cpu-real").last
            question.wait_for(timeout=90_000)
            question.get_by_text("Real DeepSpeed and PyTorch on CPU ranks", exact=False).click()
            question.get_by_role("button", name="Check").click()
            feedback = question.locator(".gpumem-feedback-cpu-real")
            feedback.get_by_text("Correct.").wait_for(timeout=20_000)
            assert "DeepSpeed runs for real" in feedback.inner_text()
            question.get_by_text("Nothing: every experiment needs CUDA").click()
            question.get_by_role("button", name="Check").click()
            feedback.get_by_text("Not quite").wait_for(timeout=20_000)
        finally:
            page.screenshot(path=str(tmp_path / "jupyterlab.png"), full_page=True)
            browser.close()
    saved = json.loads((tmp_path / "home" / "progress.json").read_text())
    assert saved["00_setup"]["cpu-real"] == {"correct": True, "attempts": 2}
