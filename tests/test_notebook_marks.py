"""nbval never compares a marked cell that has no stored output: prove every one has one."""

import json

import pytest

from conftest import ROOT

NOTEBOOKS = sorted([*ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("solutions/*.ipynb")])


def test_there_are_notebooks():
    assert any(p.name == "00_setup.ipynb" for p in NOTEBOOKS)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_checked_cell_has_a_stored_output(path):
    cells = json.loads(path.read_text())["cells"]
    marked = [c for c in cells if c["cell_type"] == "code" and "NBVAL_CHECK_OUTPUT" in "".join(c["source"])]
    assert marked, f"{path.name} has no NBVAL_CHECK_OUTPUT cell: nbval would compare nothing"
    for cell in marked:
        assert cell["execution_count"] is not None and cell["outputs"], "".join(cell["source"])[:80]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_error_outputs_stored(path):
    cells = json.loads(path.read_text())["cells"]
    for cell in cells:
        for out in cell.get("outputs", []):
            assert out.get("output_type") != "error", "".join(cell["source"])[:80]
