"""nbval compares only the cells tagged ``nbval-check-output``: prove every one has a stored output,
and that no marker comment is left for a learner to read past."""

import json

import pytest

from conftest import ROOT, cell_output

NOTEBOOKS = sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb")])
TAG = "nbval-check-output"


def checked(cells):
    return [c for c in cells if c["cell_type"] == "code" and TAG in c.get("metadata", {}).get("tags", [])]


def test_there_are_notebooks():
    assert any(p.name == "00_setup.ipynb" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_checked_cell_has_a_stored_output(path):
    cells = json.loads(path.read_text())["cells"]
    marked = checked(cells)
    assert marked, f"{path.name} has no cell tagged {TAG}: nbval would compare nothing"
    for cell in marked:
        assert cell["execution_count"] is not None and cell["outputs"], "".join(cell["source"])[:80]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_marker_comments_in_cells(path):
    """Markers live in cell tags (tools/execute_notebooks.py moves `# NBVAL_CHECK_OUTPUT` there)."""
    for cell in json.loads(path.read_text())["cells"]:
        assert "NBVAL_" not in "".join(cell["source"]), "".join(cell["source"])[:80]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_error_outputs_stored(path):
    cells = json.loads(path.read_text())["cells"]
    for cell in cells:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", "".join(cell["source"])[:80]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_outputs_are_clean(path):
    """What a reader sees on GitHub: no warning walls, progress bars, enum reprs or build paths."""
    bad = ("[WARNING]", "OffloadDeviceEnum", "/root/", "/work/", "/tmp/", "it/s]", "FutureWarning")
    for cell in json.loads(path.read_text())["cells"]:
        for out in cell.get("outputs", []):
            text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
            for b in bad:
                assert b not in text, f"{path.name}: {b!r} in the output of {''.join(cell['source'])[:60]!r}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_checked_outputs_fit_100_columns_and_plots_are_pictures(path):
    """Issue 17: GitHub and the site wrap a table wider than 100 characters, and a plot stores a
    picture, never matplotlib's "<Figure size ...>" text beside it."""
    cells = json.loads(path.read_text())["cells"]
    for cell in cells:
        if cell["cell_type"] == "code":
            assert "<Figure size" not in cell_output(cell), "".join(cell["source"])[:80]
    for cell in checked(cells):
        wide = [line for line in cell_output(cell).splitlines() if len(line) > 100]
        assert not wide, f"{len(wide[0])} columns: {wide[0][:80]}"
