"""Real browser: JupyterLab started as ``make lab`` starts it, in headless Chromium.

The server runs the command the Makefile's ``lab`` target runs (read with ``make -n lab``),
rooted at a copy of the repository's notebooks, labs and solutions (JupyterLab may autosave).
The test opens the page ``make lab`` would open, runs 00_setup, answers its quiz through the
widgets (a hint first, the answer on the second wrong try, a unit converted, Show answer), and
then opens a lab from the file browser.
"""

import contextlib
import json
import os
import re
import shlex
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


def lab_command() -> list[str]:
    """The JupyterLab command of the Makefile's ``lab`` target, as a dry run prints it."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    dry = subprocess.run(["make", "--no-print-directory", "-n", "lab"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    lines = [line for line in dry.stdout.splitlines() if re.search(r"\bjupyter lab\b", line)]
    assert len(lines) == 1, dry.stdout + dry.stderr
    return shlex.split(lines[0])


def test_make_lab_roots_jupyterlab_at_the_repository():
    argv = lab_command()
    assert f"--ServerApp.root_dir={ROOT}" in argv, argv
    assert "notebooks/00_setup.ipynb" in argv, argv


@contextlib.contextmanager
def jupyter_lab(tmp_path, work, notebook: str | None = None, token: str = "gpumem-browser-test"):
    """JupyterLab as ``make lab`` starts it (the Makefile's command), rooted at the copy ``work``
    (opening ``notebooks/<notebook>`` instead of 00_setup when given), with no announcements
    prompt and a home of its own; yields the page ``make lab`` would open in the browser."""
    config = tmp_path / "config"
    (config / "labconfig").mkdir(parents=True)
    (config / "labconfig" / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    port, runtime = _free_port(), tmp_path / "runtime"
    env = {k: v for k, v in os.environ.items() if k not in ("GPUMEM_QUIZ_MODE", "GPUMEM_QUIZ_SEED", "MPLBACKEND")}
    env |= {"JUPYTER_CONFIG_DIR": str(config), "JUPYTER_RUNTIME_DIR": str(runtime),
            "GPUMEM_HOME": str(tmp_path / "home")}
    argv = lab_command()
    assert argv[0].endswith("jupyter") and argv[1] == "lab", argv
    args = [a.replace(str(ROOT), str(work)) for a in argv[1:]]
    if notebook:
        args = [a.replace("notebooks/00_setup.ipynb", f"notebooks/{notebook}") for a in args]
    cmd = [sys.executable, "-m", "jupyter", *args,
           "--no-browser", "--ip=127.0.0.1", f"--port={port}", f"--IdentityProvider.token={token}"]
    log = open(tmp_path / "jupyter.log", "w")
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                opened = list(runtime.glob("jpserver-file-to-run-*-open.html"))
                if opened:
                    break
            except OSError:
                pass
            if time.time() > deadline or proc.poll() is not None:
                raise RuntimeError("JupyterLab did not start: " + (tmp_path / "jupyter.log").read_text()[-2000:])
            time.sleep(0.5)
        # the page `make lab` opens in the browser: JupyterLab's redirect file for the path argument
        yield re.search(r'url=([^"]+)"', opened[0].read_text()).group(1).replace("&amp;", "&")
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def chromium(pw):
    """Headless Chromium (Debian's), quiet: no sync, no component updates, no first-run pages;
    skipped where it is not installed, failed in CI (.ci/run installs it)."""
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: .ci/run must install Debian's chromium")
        pytest.skip("chromium not installed (apt-get install chromium) — browser test skipped")
    return pw.chromium.launch(executable_path=CHROMIUM, args=[
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"])


def run_all_cells(page) -> None:
    """Once the kernel is idle: Run > Run All Cells, as a learner does."""
    _pick_kernel_if_asked(page)
    page.wait_for_selector('.jp-Notebook-ExecutionIndicator[data-status="idle"]', timeout=60_000)
    page.click('.lm-MenuBar-itemLabel:text-is("Run")')
    page.click('.lm-Menu-itemLabel:text-is("Run All Cells")')


@pytest.fixture
def lab_server(tmp_path):
    work = tmp_path / "repo"
    (work / "notebooks").mkdir(parents=True)
    shutil.copy(ROOT / "notebooks" / "00_setup.ipynb", work / "notebooks")
    for folder in ("labs", "solutions"):
        shutil.copytree(ROOT / folder, work / folder)
    with jupyter_lab(tmp_path, work) as url:
        yield url, work


def _pick_kernel_if_asked(page, timeout=15_000):
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    try:  # a fresh JupyterLab may ask which kernel to start
        page.locator('.jp-Dialog button:has-text("Select")').click(timeout=timeout)
    except PlaywrightTimeout:
        pass


def _answer_quiz(page):
    """Through the widgets: hint, then the answer; try again; a unit converted; Show answer."""
    question = page.locator(".gpumem-question-fewer-free-bytes").last   # .last: a hidden second view may exist
    question.wait_for(timeout=90_000)
    feedback = question.locator(".gpumem-feedback-fewer-free-bytes")
    check = question.get_by_role("button", name="Check")
    question.get_by_text("The CUDA context that the process created on the GPU", exact=True).click()
    check.click()
    feedback.get_by_text("Hint:").wait_for(timeout=20_000)
    assert "the answer is" not in feedback.inner_text()              # a hint, not the answer
    question.get_by_text("Tensors of another process on the same GPU", exact=True).click()
    check.click()
    feedback.get_by_text("the answer is PyTorch counting in GiB").wait_for(timeout=20_000)
    question.get_by_role("button", name="Try again").click()
    feedback.get_by_text("the answer is").wait_for(state="detached", timeout=20_000)   # a clean slate
    question.get_by_text("PyTorch counting in GiB where nvidia-smi counts in MiB", exact=True).click()
    check.click()
    feedback.get_by_text("Correct.").wait_for(timeout=20_000)
    assert "A unit changes how a number is written" in feedback.inner_text()

    capacity = page.locator(".gpumem-question-capacity-units").last
    prompt = capacity.locator(".gpumem-prompt-capacity-units").inner_text()
    mib = int(re.search(r"([\d,]+) MiB", prompt).group(1).replace(",", ""))
    unit = re.search(r"in (GiB|GB) \(", prompt).group(1)
    # answered in the other unit, by hand: MiB -> bytes -> GB or GiB
    other = f"{mib * 2**20 / 2**30:.3f} GiB" if unit == "GB" else f"{mib * 2**20 / 1e9:.3f} GB"
    capacity.locator("input").fill(other)
    capacity.get_by_role("button", name="Check").click()
    capacity.locator(".gpumem-feedback-capacity-units").get_by_text("read as").wait_for(timeout=20_000)
    assert capacity.locator(".gpumem-feedback-capacity-units").inner_text().startswith("Correct (")

    usable = page.locator(".gpumem-question-usable-bytes").last
    usable.get_by_role("button", name="Show answer").click()
    usable.locator(".gpumem-feedback-usable-bytes").get_by_text("The answer is").wait_for(timeout=20_000)


def _open_a_lab_from_the_file_browser(page):
    """The file browser reaches labs/ from the root; a lab notebook opens from it."""
    browser = page.locator(".jp-FileBrowser")
    if not browser.is_visible():
        page.locator('.jp-SideBar [data-id="filebrowser"]').click()
    browser.locator(".jp-BreadCrumbs-home").click()
    listing = browser.locator(".jp-DirListing")
    for folder in ("labs", "notebooks", "solutions"):
        listing.get_by_text(folder, exact=True).wait_for(timeout=20_000)
    listing.get_by_text("labs", exact=True).dblclick()
    lab = listing.get_by_text("lab01_memory_calculator.ipynb", exact=True)
    lab.wait_for(timeout=20_000)
    lab.dblclick()
    _pick_kernel_if_asked(page)
    page.locator('.lm-TabBar-tabLabel:text-is("lab01_memory_calculator.ipynb")').wait_for(timeout=30_000)
    page.get_by_text("A memory calculator you can trust").last.wait_for(timeout=30_000)


def test_run_setup_notebook_answer_the_quiz_and_open_a_lab(lab_server, tmp_path):
    from playwright.sync_api import sync_playwright

    url, work = lab_server
    assert "/lab/tree/notebooks/00_setup.ipynb" in url, url      # rooted at the repository
    with sync_playwright() as pw:
        browser = chromium(pw)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        try:
            page.goto(url)
            run_all_cells(page)
            _answer_quiz(page)
            _open_a_lab_from_the_file_browser(page)
        finally:
            page.screenshot(path=str(tmp_path / "jupyterlab.png"), full_page=True)
            browser.close()
    saved = json.loads((tmp_path / "home" / "progress.json").read_text())["00_setup"]
    assert saved["fewer-free-bytes"] == {"correct": True, "attempts": 3, "revealed": 1}
    assert saved["capacity-units"] == {"correct": True, "attempts": 1}
    assert saved["usable-bytes"] == {"correct": False, "attempts": 0, "revealed": 1}
