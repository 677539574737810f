"""The committed GPU results (gpumem.course.gpu_results) and `make gpu-check` (tools/gpu_check.py).

No GPU exists here: the results files below are written by the tests themselves in a temporary
folder, and the tool is checked for what it must do on a CPU machine (every GPU item skipped
with its reason, exit 0, no results file written as if measured)."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT
from gpumem.course import gpu_results
from gpumem.errors import UsageError


def run_file(**over):
    data = {"date": "2026-11-30", "gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 1, "driver": "570.86.15",
            "cuda": "12.8", "torch": "2.13.0+cu128", "deepspeed": "0.19.8",
            "measurements": [
                {"test": "tests/test_04_x.py::test_peak", "key": "ch04.sdpa_flash_peak_bytes_s8192",
                 "value": 3 * 2**30, "unit": "B"},
                {"test": "tests/test_04_x.py::test_time", "key": "ch04.sdpa_seconds", "value": 0.012345, "unit": "s"},
                {"test": "tests/test_03_chapter.py::test_plans", "key": "ch03.full_over_none", "value": 1.31,
                 "unit": "ratio"}]}
    data.update(over)
    return data


def test_file_name_is_date_and_gpu_slug():
    assert gpu_results.file_name("2026-12-01", "NVIDIA H100 80GB HBM3") == "2026-12-01_nvidia-h100-80gb-hbm3.json"
    assert gpu_results.slug("Tesla T4") == "tesla-t4"
    with pytest.raises(UsageError):
        gpu_results.file_name("1 Dec 2026", "Tesla T4")


def test_none_committed_says_so_in_one_sentence(tmp_path, capsys):
    """One sentence, wrapped to fit the page (100 columns, issue 24), nothing else."""
    gpu_results.show("04", directory=tmp_path / "absent")
    out = capsys.readouterr().out
    assert out.count("\n") <= 2 and out.rstrip().endswith("results/gpu/<date>_<gpu>.json.")
    assert max(len(line) for line in out.splitlines()) <= 100
    assert "No GPU measurements are committed for chapter 04 yet" in out and "make gpu-check" in out


def test_show_lists_only_that_chapter_labelled_with_gpu_and_date(tmp_path, capsys):
    path = gpu_results.write(run_file(), tmp_path)
    assert path.name == "2026-11-30_nvidia-h100-80gb-hbm3.json"
    gpu_results.show("04", directory=tmp_path)
    out = capsys.readouterr().out
    assert "NVIDIA H100 80GB HBM3, measured 2026-11-30" in out
    assert "driver 570.86.15" in out and "torch 2.13.0+cu128" in out and "DeepSpeed 0.19.8" in out
    assert "the course pins" not in out and max(len(line) for line in out.splitlines()) <= 100
    gpu_results.write(run_file(date="2026-12-04", gpu="NVIDIA H200", torch="2.11.0+cu130"), tmp_path)
    gpu_results.show("04", directory=tmp_path)
    assert "torch 2.11.0+cu130 (the course pins 2.13.0)" in capsys.readouterr().out
    # 3 GiB exactly: the integer, then GB (10^9) and GiB (2^30), labelled
    assert f"{3 * 2**30:,} B (3.22 GB (3.00 GiB))" in out
    assert "0.01235 s" in out
    assert "ch03." not in out
    gpu_results.show("3", directory=tmp_path)
    assert "ch03.full_over_none  1.31 ratio" in capsys.readouterr().out


def test_a_labs_gpu_answers_are_counted_not_shown(tmp_path, capsys):
    """Review r25/r26 of lab 01: chapter 01's cell printed lab01.variant_held_bytes_flash and its
    siblings, the very numbers lab 01's GPU part asks the learner to measure."""
    data = run_file()
    data["measurements"] += [{"test": "t::a", "key": "lab04.peak_bytes", "value": 7, "unit": "B"},
                             {"test": "t::b", "key": "lab04.seconds", "value": 0.5, "unit": "s"}]
    gpu_results.write(data, tmp_path)
    gpu_results.show("04", directory=tmp_path)
    out = capsys.readouterr().out
    assert "lab04." not in out and "ch04.sdpa_seconds" in out
    assert "(2 lab measurements not shown: the lab's GPU part asks you to measure them)" in out


def test_load_is_newest_first_and_round_trips(tmp_path):
    gpu_results.write(run_file(), tmp_path)
    gpu_results.write(run_file(date="2026-12-01", gpu="Tesla T4"), tmp_path)
    runs = gpu_results.load(tmp_path)
    assert [r["date"] for r in runs] == ["2026-12-01", "2026-11-30"]
    assert runs[1]["measurements"] == run_file()["measurements"]
    assert runs[0]["file"] == "2026-12-01_tesla-t4.json"
    assert json.loads((tmp_path / runs[0]["file"]).read_text())["format"] == gpu_results.FORMAT


@pytest.mark.parametrize("change, says", [
    (lambda d: d.pop("driver"), "lacks driver"),
    (lambda d: d.update(date="yesterday"), "not YYYY-MM-DD"),
    (lambda d: d["measurements"].append({"test": "t", "key": "peak", "value": 1, "unit": "B"}), "chNN.<what>"),
    (lambda d: d["measurements"].append({"test": "t", "key": "ch04.x", "value": 1}), "lacks unit"),
])
def test_malformed_files_are_refused(tmp_path, change, says):
    data = run_file()
    change(data)
    (tmp_path / "bad.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=says.replace(".", r"\.").replace("<", ".").replace(">", ".")):
        gpu_results.load(tmp_path)


def test_bad_chapter_is_a_usage_error():
    with pytest.raises(UsageError):
        gpu_results.show("four")


def test_committed_results_files_are_well_formed():
    """Whatever is committed under results/gpu/ parses (empty is fine: no GPU run yet)."""
    for run in gpu_results.load():
        assert run["file"] == gpu_results.file_name(run["date"], run["gpu"])
        assert run["measurements"], run["file"]


# -- tools/gpu_check.py on this CPU machine ------------------------------------------------

def _gpu_marked() -> list[str]:
    """``tests/FILE.py::NAME`` of every test marked ``gpu``, read from the test files' syntax trees
    (a decorator ``@pytest.mark.gpu``, or a module's ``pytestmark``): an independent list, without a
    second pytest collection of the whole suite (about 15 s of a core)."""
    import ast

    def is_gpu(node) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "gpu" and isinstance(node.value, ast.Attribute) \
            and node.value.attr == "mark"
    found = []
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        tree = ast.parse(path.read_text())
        marked = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                     and any(is_gpu(v) for v in ast.walk(n.value)) for n in tree.body)
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test") and \
                    (marked or any(is_gpu(d) or any(is_gpu(v) for v in ast.walk(d)) for d in node.decorator_list)):
                found.append(f"tests/{path.name}::{node.name}")
    return found


@pytest.fixture(scope="module")
def cpu_check(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    proc = subprocess.run([sys.executable, "tools/gpu_check.py", "--results-dir", str(out / "results"),
                           "--report", str(out / "report.md")], cwd=ROOT, capture_output=True, text=True,
                          timeout=240, env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""})
    return proc, out


def test_the_static_list_of_gpu_tests_reads_both_kinds_of_mark():
    """The list the next test checks against: a decorated test and a module-wide mark are found, and a
    test marked otherwise is not."""
    found = _gpu_marked()
    assert "tests/test_01_gpu.py::test_cuda_step_peak_is_near_the_trace" in found            # decorated
    assert "tests/test_05_offload_gpu.py::test_pcie_rungs_pinned_beats_pageable" in found    # pytestmark
    assert not any(f.startswith(("tests/test_browser.py::", "tests/test_lab_orphans.py::")) for f in found)


def test_gpu_check_on_cpu_skips_every_item_with_a_reason(cpu_check):
    proc, out = cpu_check
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    report = (out / "report.md").read_text()
    assert "no CUDA device" in report and "nothing was measured" in report
    # every gpu-marked test in the suite appears (parametrized: each of its ids), skipped, with the
    # conftest's reason
    ids = _gpu_marked()
    assert len(ids) >= 13, ids
    for test in ids:
        rows = [line for line in report.splitlines() if f"`{test}[" in line or f"`{test}`" in line]
        assert rows, f"{test} missing from the report"
        for row in rows:
            assert "skipped" in row and "needs a CUDA GPU" in row, row
    assert "passed" not in report.lower().replace("0 passed", "")


def test_gpu_check_on_cpu_writes_no_results_file(cpu_check):
    proc, out = cpu_check
    assert not (out / "results").exists() or not list((out / "results").glob("*.json"))
    assert "no results file written" in proc.stdout


def test_gpu_check_lists_each_chapters_gpu_paths(cpu_check):
    """The chapters' own GPU paths (each registered experiment with --device cuda) are items too."""
    from gpumem.chapters import experiments
    report = cpu_check[1].joinpath("report.md").read_text()
    for name in experiments():
        assert f"python -m gpumem run {name} --device cuda" in report


# -- env/gpu_box_setup.sh: what it decides before it installs anything ------------------------

def _box(tmp_path, smi: str | None):
    import os
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    path = f"{bin_dir}:/usr/bin:/bin"
    if smi is not None:
        (bin_dir / "nvidia-smi").write_text("#!/bin/bash\n" + smi + "\n")
        (bin_dir / "nvidia-smi").chmod(0o755)
    # a copy in an empty checkout: whatever the script does happens under tmp_path, never to .venv here
    (tmp_path / "env").mkdir(exist_ok=True)
    (tmp_path / "env" / "requirements.txt").write_text((ROOT / "env" / "requirements.txt").read_text())
    script = tmp_path / "env" / "gpu_box_setup.sh"
    script.write_text((ROOT / "env" / "gpu_box_setup.sh").read_text())
    return subprocess.run(["bash", str(script)], capture_output=True, text=True,
                          timeout=60, env={"PATH": path, "HOME": str(tmp_path), "SKIP_APT": "1",
                                           "LANG": os.environ.get("LANG", "C")})


def test_gpu_box_script_refuses_a_machine_without_a_driver(tmp_path):
    proc = _box(tmp_path, None)
    assert proc.returncode == 1 and "nvidia-smi not found" in proc.stderr


def test_gpu_box_script_refuses_a_driver_too_old_for_torchs_cuda_wheels(tmp_path):
    """A driver whose CUDA is 11.8 (as nvidia-smi's header prints it) cannot run cu126+ wheels."""
    smi = ('case "$*" in *name*) echo "Tesla T4";; *compute_cap*) echo "7.5";; '
           '*) echo "| NVIDIA-SMI 520.61.05    Driver Version: 520.61.05    CUDA Version: 11.8     |";; esac')
    proc = _box(tmp_path, smi)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Tesla T4 (compute capability 7.5), driver supports CUDA up to 11.8" in proc.stdout
    assert "update the driver or set TORCH_CUDA" in proc.stderr
    assert not (tmp_path / ".venv").exists()


def test_budget_stops_an_item_and_its_children(tmp_path):
    """--budget: an item that outlives what is left is killed with its whole process group (a
    grandchild holding the output pipe, as DeepSpeed's ranks do, does not keep it waiting), and
    once the budget is spent the next items are skipped, not started."""
    import time

    sys.path.insert(0, str(ROOT / "tools"))
    import gpu_check
    clock = gpu_check.Clock(2.0)
    start = time.monotonic()
    marker = tmp_path / "grandchild-ran-on"
    proc = gpu_check._run(["sh", "-c", f"(sleep 4; touch {marker}) & sleep 30"], clock, capture_output=True)
    assert proc is None and time.monotonic() - start < 10
    time.sleep(3)
    assert not marker.exists()                       # the grandchild was killed with the group
    assert clock.spent()
    done = gpu_check._run([sys.executable, "-c", "print(6 * 7)"], gpu_check.Clock(None), capture_output=True)
    assert done.returncode == 0 and done.stdout.strip() == b"42"
    rows = gpu_check.notebooks({"cuda_available": True}, clock)
    assert rows and all(r["outcome"] == "skipped" and "out of --budget" in r["detail"] for r in rows)


def test_a_lab_measurement_belongs_to_its_chapter(tmp_path):
    """The labs' GPU parts record ``labNN.<what>``: valid, and shown with chapter NN's runs."""
    data = {"date": "2026-12-04", "gpu": "Test GPU", "gpu_count": 1, "driver": "1", "cuda": "13.0",
            "torch": "2.11", "deepspeed": "0.19.8", "outcomes": [],
            "measurements": [{"test": "t", "key": "lab03.placement_peak_measured", "value": 5, "unit": "B"},
                             {"test": "t", "key": "ch04.x", "value": 1, "unit": "s"}]}
    gpu_results.write(data, tmp_path)
    assert [m["key"] for r in gpu_results.for_chapter("03", tmp_path) for m in r["measurements"]] == \
        ["lab03.placement_peak_measured"]
    with pytest.raises(ValueError, match="labNN"):
        gpu_results.validate({**data, "measurements": [{"test": "t", "key": "lab3.x", "value": 1, "unit": "B"}]})
