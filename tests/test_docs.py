"""The front page and the manual stay true: every link resolves (files and their headings), every repository
path they cite exists, and every command they show runs against the code as it is: `heed` subcommands and
options parse with the current CLI, scripts, bench modules and make targets exist."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = ("rl", "rollouts", "data", "rewards", "bench", "configs", "scripts", "tests", "docs", ".ci")
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE_SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def _ids(pages):
    return [p.relative_to(ROOT).as_posix() for p in pages]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading.

    >>> slug("Serving: `heed serve`")
    'serving-heed-serve'
    >>> slug("Training: reading less under GRPO")
    'training-reading-less-under-grpo'
    """
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_link_resolves(page):
    for target in LINK.findall(page.read_text()):
        if re.match(r"\w+://|mailto:", target):
            continue  # the web: not checked offline
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name}: link to {target} does not resolve"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved), f"{page.name}: {target}: no such heading in {resolved.name}"


def _cited_paths(text: str) -> set[str]:
    """Code spans that are a repository path (``rl/serving/command.py``), wildcards left out."""
    out = set()
    for span in CODE_SPAN.findall(text):
        span = span.strip().rstrip(":,.")
        if " " in span or any(c in span for c in "*{}<>$"):
            continue
        span = span.split("::", 1)[0]
        if span.split("/", 1)[0] in PACKAGES and (Path(span).suffix or span.endswith("/")):
            out.add(span)  # a file or a folder (a metric such as rollouts/failed is neither)
    return out


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_cited_repository_path_exists(page):
    missing = sorted(p for p in _cited_paths(page.read_text()) if not (ROOT / p).exists())
    assert missing == [], f"{page.name} cites paths that do not exist: {missing}"


def _commands(text: str):
    """(command, whole?) for the shell commands in bash fences (whole: they must run as shown) and in code
    spans that start with a command this checks (prose names a command and its options, not all of it)."""
    for language, body in FENCE.findall(text):
        if language in ("bash", "sh", ""):
            for line in body.splitlines():
                yield from ((c, True) for c in _split(line))
    for span in CODE_SPAN.findall(text):
        if re.match(r"(\.venv/bin/)?heed |bash scripts/|make \w", span) and "..." not in span:
            yield from ((c, False) for c in _split(span))


def _split(line: str):
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:
        return
    command: list[str] = []
    for token in [*tokens, "&&"]:
        if token in ("&&", "||", ";", "|"):
            while command and re.match(r"^[A-Z_][A-Z0-9_]*=", command[0]):
                command.pop(0)  # environment assignments before the program
            if command:
                yield command
            command = []
        else:
            command.append(token)


def _check(command: list[str], parser, whole: bool = True) -> str | None:
    program, args = command[0], command[1:]
    if program.endswith("bin/heed") or program == "heed":
        if not whole:
            return _names_exist(args, parser, shlex.join(command))
        try:
            parser.parse_args(args)
        except SystemExit:
            return f"`{shlex.join(command)}` does not parse with the heed CLI"
    elif program == "bash" and args and args[0].startswith("scripts/"):
        if not (ROOT / args[0]).is_file():
            return f"{args[0]} does not exist"
    elif program.endswith("python") and args[:1] == ["-m"] and args[1].startswith("bench."):
        if not (ROOT / (args[1].replace(".", "/") + ".py")).is_file():
            return f"module {args[1]} does not exist"
    elif program == "make" and args:
        targets = re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M)
        if args[0] not in targets:
            return f"make target {args[0]} does not exist"
    return None


def _names_exist(args: list[str], parser, shown: str) -> str | None:
    """The subcommands and options a prose mention names exist (``heed launch --resume``)."""
    import argparse

    for token in args:
        subparsers = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if token.startswith("-"):
            if token.split("=", 1)[0] not in parser._option_string_actions:
                return f"`{shown}`: no option {token}"
        elif subparsers:
            if token not in subparsers[0].choices:
                return f"`{shown}`: no subcommand {token}"
            parser = subparsers[0].choices[token]
        else:
            return None  # an argument value: what follows is not a name
    return None


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_command_shown_exists(page, capsys):
    from rl.cli import build_parser

    parser = build_parser()
    problems = [p for c, whole in _commands(page.read_text()) if (p := _check(c, parser, whole))]
    capsys.readouterr()  # argparse's own messages
    assert problems == [], f"{page.name}: {problems}"


def test_the_checks_catch_what_they_are_for(capsys):
    import doctest
    import sys

    from rl.cli import build_parser

    assert doctest.testmod(sys.modules[__name__]).failed == 0  # slug()

    parser = build_parser()
    assert _check(["heed", "serve", "x", "--port", "1"], parser) is None
    assert _check([".venv/bin/heed", "evaluate", "x"], parser) is not None  # no such subcommand
    assert _check(["heed", "eval", "x", "--no-such-option"], parser) is not None
    assert _check(["bash", "scripts/nowhere.sh"], parser) is not None
    assert _check(["python", "-m", "bench.nowhere"], parser) is not None
    assert _check(["heed", "launch", "--resume"], parser, whole=False) is None  # named in prose
    assert _check(["heed", "launch", "--resumes"], parser, whole=False) is not None
    assert _check(["heed", "budget"], parser, whole=False) is not None
    capsys.readouterr()
    assert _cited_paths("see `rl/serving/command.py` and `rl/config*.py`, `runs/tiny`") == {
        "rl/serving/command.py"
    }
    assert list(_split("HEED_EXTRAS=gpu,dev bash scripts/setup_venv.sh && .venv/bin/heed train  # note")) == [
        ["bash", "scripts/setup_venv.sh"],
        [".venv/bin/heed", "train"],
    ]
