"""`make site`: build the course book (gpumem.course.site) with every chapter's quiz on its page.

    .venv/bin/python tools/build_site.py [--out DIR] [--fresh-quizzes]

The quizzes' drawn variants (gpumem.course.site_quiz) come from the chapters, which this tool
may import (the site module, in the course layer, may not). Drawing them imports every chapter
and traces a 70B step for one question, so they are kept in .cache/site-quiz/, keyed by the
library's source: a build after a change to gpumem/ draws them again, any other build reads them.
"""

import argparse
import hashlib
import importlib
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "site-quiz"


def source_key() -> str:
    """A hash of every file under gpumem/ and the number of variants: the quizzes' inputs."""
    from gpumem.course import site_quiz
    digest = hashlib.sha256(f"variants={site_quiz.VARIANTS}".encode())
    for path in sorted((ROOT / "gpumem").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:20]


def draw_quizzes() -> dict:
    """{"pools": chapter stem -> question id -> variants, "groups": stem -> checklist item -> ids}."""
    from gpumem.chapters import CHAPTERS, quizzes
    from gpumem.course import site_quiz
    pools = {quiz.name: site_quiz.export(quiz) for quiz in quizzes()}
    groups = {}
    for chapter in CHAPTERS:
        checklist = getattr(importlib.import_module(chapter.package), "CHECKLIST", None)
        if checklist is not None:
            groups[checklist.name] = {item.key: [q.id for q in item.questions] for item in checklist.items}
    return {"pools": pools, "groups": groups}


def quiz_data(fresh: bool = False) -> dict:
    """The drawn quizzes, from the cache when the library has not changed since they were drawn."""
    path = CACHE / f"{source_key()}.json"
    if path.exists() and not fresh:
        return json.loads(path.read_text())
    data = draw_quizzes()
    CACHE.mkdir(parents=True, exist_ok=True)
    for old in CACHE.glob("*.json"):
        old.unlink()
    path.write_text(json.dumps(data))
    return data


def main(argv: list[str] | None = None) -> int:
    from gpumem.course import site
    parser = argparse.ArgumentParser(description="Build the course's HTML book (offline).")
    parser.add_argument("--out", type=Path, default=site.DEFAULT_OUT, help="output folder (default .cache/site)")
    parser.add_argument("--fresh-quizzes", action="store_true", help="draw the quizzes again, cache or not")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    data = quiz_data(args.fresh_quizzes)
    drawn = time.perf_counter() - start
    built = site.build(args.out, pools=data["pools"], groups=data["groups"], quiet=True)
    if built["remote"]:
        print("pages would load from the network:", json.dumps(built["remote"], indent=1))
        return 1
    print(f"wrote {len(built['chapters'])} chapters, the labs and the index in "
          f"{time.perf_counter() - start:.0f} s (quizzes {drawn:.0f} s): {Path(args.out) / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
