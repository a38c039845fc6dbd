"""README.md and docs/*.md stay true to the repository: every relative link resolves (the file,
and the heading where a ``#anchor`` is given), every ``shardkit ...`` command shown in a fenced
code block parses with the flags it shows (so a renamed or removed flag fails here), and every
``make TARGET`` shown is a target of the Makefile.

A command is parsed, never run: the subcommand is found in ``shardkit.cli.main``, its click parser
reads the exact tokens (an unknown option, a missing option value or an extra argument is an
error), and each option value is converted by its click type (a choice that no longer exists is
an error) except path-like values, which name files of the reader's machine. Placeholders are
skipped on purpose: a standalone ``...`` (more flags elided) is dropped, a value in CAPS (``OUT``,
``SPEC``, ``PREV_OUT``) or in ``<angle brackets>`` is not type-checked, and a command written with
``[--optional VALUE]`` brackets is a synopsis, not a command: it is not parsed.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```", re.M | re.S)
NOT_SHELL = {"python", "py", "yaml", "yml", "json", "toml"}
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_]*|<[^>]*>)$")
SHELL_STOP = {"|", "||", "&&", ";", ">", ">>", "2>", "&"}


# ------------------------------------------------------------------------------------ links

def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped (word
    characters, spaces and hyphens kept), spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)     # a link: its text
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file (repeats get GitHub's ``-1``, ``-2``...)."""
    seen: dict[str, int] = {}
    out = set()
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    for m in re.finditer(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        slug = _slug(m.group(1))
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def relative_links(path: Path) -> list[str]:
    """The link targets of ``path`` that are not URLs (fenced blocks and inline code left out:
    their brackets are code, not links)."""
    text = INLINE_CODE.sub("", FENCE.sub("", path.read_text(encoding="utf-8")))
    return [t for t in LINK.findall(text) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def _shown_path(path: Path) -> str:
    return str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)


def broken_links(path: Path) -> list[str]:
    """``"target: why"`` for every relative link of ``path`` that does not resolve."""
    bad = []
    for target in relative_links(path):
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            bad.append(f"{target}: {_shown_path(dest)} does not exist")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {_shown_path(dest)}")
        elif anchor and dest.is_dir():
            bad.append(f"{target}: an anchor on a folder")
    return bad


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    assert broken_links(doc) == []


def test_the_readme_links_every_guide_page():
    links = {t.partition("#")[0] for t in relative_links(ROOT / "README.md")}
    pages = {f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")}
    assert pages <= links, sorted(pages - links)


def test_the_link_checker_sees_a_broken_file_and_a_broken_anchor(tmp_path):
    (tmp_path / "other.md").write_text("# Packing and splits\n\n## Shards per split\n")
    doc = tmp_path / "doc.md"
    doc.write_text("See [a](other.md#shards-per-split), [b](other.md#nope), [c](gone.md), "
                   "[d](#here), `[e](code.md)`, [f](https://example.com/x.md).\n\n## Here\n"
                   "```\n[g](fenced.md)\n```\n")
    assert relative_links(doc) == ["other.md#shards-per-split", "other.md#nope", "gone.md",
                                   "#here"]
    bad = broken_links(doc)
    assert len(bad) == 2 and bad[0].startswith("other.md#nope: no heading #nope")
    assert bad[1].startswith("gone.md: ") and bad[1].endswith("does not exist")
    assert _slug("`shardkit bench`: is training data-bound, and what should change?") == \
        "shardkit-bench-is-training-data-bound-and-what-should-change"
    assert _slug("Object storage: S3, GCS, HTTP") == "object-storage-s3-gcs-http"


# ------------------------------------------------------------------------------ commands

def _shell_lines(block: str) -> list[str]:
    """The block's lines with ``\\`` continuations joined."""
    out, cur = [], ""
    for line in block.splitlines():
        if line.rstrip().endswith("\\"):
            cur += line.rstrip()[:-1] + " "
            continue
        out.append(cur + line)
        cur = ""
    return out + ([cur] if cur else [])


def commands(path: Path) -> list[tuple[str, list[str]]]:
    """``(kind, tokens)`` for every ``shardkit`` and ``make`` command in the fenced blocks of
    ``path``: kind ``"shardkit"`` with the tokens after ``shardkit`` (the command word, after
    ``VAR=value`` assignments only) or after ``-m shardkit.cli`` (``python``, ``torchrun``),
    ``"make"`` with those after ``make``, up to a shell operator; comments dropped. Blocks
    marked python, yaml, json or toml are not shell, and a line that is not shell (``from
    shardkit import ...``, an unbalanced quote) is no command."""
    found = []
    for info, block in FENCE.findall(path.read_text(encoding="utf-8")):
        if info.strip().lower() in NOT_SHELL:
            continue
        for line in _shell_lines(block):
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError:          # not shell (an unbalanced quote in Python, say)
                continue
            for i, tok in enumerate(tokens):
                first = all(re.match(r"^\w+=", t) for t in tokens[:i])
                if (first and Path(tok).name == "shardkit") or (
                        tok == "shardkit.cli" and i and tokens[i - 1] == "-m"):
                    kind = "shardkit"
                elif first and tok == "make":
                    kind = "make"
                else:
                    continue
                rest = tokens[i + 1:]
                stop = next((j for j, t in enumerate(rest) if t in SHELL_STOP), len(rest))
                found.append((kind, rest[:stop]))
                break
    return found


def _path_like(param: click.Parameter) -> bool:
    return isinstance(param.type, (click.Path, click.File))


def parse_problem(args: list[str]) -> str | None:
    """Why ``shardkit ARGS`` would not parse (None when it does, or when it is a synopsis:
    a token starting ``[-``). Parses with the subcommand's click parser and converts every value
    that is not a path or a placeholder with its click type; runs nothing."""
    from shardkit.cli import main

    if any(t.startswith("[-") for t in args):
        return None                           # a synopsis (``[--flag VALUE]``), not a command
    args = [t for t in args if t != "..."]
    cmd: click.Command = main
    ctx = click.Context(main, info_name="shardkit")
    names = []
    while isinstance(cmd, click.Group):
        opts = []
        while args and args[0].startswith("-"):
            opts.append(args.pop(0))
        try:
            cmd.make_parser(ctx).parse_args(opts)
        except click.UsageError as exc:
            return f"shardkit {' '.join(names + opts)}: {exc.format_message()}"
        if not args:
            return f"shardkit {' '.join(names)}: no subcommand"
        sub = cmd.get_command(ctx, args[0])
        if sub is None:
            return f"shardkit {' '.join(names)}: no command {args[0]!r}"
        names.append(args.pop(0))
        ctx = click.Context(sub, info_name=names[-1], parent=ctx)
        cmd = sub
    try:
        values, extra, _ = cmd.make_parser(ctx).parse_args(list(args))
    except click.UsageError as exc:
        return f"shardkit {' '.join(names)}: {exc.format_message()}"
    if extra and not ctx.allow_extra_args:
        return f"shardkit {' '.join(names)}: unexpected extra arguments {extra}"
    for param in cmd.params:
        value = values.get(param.name)
        if not isinstance(value, (str, int, float, list, tuple)) or _path_like(param):
            continue  # not given (None, or click's own "unset" marker), or a path
        many = isinstance(value, (list, tuple))
        kept = [v for v in (value if many else [value])
                if not (isinstance(v, str) and PLACEHOLDER.match(v))]
        if not kept:
            continue
        try:
            param.type_cast_value(ctx, kept if many else kept[0])
        except click.BadParameter as exc:
            return f"shardkit {' '.join(names)} {param.opts[0]}: {exc.format_message()}"
    return None


def _shown() -> list[tuple[str, str, list[str]]]:
    return [(f"{doc.relative_to(ROOT)}", kind, args) for doc in DOCS
            for kind, args in commands(doc)]


def test_docs_show_commands_of_every_main_step():
    shown = _shown()
    subcommands = {args[0] for _, kind, args in shown if kind == "shardkit" and args}
    assert {"pack", "verify", "check", "inspect", "stats", "train", "bench"} <= subcommands
    assert sum(kind == "shardkit" for _, kind, _ in shown) >= 15


def test_every_shardkit_command_shown_parses():
    problems = [f"{doc}: shardkit {' '.join(args)}\n    -> {why}"
                for doc, kind, args in _shown() if kind == "shardkit"
                if (why := parse_problem(list(args)))]
    assert not problems, "\n".join(problems)


def test_every_make_target_shown_exists():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    targets = set(re.findall(r"^([\w.-]+):", makefile, re.M))
    shown = [(doc, args[0]) for doc, kind, args in _shown() if kind == "make" and args]
    assert {"demo", "test", "test-fast"} <= {t for _, t in shown}
    assert [(doc, t) for doc, t in shown if t not in targets] == []


def test_the_command_checker_catches_a_renamed_flag_and_skips_placeholders(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("```bash\n.venv/bin/shardkit pack photos/ out/p --format wds \\\n"
                   "    --seed 0   # a comment with shardkit verify in it\n"
                   "python -m shardkit.cli verify out/p | tee log\n"
                   "SHARDKIT_SHARED_DATA=/x make test\n```\n"
                   "from shardkit import make_loader\n```\n"
                   "```python\nloader = make_loader('out', \"train\")  # shardkit\n```\n")
    assert commands(doc) == [("shardkit", ["pack", "photos/", "out/p", "--format", "wds",
                                           "--seed", "0"]),
                             ("shardkit", ["verify", "out/p"]), ("make", ["test"])]
    assert parse_problem(["pack", "SRC", "OUT", "--format", "wds"]) is None
    assert "no such option" in parse_problem(["pack", "SRC", "OUT", "--no-such-flag"]).lower()
    assert "requires an argument" in parse_problem(["pack", "SRC", "OUT", "--seed"])
    assert "'tar'" in parse_problem(["pack", "SRC", "OUT", "--format", "tar"])
    assert "extra" in parse_problem(["verify", "OUT", "more", "args"])
    assert "no command 'nope'" in parse_problem(["nope"])
    assert "no such option" in parse_problem(["cache", "build", "OUT", "--nope"]).lower()
    assert parse_problem(["pack", "SRC", "OUT", "--engine", "ray", "[--ray-address", "ADDR]"]) \
        is None                                              # a synopsis: skipped
    assert parse_problem(["train", "--data", "out/p", "--out", "runs/r", "..."]) is None
    assert parse_problem(["pack", "SRC", "OUT", "--format", "FMT"]) is None   # a placeholder
    assert parse_problem(["check", "OUT", "--augment", "[{op: color_jitter, hue: 0.1}]"]) is None
    assert "no such option" in parse_problem(
        ["check", "OUT", "--augment", "[{op: color_jitter}]", "--nope"]).lower()
