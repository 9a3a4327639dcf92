#!/usr/bin/env python3
"""The README and the docs as a newcomer reads them: every scripts/, docs/ and experiments/ path the
README names exists. With --all, also: the README fits on two screens (at most 150 lines) and no doc
outside CHANGELOG.md and docs/runs/ speaks of "round N" (history belongs in the changelog and the run
logs). scripts/test.sh runs it; exits 1 naming each file and line that fails.
  scripts/check_docs.py [--all]"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
README_MAX_LINES = 150
PATH = re.compile(r"(?<![\w/.-])((?:scripts|docs|experiments)/[\w./-]*[\w/])")
ROUND = re.compile(r"(?<![-\w])round \d+\b", re.IGNORECASE)  # not the option --round


def readme_paths(readme):
    problems = []
    for number, line in enumerate(readme.read_text().splitlines(), 1):
        for path in PATH.findall(line):
            if not (ROOT / path).exists():
                problems.append(f"README.md:{number}: names {path}, which does not exist")
    return problems


def readme_length(readme):
    count = len(readme.read_text().splitlines())
    return [] if count <= README_MAX_LINES else [f"README.md: {count} lines (at most {README_MAX_LINES})"]


def rounds():
    problems = []
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for doc in docs:
        rel = doc.relative_to(ROOT).as_posix()
        if rel == "CHANGELOG.md" or rel.startswith("docs/runs/"):
            continue
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            for m in ROUND.finditer(line):
                problems.append(f"{rel}:{number}: says \"{m.group(0)}\"")
    return problems


def main(argv):
    if any(a not in ("--all",) for a in argv):
        print(__doc__.splitlines()[-1].strip(), file=sys.stderr)
        return 2
    readme = ROOT / "README.md"
    checks = [("paths", readme_paths(readme))]
    if "--all" in argv:
        checks += [("length", readme_length(readme)), ("round N", rounds())]
    failed = 0
    for name, problems in checks:
        for p in problems:
            print(f"check_docs: {p}")
        failed += bool(problems)
    print(f"check_docs: {len(checks) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
