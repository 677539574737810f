"""Foundation: command-line contract, environment check, units, chapter map, Colab bootstrap."""

import json
import sys

import pytest

from conftest import ROOT, run_cli
from gpumem import units
from gpumem.course import catalog, envcheck
from gpumem.errors import UsageError


@pytest.mark.parametrize("args, names", [
    (["frobnicate"], "frobnicate"),
    (["check-env", "--colour"], "--colour"),
])
def test_bad_input_exits_2_with_one_line(args, names):
    proc = run_cli(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert names in lines[0] and "Traceback" not in proc.stderr


def test_help_lists_verbs():
    proc = run_cli("--help")
    assert proc.returncode == 0
    assert "check-env" in proc.stdout


def test_check_env_json_reports_every_component():
    proc = run_cli("check-env", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    names = {c["name"] for c in data["checks"]}
    assert {"python", "torch", "deepspeed", "cpu", "libaio", "chromium",
            "op deepspeed_shm_comm", "op cpu_adam", "op async_io"} <= names
    for c in data["checks"]:
        assert c["status"] in {"OK", "MISSING", "INFO"}
        if c["status"] == "MISSING":
            assert c["fix"], f"{c['name']} is MISSING without a fix"


def test_check_env_flags_a_missing_op_with_its_fix(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # an empty cache: nothing built
    rows = {c.name: c for c in envcheck.checks()}
    assert rows["op cpu_adam"].status == "MISSING"
    assert "dsops prepare" in rows["op cpu_adam"].fix


def test_units_label_and_parse():
    assert units.fmt(141e9) == "141.0 GB"
    assert units.fmt(2**30, "GiB") == "1.0 GiB"
    assert units.fmt_both(80 * 10**9) == "80.0 GB (74.5 GiB)"
    assert units.parse_size("80GB") == 80 * 10**9
    assert units.parse_size("80 GiB") == 80 * 2**30
    assert units.parse_size("0.5TB") == 5 * 10**11
    for bad in ["80XB", "", "-3GB", "0GB", "eighty"]:
        with pytest.raises(UsageError):
            units.parse_size(bad)


def test_chapter_map_names_every_stem():
    text = catalog.chapter_map()
    rows = [line for line in text.splitlines()[1:] if line[:2].isdigit()]
    assert len(rows) == len(catalog.CHAPTERS) and max(map(len, text.splitlines())) <= 100
    for num, stem, *_ in catalog.CHAPTERS:
        assert f"{num}_{stem}" in text


def test_colab_bootstrap_keeps_colabs_torch_and_does_nothing_elsewhere():
    sys.path.insert(0, str(ROOT / "env"))
    import colab_bootstrap
    reqs = colab_bootstrap.colab_requirements()
    assert not any(r.lower().startswith("torch==") for r in reqs)
    assert any(r.startswith("deepspeed==0.19.8") for r in reqs)
    assert not any(r.lower().startswith(("sphinx", "myst-nb", "jupyterquiz", "playwright")) for r in reqs)   # book/browser only
    assert "nothing to install" in colab_bootstrap.bootstrap()  # not on Colab here
    install_gpumem = colab_bootstrap.pip_commands()[1]
    assert install_gpumem[-2:] == ["-e", str(ROOT)]


def test_environment_report_names_no_machine_path():
    """The notebook stores this output: the checkout's folder appears as <course>, never its path."""
    from gpumem.chapters import ch00_setup
    text = ch00_setup.environment_report()
    assert str(ROOT) not in text
    assert "torch" in text and len(text.splitlines()) == len(envcheck.checks())


def test_make_lab_turns_off_jupyterlabs_news_prompt():
    """Issue 24 (8): JupyterLab 4 asks on first open whether to fetch Jupyter news. ``make lab``
    writes env/jupyterlab_overrides.json into the venv's settings overrides; the values are checked
    against JupyterLab's own schema for the notification plug-in."""
    import json
    import re
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    overrides = json.loads((root / "env/jupyterlab_overrides.json").read_text())
    plugin = overrides["@jupyterlab/apputils-extension:notification"]
    assert plugin == {"fetchNews": "false", "checkForUpdates": False}
    schema = Path(sys.prefix) / "share/jupyter/lab/schemas/@jupyterlab/apputils-extension/notification.json"
    props = json.loads(schema.read_text())["properties"]
    assert {"const": "false", "title": "Never"} in props["fetchNews"]["oneOf"]
    assert props["checkForUpdates"]["type"] == "boolean"
    make = (root / "Makefile").read_text()
    assert re.search(r"^lab: setup \$\(LAB_OVERRIDES\)", make, re.M)
    assert "LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json" in make


def test_the_note_is_introduced_once_in_chapter_00_and_on_the_index():
    """Issue 24 (7): every chapter says "the note"; chapter 00 says what it is, the index in a line."""
    import json
    from pathlib import Path
    from gpumem.course import site
    root = Path(__file__).resolve().parents[1]
    first = "".join(json.loads((root / "notebooks/00_setup.ipynb").read_text())["cells"][0]["source"])
    intro = first.split("**The note.**", 1)[1].split("\n\n", 1)[0]
    assert "study note" in intro and "claims ledger" in intro and "never need the note" in intro
    assert "<em>The note</em>: the Chinese study note" in site.index_body({})
