#!/usr/bin/env python3
"""Checks that every relative link of the project's operator and test documentation resolves (issue 31).

  check_docs_links.py --source-dir DIR [FILE.md ...]

Without files: README.md, docs/*.md, daemonset/README.md, tests/README.md, tests/bench/README.md and
tests/deploy/records/*.md under DIR. For each inline link `[text](target)` and reference definition
`[label]: target` outside code (fenced blocks, indented blocks, code spans):

- a target with a scheme (https:, mailto:) is not checked: this is about the tree, not the network;
- a path must exist, relative to the file that links it (a file or a directory);
- an anchor (`#part`, alone or after a .md path) must be a heading of that Markdown file, by GitHub's rule:
  the heading's text lower-cased, every character that is not a letter, digit, space, '-' or '_' dropped,
  spaces turned into '-', and a repeated heading suffixed -1, -2, ... in order.

Every broken link is printed as file:line; exit 1 if any, 0 otherwise. Python 3 standard library only.
"""
import argparse
import glob
import os
import re
import sys

DEFAULT_FILES = ["README.md", "docs/*.md", "daemonset/README.md", "tests/README.md", "tests/bench/README.md",
                 "tests/deploy/records/*.md"]

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_LINK = re.compile(r"\[[^\]\[]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
CODE_SPAN = re.compile(r"(`+)(.+?)\1")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def prose_lines(text):
    """(line number, line) of every line outside code blocks, code spans blanked out."""
    in_fence = None
    previous_blank = True
    in_indented = False
    for number, line in enumerate(text.splitlines(), start=1):
        fence = FENCE.match(line)
        if in_fence:
            if fence and fence.group(1) == in_fence:
                in_fence = None
            continue
        if fence:
            in_fence = fence.group(1)
            continue
        blank = not line.strip()
        # An indented code block starts after a blank line with 4 spaces or a tab; list items continue with
        # indented prose too, so only a line after a blank one that is not a list item's text is taken as code.
        indented = line.startswith("    ") or line.startswith("\t")
        if in_indented and not blank and not indented:
            in_indented = False
        if previous_blank and indented and not re.match(r"^\s*([-*+]|\d+[.)])\s", line):
            in_indented = True
        previous_blank = blank
        if in_indented or blank:
            continue
        yield number, CODE_SPAN.sub(lambda m: m.group(1) + "x" * len(m.group(2)) + m.group(1), line)


def slug(heading):
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.strip().lower()
    text = "".join(c for c in text if c.isalnum() or c in " -_")
    return text.replace(" ", "-")


_anchor_cache = {}


def anchors(path):
    if path not in _anchor_cache:
        with open(path, encoding="utf-8") as f:
            text = f.read()
        found, seen = set(), {}
        in_fence = None
        for line in text.splitlines():
            fence = FENCE.match(line)
            if in_fence:
                if fence and fence.group(1) == in_fence:
                    in_fence = None
                continue
            if fence:
                in_fence = fence.group(1)
                continue
            m = HEADING.match(line)
            if not m:
                continue
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        # Explicit HTML anchors: <a name="x"> or id="x".
        for m in re.finditer(r"<a\s+(?:name|id)=\"([^\"]+)\"", text):
            found.add(m.group(1))
        _anchor_cache[path] = found
    return _anchor_cache[path]


def check_file(path, root):
    problems = []
    with open(path, encoding="utf-8") as f:
        text = f.read()
    # Code blanked out, line numbers kept: a link's text may run over a line break.
    lines = [""] * (text.count("\n") + 1)
    for number, line in prose_lines(text):
        lines[number - 1] = line
    prose = "\n".join(lines)
    found = [(prose.count("\n", 0, m.start(1)) + 1, m.group(1)) for m in INLINE_LINK.finditer(prose)]
    for number, line in enumerate(lines, start=1):
        ref = REFERENCE_DEF.match(line)
        if ref:
            found.append((number, ref.group(1)))
    for number, target in sorted(found):
        if SCHEME.match(target):
            continue
        where = f"{os.path.relpath(path, root)}:{number}: {target}"
        file_part, _, anchor = target.partition("#")
        if file_part:
            resolved = os.path.normpath(os.path.join(os.path.dirname(path), file_part))
            if not os.path.exists(resolved):
                problems.append(f"{where}: {os.path.relpath(resolved, root)} does not exist")
                continue
        else:
            resolved = path
        if not anchor:
            continue
        if os.path.isdir(resolved) or not resolved.endswith(".md"):
            problems.append(f"{where}: an anchor into {os.path.relpath(resolved, root)}, which is no Markdown file")
            continue
        if anchor not in anchors(resolved):
            problems.append(f"{where}: no heading #{anchor} in {os.path.relpath(resolved, root)}")
    return problems, len(found)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--source-dir", required=True)
    parser.add_argument("files", nargs="*", help="Markdown files (default: the operator and test docs)")
    args = parser.parse_args()
    root = os.path.abspath(args.source_dir)
    files = [os.path.abspath(f) for f in args.files]
    if not files:
        for pattern in DEFAULT_FILES:
            matched = sorted(glob.glob(os.path.join(root, pattern)))
            if not matched and "*" not in pattern:
                print(f"missing: {pattern}")
                return 1
            files.extend(matched)
    problems, links = [], 0
    for path in files:
        broken, count = check_file(path, root)
        problems.extend(broken)
        links += count
    for problem in problems:
        print(problem)
    print(f"{len(files)} files, {links} links, {len(problems)} broken")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
