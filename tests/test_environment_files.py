"""environment.yml (conda route) must install exactly env/requirements.txt; torch stays pinned."""

from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from conftest import ROOT


def read_requirements(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if not line:
            continue
        if line.startswith("-r "):
            out.update(read_requirements(path.parent / line[3:].strip()))
            continue
        req = Requirement(line)
        out[req.name.lower()] = str(req.specifier)
    return out


def test_environment_yml_pip_section_matches_requirements():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_sections = [d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(pip_sections) == 1
    from_yml = {}
    for entry in pip_sections[0]:
        if entry.startswith("-r "):
            from_yml.update(read_requirements(ROOT / entry[3:].strip()))
        else:
            req = Requirement(entry)
            from_yml[req.name.lower()] = str(req.specifier)
    assert from_yml == read_requirements(ROOT / "env" / "requirements.txt")


def test_environment_yml_python_meets_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    python = next(d for d in env["dependencies"] if isinstance(d, str) and d.startswith("python"))
    version = python.split("=")[1]
    assert SpecifierSet(">=3.11").contains(version + ".0")


def test_torch_is_pinned_next_to_deepspeed():
    reqs = read_requirements(ROOT / "env" / "requirements.txt")
    assert reqs["torch"] == "==2.13.0"  # without it pip pulls a CUDA torch for deepspeed
    assert reqs["deepspeed"] == "==0.19.8"
    assert all(spec.startswith("==") for spec in reqs.values()), reqs
