"""`make site`: the executed notebooks as a book (Sphinx + MyST-NB + sphinx-book-theme), offline.

    python tools/build_site.py [--out DIR]          # default .cache/site; open DIR/index.html

The book is built from the notebooks' stored outputs, never re-run (``nb_execution_mode =
"off"`` in ``site/conf.py``): chapters in the sidebar by title, the chapter map on the index,
labs and their solutions as appendices, Sphinx's own full-text search (an index file read in the
browser), headings with anchors, previous/next by title. The generated source folder sits next
to the output (``.site-src``) and is rewritten only where a file changed, so Sphinx rebuilds only
the pages whose notebook changed.

What needs a kernel is replaced on the page: a chapter's quiz cell by its quiz, answered in the
browser (:mod:`gpumem.course.site_quiz`, jupyterquiz and ``site/_static/quiz.js`` inlined); an
interactive widget's cell gets a stand-in that says what the widget does above the example the
library computed when the notebook ran. Nothing is loaded from the network, at build or read
time: :func:`external_assets` lists anything a page would fetch; the build fails if there is any.
"""

import html
import json
import re
import time
from pathlib import Path

from . import catalog, site_quiz

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / ".cache" / "site"
CONF = ROOT / "site"
CHECKED = "nbval-check-output"
SCRIPTED = ("application/vnd.jupyter.widget-view+json", "application/javascript")
QUIZ_CELL = re.compile(r"^\s*quiz\.show\(\)\s*$", re.M)
CHECKLIST_CELL = re.compile(r"""checklist\.show\(\s*["'](\w+)["']\s*\)""")
STANDINS = {
    "scenario_explorer": "dropdowns and sliders (model, recipe, sequence length, micro-batch, GPU "
                         "count, GPU, checkpointing, attention kernel) that redraw the box below on "
                         "every change: what one training step holds on each GPU, and whether it fits",
    "planner_widget": "controls (model, GPU, GPU count, sequence length, global batch, CPU Adam "
                      "speed) that re-run the planner on every change: the layouts that fit, ranked by "
                      "step time, with their memory and time bars",
}
WIDGET_CELL = re.compile(r"\b(" + "|".join(STANDINS) + r")\(")


def executed(path: Path) -> bool:
    """Whether a notebook has been run (some code cell carries an execution count)."""
    cells = json.loads(path.read_text())["cells"]
    return any(c["cell_type"] == "code" and c.get("execution_count") for c in cells)


def chapter_notebooks(root: Path = ROOT) -> list[Path]:
    """Every executed notebook under ``notebooks/``, in file-name (chapter) order."""
    return [p for p in sorted((root / "notebooks").glob("*.ipynb")) if executed(p)]


def appendix_notebooks(root: Path = ROOT) -> dict[str, list[Path]]:
    """The labs (to do, not executed) and their executed solutions, by appendix caption."""
    return {"Labs": sorted((root / "labs").glob("lab*.ipynb")),
            "Lab solutions": [p for p in sorted((root / "solutions").glob("lab*.ipynb")) if executed(p)]}


def title_of(nb: dict) -> str:
    """The notebook's first Markdown heading, else ''."""
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
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


def _html_output(text: str) -> dict:
    return {"output_type": "display_data", "metadata": {}, "data": {"text/html": text}}


def standin(name: str) -> str:
    """The note above a widget's stored example: what the widget does, and what is shown here."""
    return (f'<div class="gpumem-standin"><p><strong>Interactive in JupyterLab.</strong> This cell '
            f"shows {html.escape(STANDINS[name])}. On this page: one example, computed by the library "
            "when the notebook ran, for the values the cell starts from (its first lines name them).</p></div>")


def page_notebook(nb: dict, pools: dict | None, groups: dict | None, library_js: str = "") -> dict:
    """A notebook as the book shows it: widget views and JavaScript outputs dropped (the text
    kept), each quiz cell's output replaced by its quiz (``pools``: question id -> variants;
    ``groups``: checklist item -> question ids), each widget cell preceded by its stand-in."""
    nb = json.loads(json.dumps(nb))
    nb["metadata"].pop("widgets", None)
    first = True
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        outputs = []
        for out in cell.get("outputs", []):
            data = out.get("data")
            if data is not None:
                for mime in SCRIPTED:
                    data.pop(mime, None)
                if not data:
                    continue
            outputs.append(out)
        source = "".join(cell["source"])
        item = CHECKLIST_CELL.search(source)
        ids = (list(pools or {}) if QUIZ_CELL.search(source) else
               (groups or {}).get(item.group(1)) if item else None)
        widget = WIDGET_CELL.search(source)
        if ids and pools:
            chosen = {qid: pools[qid] for qid in ids if pools.get(qid)}
            key = item.group(1) if item else "all"
            outputs = [_html_output(site_quiz.html_block(key, chosen, library_js if first else ""))]
            first = False
        elif widget:
            outputs.insert(0, _html_output(standin(widget.group(1))))
        cell["outputs"] = outputs
    return nb


def _cell(text: str) -> str:
    return html.escape(text).replace("|", "\\|")


def index_body(pages: dict[str, str], titles: dict[str, str] | None = None) -> str:
    """The index in MyST Markdown: what the book is, and the chapter map as a table; ``pages``
    maps a notebook stem to its document name, ``titles`` a stem to its title."""
    titles = titles or {}
    rows, mapped = [], set()
    for num, stem, note, what in catalog.CHAPTERS:
        name = f"{num}_{stem}"
        mapped.add(name)
        link = (f"[{_cell(titles.get(name, name))}]({pages[name]}.ipynb)" if name in pages
                else f"{name} (not written yet)")
        rows.append(f"| {num} | {link} | {_cell(note)} | {_cell(what)} |")
    rows += [f"|  | [{_cell(titles.get(n, n))}]({pages[n]}.ipynb) |  |  |" for n in sorted(set(pages) - mapped)]
    return ("# Fitting 70B — GPU memory optimization for LLM training\n\n"
            "The course's notebooks as they were executed (outputs stored in the repository). Outputs "
            "with a green bar are the ones `make test-notebooks` compares. Each chapter's quiz runs here "
            "in your browser; an interactive widget shows what it does and one computed example. Search "
            "works offline (the box at the top left, or press `/`).\n\n"
            "<em>The note</em>: the Chinese study note on fitting 70B into GPU memory that the course "
            "grew from; each chapter tests its claims in a ledger (chapter 00 says more).\n\n"
            "| # | chapter | the note's section | what runs |\n|---|---|---|---|\n" + "\n".join(rows) + "\n")


def _toctree(caption: str, docs: list[str]) -> str:
    return "\n```{toctree}\n:caption: " + caption + "\n:hidden:\n:maxdepth: 1\n\n" + "\n".join(docs) + "\n```\n"


def _write(path: Path, text: str) -> None:
    """Write only when the text changed, so Sphinx sees an unchanged page as unchanged."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def library_js() -> str:
    """jupyterquiz's JavaScript (its files, as its own display_quiz joins them) and quiz.js, for
    inlining. jupyterquiz would load MathJax 3 from a CDN when a page's MathJax lacks typeset();
    the book has no MathJax, and that address is removed so it can never be fetched."""
    from importlib.resources import files
    js = files("jupyterquiz") / "js"
    parts = [f.read_text() for f in sorted(js.iterdir(), key=lambda f: f.name) if f.name.endswith(".js")]
    text = "\n".join(parts + [(CONF / "_static" / "quiz.js").read_text()])
    return re.sub(r"https://cdn\.jsdelivr\.net/[^'\"]*", "", text).replace("</script", "<\\/script")


def jupyterquiz_css() -> str:
    """jupyterquiz's stylesheet with its colour variables (display_quiz's defaults), for every question."""
    from importlib.resources import files
    colors = {"--jq-multiple-choice-bg": "#392061", "--jq-mc-button-bg": "#fafafa",
              "--jq-mc-button-border": "#e0e0e0e0", "--jq-mc-button-inset-shadow": "#555555",
              "--jq-numeric-bg": "#392061ff", "--jq-numeric-input-bg": "#c0c0c0",
              "--jq-numeric-input-label": "#101010", "--jq-numeric-input-shadow": "#999999",
              "--jq-incorrect-color": "#c80202", "--jq-correct-color": "#009113",
              "--jq-text-color": "#fafafa", "--jq-link-color": "#9abafa"}
    head = ".gq-question {\n" + "".join(f"  {k}: {v};\n" for k, v in colors.items()) + "}\n"
    tail = (".gq-question .Quiz, .gq-question .Feedback, .gq-question .InpLabel, .gq-question .Input-text "
            "{ font-size: 1rem; line-height: 1.45; }\n.gq-question .Feedback { text-align: left; }\n"
            ".gq-question .InpLabel { float: none; color: inherit; }\n")
    return head + (files("jupyterquiz") / "styles.css").read_text() + tail


def prepare(src: Path, root: Path, pools: dict, groups: dict) -> list[str]:
    """Write the book's source folder: conf.py, static files, the index and every page's
    notebook; returns the chapter document names."""
    _write(src / "conf.py", (CONF / "conf.py").read_text())
    for f in (CONF / "_static").iterdir():
        _write(src / "_static" / f.name, f.read_text())
    _write(src / "_static" / "jupyterquiz.css", jupyterquiz_css())
    for stem, chapter_pools in pools.items():      # each chapter's drawn variants, for readers and tests
        _write(src / "_static" / "quiz" / f"{stem}.json", json.dumps(chapter_pools, indent=1))
    js = library_js()
    chapters, titles = [], {}
    for path in chapter_notebooks(root):
        nb = json.loads(path.read_text())
        titles[path.stem] = title_of(nb) or path.stem
        page = page_notebook(nb, pools.get(path.stem), groups.get(path.stem), js)
        _write(src / path.name, json.dumps(page, indent=1, ensure_ascii=False))
        chapters.append(path.stem)
    text = index_body({c: c for c in chapters}, titles) + _toctree("Chapters", chapters)
    for caption, paths in appendix_notebooks(root).items():
        folder = "labs" if caption == "Labs" else "solutions"
        for path in paths:
            _write(src / folder / path.name, json.dumps(page_notebook(json.loads(path.read_text()), None, None),
                                                        indent=1, ensure_ascii=False))
        if paths:
            text += _toctree(caption, [f"{folder}/{p.stem}" for p in paths])
    _write(src / "index.md", text)
    return chapters


def build(out: Path = DEFAULT_OUT, root: Path = ROOT, pools: dict | None = None, groups: dict | None = None,
          quiet: bool = True) -> dict:
    """Build the book into ``out`` (``index.html`` and one page per notebook) from the stored
    outputs; ``pools``: chapter stem -> question id -> variants (``site_quiz.export``),
    ``groups``: chapter stem -> checklist item -> question ids. Returns what was built:
    ``chapters``, ``seconds`` and ``remote`` (what any page would fetch from the network)."""
    from sphinx.cmd.build import build_main
    start = time.perf_counter()
    out = Path(out).resolve()
    src, doctrees = out.parent / f".{out.name}-src", out.parent / f".{out.name}-doctrees"
    src.mkdir(parents=True, exist_ok=True)
    chapters = prepare(src, root, pools or {}, groups or {})
    args = ["-b", "html", "-d", str(doctrees), "-j", "2", str(src), str(out)] + (["-q"] if quiet else [])
    if build_main(args) != 0:
        raise RuntimeError(f"sphinx-build failed on {src}")
    return {"chapters": chapters, "seconds": time.perf_counter() - start, "remote": remote_assets(out)}


_ASSET = re.compile(r"""(?:\bsrc\s*=\s*["']?|<link\b[^>]*\bhref\s*=\s*["']?|url\(\s*["']?|@import\s+["']?)"""
                    r"""((?:https?:)?//[^"')\s>]+)""", re.IGNORECASE)


def external_assets(text: str) -> list[str]:
    """Every URL a page would fetch from the network (scripts, styles, images, fonts, imports).
    Plain hyperlinks a reader may click are not assets and are not listed."""
    return _ASSET.findall(text)


def remote_assets(out: Path) -> dict[str, list[str]]:
    """File (relative to ``out``) -> network URLs it would load, over every page, stylesheet and script."""
    found = {}
    for path in sorted(Path(out).rglob("*")):
        if path.suffix in (".html", ".css", ".js") and path.is_file():
            urls = external_assets(path.read_text(errors="replace"))
            if urls:
                found[str(path.relative_to(out))] = urls
    return found
