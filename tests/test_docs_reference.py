"""The reference pages say what the code says, and the docs' links lead somewhere.

docs/experiment-fields.md and docs/knobs.md are generated from the experiment models and the knob
catalogue by scripts/gen_reference.py; a change to either without regenerating fails here (CI runs
this through `make test`). Every relative link in README.md and docs/*.md must name an existing file,
and an anchor in it a heading of that file.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = sorted([REPO / "README.md", *DOCS.glob("*.md")])


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", REPO / "scripts" / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_reference_matches_the_code(tmp_path):
    gen = _generator()
    written = gen.write(tmp_path)
    assert written, "the generator wrote nothing"
    stale = []
    for fresh in written:
        committed = DOCS / fresh.name
        old = committed.read_text(encoding="utf-8") if committed.exists() else ""
        new = fresh.read_text(encoding="utf-8")
        if old != new:
            diff = difflib.unified_diff(
                old.splitlines(),
                new.splitlines(),
                f"docs/{fresh.name} (committed)",
                f"docs/{fresh.name} (from the code)",
                lineterm="",
                n=0,
            )
            stale.append(f"docs/{fresh.name}:\n" + "\n".join(list(diff)[:20]))
    assert not stale, (
        "the reference pages differ from what the code says; run `python scripts/gen_reference.py` "
        "(.venv/bin/python scripts/gen_reference.py) and commit docs/\n\n" + "\n\n".join(stale)
    )


def test_generated_reference_names_every_field_and_knob():
    from orchestrator.config import knobs
    from orchestrator.config.experiment import PromotionSpec, ServerSpec, SweepSpec

    gen = _generator()
    pages = gen.pages()
    for name in knobs.KNOBS:
        assert f"| `{name}` |" in pages["knobs.md"], f"knob {name} missing from docs/knobs.md"
    for prefix, model in (("", SweepSpec), ("server.", ServerSpec), ("promotion.", PromotionSpec)):
        for field in model.model_fields:
            if field not in gen.LOADER_FIELDS:
                assert f"| `{prefix}{field}` |" in pages["experiment-fields.md"], f"{prefix}{field} missing"


# ---------------------------------------------------------------- links

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_INDENTED = re.compile(r"^(?: {4}|\t).*$", re.MULTILINE)
_CODE_SPAN = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def links(text: str) -> list[str]:
    """The link targets of markdown `text`, code blocks and code spans left out."""
    text = _FENCE.sub("", text)
    text = _INDENTED.sub("", text)
    text = _CODE_SPAN.sub("", text)
    return _LINK.findall(text)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces to '-'."""
    kept = "".join(c for c in heading.strip().lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {anchor(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", _FENCE.sub("", text), re.MULTILINE)}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "see [the fields](docs/experiment-fields.md) and ![shot](docs/a.png)",
            ["docs/experiment-fields.md", "docs/a.png"],
        ),
        (
            '[web](https://example.com) [here](#usage) [t](knobs.md "title")',
            ["https://example.com", "#usage", "knobs.md"],
        ),
        ("`[not](a-link.md)` in code", []),
        ("```\n[not](a-link.md)\n```\n[yes](b.md)", ["b.md"]),
        ("    indented [not](a-link.md)\n[yes](c.md#part)", ["c.md#part"]),
    ],
)
def test_links_are_read_from_prose_only(text, expected):
    assert links(text) == expected


@pytest.mark.parametrize(
    ("heading", "expected"),
    [
        ("`server` (ServerSpec)", "server-serverspec"),
        ("`objective.constraints.<key>` (Bound)", "objectiveconstraintskey-bound"),
        ("The verdict: sequential confirmation", "the-verdict-sequential-confirmation"),
    ],
)
def test_anchor_is_githubs(heading, expected):
    assert anchor(heading) == expected


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_relative_links_lead_to_existing_files(page):
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path_part, _, fragment = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(REPO) if dest.is_relative_to(REPO) else dest}")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest.read_text(encoding="utf-8")):
            broken.append(f"{target}: no heading with anchor #{fragment} in {dest.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)} has broken links:\n" + "\n".join(broken)
