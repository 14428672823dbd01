"""Every repository path a file cites as `dir/name.md` exists, so a reader who follows a citation finds what it
names (code and tests once cited reference/pubsub-api.md, which was never in the repository). A path is looked
for from the repository's root and from the citing file's folder; web addresses are not checked."""

from __future__ import annotations

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[2]
FOLDERS = ("pigeon", "tests", "scripts", "docs", "bench", "deploy")
SUFFIXES = {".py", ".md", ".toml", ".yml", ".yaml", ".js", ".html", ".sh", ".service"}
CITED = re.compile(r"(?<![\w/.:-])((?:[\w.-]+/)+[\w.-]+\.md)\b")


def missing_citations(text: str, folder: pathlib.Path) -> list[str]:
    return [c for c in CITED.findall(text) if not (ROOT / c).exists() and not (folder / c).exists()]


def test_cited_paths_exist():
    found = set()
    files = [ROOT / "README.md", ROOT / "CHANGELOG.md"] + [p for d in FOLDERS for p in sorted((ROOT / d).rglob("*"))
                                                           if p.suffix in SUFFIXES and "__pycache__" not in p.parts
                                                           and p != pathlib.Path(__file__).resolve()]  # (its examples)
    for path in files:
        for cited in missing_citations(path.read_text(errors="replace"), path.parent):
            found.add((str(path.relative_to(ROOT)), cited))
    assert found == set(), "citations of files that do not exist"


def test_a_missing_citation_is_found():
    assert missing_citations("see reference/pubsub-api.md and docs/reference.md#limits", ROOT / "pigeon") == \
        ["reference/pubsub-api.md"]
    assert missing_citations("https://example.com/docs/nothing.md", ROOT) == []
