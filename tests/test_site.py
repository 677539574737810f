"""`make site`: the course book (Sphinx + MyST-NB + sphinx-book-theme) built from the executed
notebooks into a temporary folder by tools/build_site.py, as `make site` runs it, with the network
cut (unshare -n) where the machine allows it.

Checked here: it builds in under a minute of CPU time; every executed notebook has its page with
the outputs nbval compares; the sidebar lists the chapters by title and pages link prev/next by
title; headings carry anchors; Sphinx's search index covers every chapter; no page, stylesheet
or script loads anything from the network; each chapter's quiz is on its page as JSON whose
answers are the library's for the same seed (and, for one question, a hand conversion); the
widgets' cells say what the widget does. The browser tier (tests/test_browser.py) is not needed.
"""

import html
import importlib.util
import json
import re
import resource
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser

import pytest

from conftest import ROOT
from gpumem.course import answers, catalog, site, site_quiz

spec = importlib.util.spec_from_file_location("build_site", ROOT / "tools" / "build_site.py")
build_site = importlib.util.module_from_spec(spec)
spec.loader.exec_module(build_site)

NOTEBOOKS = site.chapter_notebooks()
TIMING = {}
# Sphinx 9 warns about its own API in MyST-Parser 5.2's reference resolver; not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated. Check CHANGES for Sphinx API")


def _cpu() -> float:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _can_cut_the_network() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "-n", "true"], capture_output=True).returncode == 0


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    """The book as `make site` builds it (tools/build_site.py), in a network namespace of its own
    (no network at all) where this machine allows one; the quizzes are drawn first (or read from
    .cache/site-quiz/ when the library is unchanged), so the timing is the book's build."""
    build_site.quiz_data()
    out = tmp_path_factory.mktemp("book") / "site"
    cmd = [sys.executable, str(ROOT / "tools" / "build_site.py"), "--out", str(out)]
    TIMING["offline"] = _can_cut_the_network()
    wall, cpu = time.perf_counter(), _cpu()
    proc = subprocess.run(["unshare", "-n", *cmd] if TIMING["offline"] else cmd, cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    TIMING.update(wall=time.perf_counter() - wall, cpu=_cpu() - cpu)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return out


def plain(page: str) -> str:
    """What a reader sees: tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def nb_title(path) -> str:
    """A notebook's first '# ' heading, read here from its JSON."""
    for cell in json.loads(path.read_text())["cells"]:
        for line in "".join(cell["source"]).splitlines():
            if cell["cell_type"] == "markdown" and line.startswith("# "):
                return line[2:].strip()
    raise AssertionError(f"{path.name} has no title")


def test_the_book_builds_in_under_a_minute(book):
    # CPU seconds (the build's process and Sphinx's workers): wall time on a shared machine swings
    # with its load (measured 18-51 s wall at load average 14 on 2 cores, for 5-12 s of CPU)
    print(f"book built in {TIMING['wall']:.1f} s wall, {TIMING['cpu']:.1f} s CPU")
    assert TIMING["cpu"] < 60
    assert (book / "index.html").exists() and (book / "search.html").exists()


def test_the_book_builds_with_the_network_off(book):
    if not TIMING["offline"]:
        pytest.skip("this machine cannot start a process without network (unshare -n); built with it")
    assert (book / "index.html").exists()           # the fixture's build ran under unshare -n


def test_there_are_chapter_notebooks():
    assert any(p.name == "00_setup.ipynb" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_chapter_page_holds_its_checked_outputs(book, path):
    page = (book / f"{path.stem}.html").read_text()
    text = plain(page)
    outputs = site.checked_outputs(path)
    assert outputs, f"{path.name} has no checked output"
    for out in outputs:
        for line in out.strip().splitlines():
            assert line.strip() in text, f"{path.name}: {line.strip()[:80]!r} not on its page"
    tagged = sum(1 for c in json.loads(path.read_text())["cells"]
                 if "nbval-check-output" in c.get("metadata", {}).get("tags", []))
    assert len(re.findall(r'class="[^"]*\btag_nbval-check-output\b', page)) == tagged


def test_sidebar_lists_the_chapters_by_title_and_pages_link_prev_next_by_title(book):
    index = (book / "index.html").read_text()
    nav = re.search(r'<nav class="[^"]*\bbd-docs-nav\b.*?</nav>', index, re.S).group(0)
    for path in NOTEBOOKS:
        title = html.escape(nb_title(path), quote=False)
        assert re.search(rf'href="{path.stem}\.html">\s*{re.escape(title)}\s*<', nav), path.stem
    for before, page, after in zip(NOTEBOOKS, NOTEBOOKS[1:], NOTEBOOKS[2:]):
        text = html.unescape((book / f"{page.stem}.html").read_text())
        assert f'rel="prev" title="{nb_title(before)}" href="{before.stem}.html"' in text
        assert f'rel="next" title="{nb_title(after)}" href="{after.stem}.html"' in text
        footer = re.findall(r'<p class="prev-next-title">([^<]*)</p>', text)      # what a reader sees
        assert footer == [nb_title(before), nb_title(after)], page.stem
    assert 'class="bd-sidebar-secondary' in (book / "02_zero.html").read_text()   # in-page contents


def test_index_is_the_chapter_map(book):
    index = (book / "index.html").read_text()
    present = {p.stem for p in NOTEBOOKS}
    for num, stem, note, what in catalog.CHAPTERS:
        name = f"{num}_{stem}"
        if name in present:
            assert f'href="{name}.html"' in index
        else:
            assert f"{name} (not written yet)" in plain(index)
        assert what in plain(index)
    assert "The note: the Chinese study note" in plain(index)


def test_headings_are_linkable(book):
    path = next(p for p in NOTEBOOKS if p.stem.startswith("02"))
    page = (book / f"{path.stem}.html").read_text()
    headings = [line for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown"
                for line in "".join(c["source"]).splitlines() if re.match(r"#{1,3} ", line)]
    anchors = re.findall(r'<a class="headerlink" href="#([\w-]+)"', page)
    assert len(anchors) >= len(headings) and all(f'id="{a}"' in page for a in anchors)


def test_search_index_covers_every_chapter(book):
    text = (book / "searchindex.js").read_text()
    index = json.loads(text[text.index("(") + 1:text.rindex(")")])
    for path in NOTEBOOKS:
        assert nb_title(path) in index["titles"]
    # a word of chapter 05's title and text, stemmed as Sphinx's English stemmer stems it ("offload")
    docs = []
    for table in (index["terms"], index["titleterms"]):
        found = table.get("offload", [])
        docs += found if isinstance(found, list) else [found]
    assert index["docnames"].index("05_offload") in docs
    assert (book / "_static" / "searchtools.js").exists()


class _Fetches(HTMLParser):
    """Every address a page's tags would load: script/img/iframe/source/audio/video src and
    link href (stylesheets, icons, preloads); plain <a href> links are not loads."""
    def __init__(self):
        super().__init__()
        self.loads = []

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag in ("script", "img", "iframe", "source", "audio", "video", "embed") and a.get("src"):
            self.loads.append(a["src"])
        if tag == "link" and a.get("href"):
            self.loads.append(a["href"])


def test_pages_load_nothing_from_the_network(book):
    pages = sorted(p for p in book.rglob("*.html") if "_static" not in p.parts)   # not the theme's macros
    assert len(pages) >= len(NOTEBOOKS) + 1
    for page in pages:
        parser = _Fetches()
        text = page.read_text()
        parser.feed(text)
        remote = [u for u in parser.loads if re.match(r"(https?:)?//", u.strip(), re.I)]
        assert remote == [], page.name
        # nor a script that would add one (MathJax's or require.js's file, a CDN's address)
        assert not re.search(r"tex-(svg|chtml|mml)|require(\.min)?\.js|unpkg\.com|jsdelivr|cdnjs|googleapis",
                             text, re.I), page.name
        assert 'name="viewport" content="width=device-width' in text, page.name   # fits a phone's width
    assert site.remote_assets(book) == {}            # pages, stylesheets and scripts alike


def test_the_network_check_can_fail():
    bad = ('<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex.js"></script>'
           '<link rel="stylesheet" href="//fonts.googleapis.com/css?family=Roboto">'
           '<style>@import "https://x.org/a.css"; b { background: url(https://x.org/i.png) }</style>'
           '<a href="https://arxiv.org/abs/1910.02054">ZeRO</a><img src="data:image/png;base64,AAAA">')
    assert len(site.external_assets(bad)) == 4


@pytest.fixture(scope="module")
def chapter_quizzes():
    from gpumem.chapters import quizzes
    return {q.name: q for q in quizzes()}


def test_each_chapter_page_carries_its_quiz_and_not_the_text_dump(book, chapter_quizzes):
    for name, quiz in chapter_quizzes.items():
        page = (book / f"{name}.html").read_text()
        shown = set(re.findall(r'class="gq-question" data-qid="([^"]+)"', page))
        assert shown == {q.id for q in quiz.questions}, name
        assert page.count("function show_questions(") == 1, name      # jupyterquiz inlined, once
        assert "function gqRead(" in page and "Answer with quiz.answer(" not in page, name


def test_quiz_json_holds_the_librarys_answers_for_the_same_seed(book, chapter_quizzes):
    for name, quiz in chapter_quizzes.items():
        pools = json.loads((book / "_static" / "quiz" / f"{name}.json").read_text())
        assert set(pools) == {q.id for q in quiz.questions}
        quiz.seed(site_quiz.seed_of(0))
        for q in quiz.questions:
            first = pools[q.id][0]
            assert first["gpumem"]["seed"] == site_quiz.seed_of(0)
            assert html.unescape(first["question"]).endswith(q.prompt_text()), q.id
            if first["type"] == "numeric":
                right = first["answers"][0]
                lo, hi = right.get("range") or (right["value"], right["value"])
                assert right["correct"] and lo <= q.value() <= hi, q.id
                width = hi - lo                  # the range's edges are the library's: in just inside, out outside
                assert q.grade(lo + width * 0.01) and q.grade(hi - width * 0.01), q.id
                step = width * 0.05 or max(1.0, abs(lo) * 0.01)
                assert not q.grade(lo - step) and not q.grade(hi + step), q.id
                assert first["gpumem"]["unit"] == q.unit_now()
            else:
                assert [a["correct"] for a in first["answers"]].index(True) == q.answer, q.id
        drawn = [q for q in quiz.questions if q.drawn]
        assert all(len(pools[q.id]) >= 2 for q in drawn[:1]), f"{name}: one variant only"


def test_a_quiz_answer_checked_by_hand(book):
    """Chapter 00's capacity question, every variant: MiB x 2^20 bytes, over 10^9 (GB) or 2^30 (GiB)."""
    pools = json.loads((book / "_static" / "quiz" / "00_setup.json").read_text())
    assert len(pools["capacity-units"]) >= 2
    for variant in pools["capacity-units"]:
        mib = int(re.search(r"= ([\d,]+) MiB", variant["question"]).group(1).replace(",", ""))
        unit = variant["gpumem"]["unit"]
        want = mib * 2**20 / (10**9 if unit == "GB" else 2**30)
        lo, hi = variant["answers"][0]["range"]
        assert lo <= want <= hi and hi - lo < 0.11


def test_widget_cells_say_what_the_widget_does(book):
    for path in NOTEBOOKS:
        cells = json.loads(path.read_text())["cells"]
        widgets = [c for c in cells if c["cell_type"] == "code" and site.WIDGET_CELL.search("".join(c["source"]))]
        page = (book / f"{path.stem}.html").read_text()
        assert page.count("Interactive in JupyterLab.") == len(widgets), path.name
        for cell in widgets:             # the computed example is on the page below the note
            first = next(o for o in cell["outputs"] if o.get("text"))["text"]
            first = ("".join(first) if isinstance(first, list) else first).splitlines()[0].strip()
            assert first in plain(page), path.name


CASES = [("85.52 GB", "GiB", 85.52e9 / 2**30), ("1,129 GB", "GB", 1129.0), ("3.75 bytes/param", "B", 3.75),
         ("250 ms", "s", 0.25), ("12 GPUs", "GPUs", 12.0), ("2.5 GiB", "GB", 2.5 * 2**30 / 1e9),
         ("~40 %", "%", 40.0), ("7", "GB", 7.0), ("5 parsecs", "GiB", None), ("3 GB", "GPUs", None)]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed (the browser test covers this)")
def test_quiz_js_reads_units_as_the_notebook_does():
    """site/_static/quiz.js's gqRead against hand conversions and the library's to_unit."""
    js = (ROOT / "site" / "_static" / "quiz.js").read_text()
    calls = ";".join(f"out.push(gqRead({json.dumps(t)}, {json.dumps(u)}, 'x'))" for t, u, _ in CASES)
    proc = subprocess.run(["node", "-e", f"{js}\nvar out=[];{calls};console.log(JSON.stringify(out))"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    for (text, unit, want), got in zip(CASES, json.loads(proc.stdout)):
        if want is None:
            assert "error" in got, text
            with pytest.raises(Exception):
                answers.to_unit(text, unit)
        else:
            assert got["value"] == pytest.approx(want, rel=1e-12), text
            assert got["value"] == pytest.approx(answers.to_unit(text, unit)[0], rel=1e-12), text
            assert got["note"] == answers.to_unit(text, unit)[1], text
