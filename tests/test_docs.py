"""The docs a newcomer reads stay true: the generated reference pages hold every config key and
every flag and equal what tools/gen_reference.py writes now (`make docs`), every relative link
and #anchor in README.md and docs/ leads somewhere, and the README stays short."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import typing
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[(?:[^\]]|\][^(])*?\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
MAX_README_LINES = 200


def _generator():
    path = ROOT / "tools" / "gen_reference.py"
    spec = importlib.util.spec_from_file_location("gen_reference", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GEN = _generator()


@pytest.fixture(scope="module")
def check_output() -> str:
    """What `tools/gen_reference.py --check` says, in a fresh process: there the parser holds
    only the package's own registry entries (other tests register toy samplers)."""
    script = ROOT / "tools" / "gen_reference.py"
    proc = subprocess.run(
        [sys.executable, str(script), "--check"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    return proc.stdout


def _model_of(tp: typing.Any) -> type[BaseModel] | None:
    """The config model an annotation holds anywhere (a section, Optional, list or dict)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp
    return next(filter(None, map(_model_of, typing.get_args(tp))), None)


def walk_keys(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every key as a plain dotted path (no `[]` or `<k>`): a section's keys, not the section;
    a list or dict of entries is a key, and so is each key of its entries."""
    for name, field in model.model_fields.items():
        key = prefix + name
        inner = _model_of(field.annotation)
        if inner is None or field.annotation not in (inner, inner | None):
            yield key
        if inner is not None:
            yield from walk_keys(inner, key + ".")


def test_every_config_key_is_in_the_config_reference(check_output: str):
    page = (ROOT / GEN.CONFIG_PAGE).read_text(encoding="utf-8")
    listed = {
        key.replace("[]", "").replace(".<k>", "")
        for key in re.findall(r"^\| `([^`]+)` \|", page, re.M)
    }
    missing = [key for key in walk_keys(GEN.root_config()) if key not in listed]
    assert not missing, f"config keys missing from {GEN.CONFIG_PAGE}: {missing}; run `make docs`"
    assert str(GEN.CONFIG_PAGE) not in check_output, check_output


def test_every_config_key_has_a_description_in_the_config_reference(check_output: str):
    """Each key's row says what it does: its last cell (the field's `description=`) holds text."""
    page = (ROOT / GEN.CONFIG_PAGE).read_text(encoding="utf-8")
    described = {}
    for key, rest in re.findall(r"^\| `([^`]+)` \|(.*)\|[ \t]*$", page, re.M):
        cells = re.split(r"(?<!\\)\|", rest)  # type | default | description; `\|` is escaped
        described[key.replace("[]", "").replace(".<k>", "")] = cells[-1].strip()
    empty = [key for key in walk_keys(GEN.root_config()) if described.get(key) == ""]
    assert not empty, (
        f"config keys with no description in {GEN.CONFIG_PAGE}: {empty}; give each field a "
        "Field(description=...) in stackwise/config/ and run `make docs`"
    )
    assert str(GEN.CONFIG_PAGE) not in check_output, check_output


def _section(page: str, title: str) -> str:
    """The text of `## title` up to the next heading of its level."""
    start = page.index(f"\n## {title}\n")
    end = page.find("\n## ", start + 1)
    return page[start : end if end > 0 else None]


def test_every_subcommand_and_flag_is_in_the_cli_reference(check_output: str):
    from stackwise.cli.finetune import FLAGS, PRECISION_FLAGS

    page = (ROOT / GEN.CLI_PAGE).read_text(encoding="utf-8")
    parser = GEN.build_cli()
    missing = []
    for _name, _summary, sub in [("", "", parser), *GEN.subcommands(parser)]:
        if f"\n## {sub.prog}\n" not in page:
            missing.append(sub.prog)
            continue
        section = _section(page, sub.prog)
        flags = [o for action in sub._actions for o in action.option_strings]
        if sub.prog.endswith(" finetune"):  # its flags are parsed from the config's keys
            flags += [f"--{name}" for name in [*FLAGS, *PRECISION_FLAGS]]
        found = set(re.findall(r"(?<![\w-])(--?[\w][\w-]*)", section))
        missing += [f"{sub.prog} {flag}" for flag in flags if flag not in found]
    assert not missing, f"missing from {GEN.CLI_PAGE}: {missing}; run `make docs`"
    assert str(GEN.CLI_PAGE) not in check_output, check_output


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: link markup reduced to its text, lowercase, punctuation
    but - and _ dropped, each space a -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).lower()
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings; a repeated heading gets -1, -2, ... as on GitHub."""
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        base, n = slug(heading), 0
        while (name := base if n == 0 else f"{base}-{n}") in found:
            n += 1
        found.add(name)
    return found


def links(page: Path) -> list[str]:
    """The targets of a page's Markdown links, outside code blocks and code spans."""
    text = INLINE_CODE.sub("", FENCE.sub("", page.read_text(encoding="utf-8")))
    return LINK.findall(text)


def broken_links(page: Path, root: Path = ROOT) -> Iterator[str]:
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http(s), mailto: not fetched
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        where = f"{page.relative_to(root)}: ({target})"
        if not dest.exists():
            yield f"{where} names no file"
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            yield f"{where}: no heading of {dest.relative_to(root)} has the anchor #{anchor}"


def test_every_relative_link_and_anchor_resolves():
    broken = [problem for page in PAGES for problem in broken_links(page)]
    assert not broken, "\n".join(broken)


def test_the_link_checker_sees_links_and_anchors(tmp_path: Path):
    page = tmp_path / "a.md"
    page.write_text(
        "# Title: `one`, two!\n## Title: one, two\n[x](#title-one-two) [y](#title-one-two-1)\n"
        "[z](b.md#nowhere) `[no](c.md)`\n```\n[no](d.md)\n```\n[w](https://example.org/x)\n",
        encoding="utf-8",
    )
    (tmp_path / "b.md").write_text("# B\n", encoding="utf-8")
    found = ["#title-one-two", "#title-one-two-1", "b.md#nowhere", "https://example.org/x"]
    assert links(page) == found
    assert list(broken_links(page, tmp_path)) == [
        "a.md: (b.md#nowhere): no heading of b.md has the anchor #nowhere"
    ]


def test_the_readme_stays_short():
    lines = len((ROOT / "README.md").read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_README_LINES, (
        f"README.md has {lines} lines, more than {MAX_README_LINES}: move details to docs/"
    )
