"""The course book in headless Chromium, every request outside the book's folder refused and
recorded: search finds a chapter, pages fit a phone's width, a quiz answered on the page gets the
library's feedback. Screenshots: .cache/screenshots/site-*.png (index, chapter, quiz, phone)."""

import importlib.util
import json
import os
import shutil

import pytest

from conftest import ROOT

pytestmark = [pytest.mark.browser,   # MyST-Parser 5.2 calls Sphinx 9 API that warns; not ours to fix
              pytest.mark.filterwarnings("ignore:.*is deprecated. Check CHANGES for Sphinx API")]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = ROOT / ".cache" / "screenshots"


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    spec = importlib.util.spec_from_file_location("build_site", ROOT / "tools" / "build_site.py")
    build_site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_site)
    out = tmp_path_factory.mktemp("book") / "site"
    assert build_site.main(["--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI: .ci/run must install Debian's chromium")
        pytest.skip("chromium not installed (apt-get install chromium) — browser test skipped")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, args=["--headless", "--no-sandbox", "--disable-gpu",
                                                               "--disable-background-networking"])
        yield b
        b.close()


@pytest.fixture
def offline(browser):
    """A page whose requests other than file:// are aborted; ``page.fetched`` lists them."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    fetched, errors = [], []
    ctx.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file://")
              else (fetched.append(r.request.url), r.abort()))
    page = ctx.new_page()
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.fetched, page.errors = fetched, errors
    yield page
    ctx.close()
    assert fetched == [], f"the book asked the network for {fetched}"
    assert errors == [], errors


def test_search_finds_a_chapter_offline(book, offline):
    SHOTS.mkdir(parents=True, exist_ok=True)
    offline.goto(f"file://{book}/index.html")
    offline.screenshot(path=str(SHOTS / "site-index.png"))
    offline.goto(f"file://{book}/search.html?q=nvme")
    offline.wait_for_selector("#search-results li a", timeout=30_000)
    titles = offline.locator("#search-results li a").all_inner_texts()
    assert any(t.startswith("05 · CPU and NVMe offload") for t in titles), titles


def test_pages_fit_a_phone(book, offline):
    offline.set_viewport_size({"width": 390, "height": 844})
    for page in sorted(book.glob("0*.html")):
        offline.goto(f"file://{page}")
        wide = offline.evaluate("document.documentElement.scrollWidth - window.innerWidth")
        assert wide <= 0, f"{page.name} scrolls sideways by {wide}px at phone width"
        # what is wider than the column scrolls inside its own block
        spill = offline.evaluate("""[...document.querySelectorAll('article *')].filter(e =>
            e.getBoundingClientRect().right > window.innerWidth + 1
            && !e.closest('pre, .highlight, .cell_output, table'))
            .map(e => e.tagName + '.' + e.className).slice(0, 5)""")
        assert spill == [], f"{page.name}: {spill}"
    offline.goto(f"file://{book}/02_zero.html")
    offline.screenshot(path=str(SHOTS / "site-phone.png"))


def test_a_quiz_answered_on_the_page(book, offline):
    pools = json.loads((book / "_static" / "quiz" / "00_setup.json").read_text())
    offline.goto(f"file://{book}/00_setup.html")
    box = offline.locator('.gq-question[data-qid="capacity-units"]')
    box.locator("input.Input-text").wait_for(timeout=15_000)
    variant = pools["capacity-units"][int(box.get_attribute("data-variant"))]["gpumem"]
    entry, feedback = box.locator("input.Input-text"), box.locator(".Feedback")
    entry.fill("1 GiB")
    entry.press("Enter")
    assert feedback.inner_text().startswith("Not quite. Hint:")
    other = "GB" if variant["unit"] == "GiB" else "GiB"      # the right size in the other unit, converted
    size = variant["value"] * (2**30 if variant["unit"] == "GiB" else 10**9) / (2**30 if other == "GiB" else 10**9)
    entry.fill(f"{size:.3f} {other}")
    entry.press("Enter")
    text = feedback.inner_text()
    assert text.startswith("Correct.") and f"read as" in text, text
    entry.fill("3 parsecs")
    entry.press("Enter")
    assert "is not one of B, KB" in feedback.inner_text()
    box.locator("summary").click()
    assert variant["answer"] in box.locator("details.gq-answer").inner_text()
    offline.locator(".gq-quiz").first.scroll_into_view_if_needed()
    offline.screenshot(path=str(SHOTS / "site-quiz.png"))
    before = box.locator(".Quiz").inner_text()
    box.locator("button.gq-new").click()
    assert box.locator(".Quiz").inner_text() != before                # another draw
    choice = offline.locator('.gq-question[data-qid="fewer-free-bytes"]')
    right = next(i for i, a in enumerate(pools["fewer-free-bytes"][0]["answers"]) if a["correct"])
    choice.locator("label").nth(right).click()
    assert choice.locator(".Feedback").inner_text().startswith("Correct.")
    offline.goto(f"file://{book}/02_zero.html")
    offline.screenshot(path=str(SHOTS / "site-chapter.png"))


def _cjk_fonts_installed() -> bool:
    import subprocess
    fc = shutil.which("fc-list")
    return bool(fc and subprocess.run([fc, ":lang=zh", "family"], capture_output=True, text=True).stdout.strip())


def test_chinese_glosses_render_in_a_cjk_font(book, offline):
    """The note's terms are glossed in Chinese (chapter 00 onward): Chromium draws them with a CJK
    font, not empty boxes. Which font drew the text comes from Chromium itself (DevTools'
    CSS.getPlatformFontsForNode). CI installs Debian's fonts-noto-cjk (.ci/run)."""
    if not _cjk_fonts_installed():
        if os.environ.get("CI"):
            pytest.fail("no CJK font in CI: .ci/run must install Debian's fonts-noto-cjk")
        pytest.skip("no CJK font installed (apt-get install fonts-noto-cjk): glosses would show as boxes")
    offline.goto(f"file://{book}/00_setup.html")
    found = offline.evaluate("""() => {
        const cjk = /[\\u4e00-\\u9fff]/;
        const el = [...document.querySelectorAll('article p, article li, article td')]
            .find(e => cjk.test(e.textContent));
        if (!el) return null;
        el.id = el.id || 'gpumem-cjk-probe';
        return [el.id, el.textContent.match(/[\\u4e00-\\u9fff]+/)[0]];
    }""")
    assert found, "chapter 00 has no Chinese gloss in a paragraph, list or table"
    cdp = offline.context.new_cdp_session(offline)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument")["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": f"#{found[0]}"})["nodeId"]
    fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]
    families = [f["familyName"] for f in fonts]
    assert any("CJK" in name for name in families), (found[1], families)
    offline.locator(f"#{found[0]}").screenshot(path=str(SHOTS / "site-cjk-gloss.png"))
