"""`make site`: the executed notebooks as a static HTML book that works offline.

    python -m gpumem.course.site [--out DIR]        # default .cache/site; open DIR/index.html

The index is the chapter map (:mod:`gpumem.course.catalog`): each chapter links to its page when
its notebook is present and executed, and says "not written yet" otherwise; a notebook present
but not in the map gets a page too. Pages are nbconvert's ``basic`` template (cells only, no
scripts) inside one small page of our own with inline CSS, so nothing is fetched from the
network: no CDN, no web fonts, no MathJax (formulas show as their TeX source), figures embedded
as data URIs. :func:`external_assets` finds anything a page would load from elsewhere; the test
requires there be none.
"""

import argparse
import html
import json
import os
import re
from pathlib import Path

from gpumem.course import catalog

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / ".cache" / "site"
CHECKED = "nbval-check-output"

CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0; color: #1b1f24; }
header, footer { background: #f3f4f6; padding: .6em 2em; }
header a, footer a { margin-right: 1.2em; }
main { max-width: 62em; margin: 0 auto; padding: 1em 2em 3em; line-height: 1.5; }
pre, code { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: .88em; }
pre { overflow-x: auto; padding: .6em .8em; margin: .3em 0; }
.jp-InputArea pre, .input_area pre { background: #f6f8fa; border-left: 3px solid #9ca3af; }
.jp-OutputArea pre, .output_area pre { background: #fff; border-left: 3px solid #d1d5db; }
.checked pre { border-left-color: #16a34a; }
.jp-InputPrompt, .jp-OutputPrompt, .prompt { display: none; }
img { max-width: 100%; }
table { border-collapse: collapse; } td, th { border: 1px solid #d1d5db; padding: .2em .6em; }
.map td:first-child { font-weight: bold; } .missing { color: #6b7280; }
"""


def executed(path: Path) -> bool:
    """Whether a notebook has been run (some code cell carries an execution count)."""
    cells = json.loads(path.read_text())["cells"]
    return any(c["cell_type"] == "code" and c.get("execution_count") for c in cells)


def chapter_notebooks(root: Path = ROOT) -> list[Path]:
    """Every executed notebook under ``notebooks/``, in file-name (chapter) order."""
    return [p for p in sorted((root / "notebooks").glob("*.ipynb")) if executed(p)]


def title_of(nb) -> str:
    """The notebook's first Markdown heading, else its file stem."""
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            for line in cell.source.splitlines():
                if line.startswith("#"):
                    return line.lstrip("#").strip()
    return ""


def checked_outputs(path: Path) -> list[str]:
    """The text outputs of the cells tagged nbval-check-output (what nbval compares)."""
    texts = []
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code" and CHECKED in cell.get("metadata", {}).get("tags", []):
            for out in cell.get("outputs", []):
                text = out.get("text") or out.get("data", {}).get("text/plain", "")
                text = "".join(text) if isinstance(text, list) else text
                if text.strip():
                    texts.append(text)
    return texts


def _pygments_css() -> str:
    from pygments.formatters import HtmlFormatter
    return HtmlFormatter(style="default").get_style_defs(".highlight")


def render_body(path: Path) -> tuple[str, str]:
    """(title, HTML of the cells) for one notebook, through nbconvert's ``basic`` template.
    Checked cells get the class ``checked`` so a reader sees which outputs the tests compare."""
    import nbformat
    from nbconvert import HTMLExporter
    nb = _static(nbformat.read(path, as_version=4))
    exporter = HTMLExporter(template_name="basic")
    exporter.exclude_anchor_links = True
    body, _ = exporter.from_notebook_node(nb)
    return title_of(nb) or path.stem, _mark_checked(body, nb)


SCRIPTED = ("application/vnd.jupyter.widget-view+json", "application/javascript")


def _static(nb):
    """Drop what needs a live kernel or JavaScript (widget views and state, JS outputs); the
    widget's text fallback, when it has one, is kept."""
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        kept = []
        for out in cell.get("outputs", []):
            data = out.get("data")
            if data is not None:
                for mime in SCRIPTED:
                    data.pop(mime, None)
                if not data:
                    continue
            kept.append(out)
        if cell.cell_type == "code":
            cell.outputs = kept
    return nb


def _mark_checked(body: str, nb) -> str:
    # nbconvert's basic template emits cells in order as <div class="cell ... code_cell ...">;
    # add "checked" to the code cells tagged nbval-check-output.
    flags = iter([CHECKED in c.get("metadata", {}).get("tags", []) for c in nb.cells if c.cell_type == "code"])

    def mark(m: re.Match) -> str:
        return m.group(0).replace("code_cell", "code_cell checked", 1) if next(flags, False) else m.group(0)
    return re.sub(r'<div class="cell [^"]*code_cell[^"]*"', mark, body)


def page(title: str, body: str, nav: str) -> str:
    """One complete HTML page: our CSS inline, the navigation above and below the body."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html.escape(title)} · Fitting 70B</title>\n"
            f"<style>{CSS}\n{_pygments_css()}</style></head>\n"
            f"<body><header>{nav}</header><main>\n{body}\n</main><footer>{nav}</footer></body></html>\n")


def index_body(pages: dict[str, str]) -> str:
    """The chapter map as a table; ``pages`` maps a notebook stem to its page's file name."""
    rows = []
    mapped = set()
    for num, stem, note, what in catalog.CHAPTERS:
        name = f"{num}_{stem}"
        mapped.add(name)
        link = (f'<a href="{pages[name]}">{html.escape(name)}</a>' if name in pages
                else f'<span class="missing">{html.escape(name)} (not written yet)</span>')
        rows.append(f"<tr><td>{num}</td><td>{link}</td><td>{html.escape(note)}</td><td>{html.escape(what)}</td></tr>")
    for name in sorted(set(pages) - mapped):
        rows.append(f'<tr><td></td><td><a href="{pages[name]}">{html.escape(name)}</a></td><td></td><td></td></tr>')
    return ("<h1>Fitting 70B — GPU memory optimization for LLM training</h1>\n"
            "<p>The course's notebooks as they were executed (outputs stored in the repository). "
            "Outputs with a green bar are the ones <code>make test-notebooks</code> compares.</p>"
            "<p><em>The note</em>: the Chinese study note on fitting 70B into GPU memory that the course "
            "grew from; each chapter tests its claims in a ledger (chapter 00 says more).</p>\n"
            '<table class="map"><tr><th>#</th><th>notebook</th><th>the note\'s section</th><th>what runs</th></tr>\n'
            + "\n".join(rows) + "</table>\n")


def build(out: Path = DEFAULT_OUT, root: Path = ROOT, progress: bool = True) -> list[Path]:
    """Write ``index.html`` and one page per executed notebook into ``out``; returns the pages."""
    from tqdm.auto import tqdm
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    notebooks = chapter_notebooks(root)
    pages = {p.stem: f"{p.stem}.html" for p in notebooks}
    written = []
    quiet = not progress or bool(os.environ.get("TQDM_DISABLE"))
    for i, path in enumerate(tqdm(notebooks, desc="site", unit="notebook", disable=quiet)):
        title, body = render_body(path)
        links = ['<a href="index.html">contents</a>']
        if i > 0:
            links.append(f'<a href="{pages[notebooks[i - 1].stem]}">&larr; {notebooks[i - 1].stem}</a>')
        if i + 1 < len(notebooks):
            links.append(f'<a href="{pages[notebooks[i + 1].stem]}">{notebooks[i + 1].stem} &rarr;</a>')
        target = out / pages[path.stem]
        target.write_text(page(title, body, " ".join(links)))
        written.append(target)
    index = out / "index.html"
    index.write_text(page("Contents", index_body(pages), '<a href="index.html">contents</a>'))
    return [index, *written]


_ASSET = re.compile(r"""(?:\bsrc\s*=\s*["']?|<link\b[^>]*\bhref\s*=\s*["']?|url\(\s*["']?|@import\s+["']?)"""
                    r"""((?:https?:)?//[^"')\s>]+)""", re.IGNORECASE)


def external_assets(text: str) -> list[str]:
    """Every URL a page would fetch from the network (scripts, styles, images, fonts, imports).
    Plain hyperlinks a reader may click are not assets and are not listed."""
    return _ASSET.findall(text)


def main(argv: list[str] | None = None) -> int:
    """Command line: build the site, check it loads nothing from the network, print where it is."""
    parser = argparse.ArgumentParser(description="Build the course's static HTML book (offline).")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder (default .cache/site)")
    args = parser.parse_args(argv)
    written = build(args.out)
    remote = {url for p in written for url in external_assets(p.read_text())}
    if remote:
        print("pages would load from the network:", ", ".join(sorted(remote)))
        return 1
    print(f"wrote {len(written) - 1} chapter pages and the index: {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
