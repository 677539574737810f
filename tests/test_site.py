"""`make site`: build the book into a temporary folder; every executed notebook has its page, the
index is the chapter map, each page holds the text of its nbval-checked outputs (the diagrams and
tables the tests compare), and no page loads anything from the network."""

import html
import re

import pytest

from conftest import ROOT
from gpumem.course import catalog, site


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    site.build(out, progress=False)
    return out


def plain(page: str) -> str:
    """What a reader sees: tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]+>", "", page))


NOTEBOOKS = site.chapter_notebooks()


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
    assert page.count("code_cell checked") == sum(
        1 for c in __import__("json").loads(path.read_text())["cells"]
        if "nbval-check-output" in c.get("metadata", {}).get("tags", []))


def test_index_is_the_chapter_map(book):
    index = (book / "index.html").read_text()
    present = {p.stem for p in NOTEBOOKS}
    for num, stem, note, what in catalog.CHAPTERS:
        name = f"{num}_{stem}"
        if name in present:
            assert f'href="{name}.html"' in index
        else:
            assert f"{name} (not written yet)" in plain(index)
        assert html.escape(what) in index


def test_pages_load_nothing_from_the_network(book):
    for page in book.glob("*.html"):
        text = page.read_text()
        assert site.external_assets(text) == [], page.name
        assert "<script" not in text, page.name


def test_the_network_check_can_fail():
    bad = ('<script src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex.js"></script>'
           '<link rel="stylesheet" href="//fonts.googleapis.com/css?family=Roboto">'
           '<style>@import "https://x.org/a.css"; b { background: url(https://x.org/i.png) }</style>'
           '<a href="https://arxiv.org/abs/1910.02054">ZeRO</a><img src="data:image/png;base64,AAAA">')
    assert len(site.external_assets(bad)) == 4


def test_make_site_builds_from_the_command_line(tmp_path):
    import subprocess
    import sys
    proc = subprocess.run([sys.executable, "-m", "gpumem.course.site", "--out", str(tmp_path / "b")], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env={**__import__("os").environ,
                                                                            "TQDM_DISABLE": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "b" / "index.html").exists()
