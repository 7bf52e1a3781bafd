#!/usr/bin/env python3
"""Inserts doc comments listed in a Markdown file into the headers (used for
docs/pending_doc_comments.md: comments for headers another change was editing).

Inside each ```text block of the file:
    @@ include/typegrad/autodiff/step.hpp      the header (relative to the repository root)
    > struct wrt_t {                           the next line (from the previous anchor on) whose
                                               stripped text starts with this anchor (the comment
                                               goes above its template header and requires-clause)
    // The leaves to differentiate ...         comment lines inserted above that line, indented
    // ...                                     like it
    >> // compile<Policies...>(loss, ...   as `>`, but the `//` block directly above the anchor
                                               (its first line given here) is replaced
    => std::string joint, forward, backward;   the anchor line itself is replaced by the lines
    | std::string joint;                       given with `| ` (indented like the anchor)
An anchor already preceded by exactly these comment lines is left alone, so a second run changes
nothing. A missing anchor is an error (exit status 1) and nothing is written.
Usage: apply_doc_comments.py FILE.md [REPO_ROOT]"""
import pathlib
import re
import sys


def parse(md):
    edits = {}          # file -> [(mode, anchor, [lines])]
    current = None
    in_block = False
    for line in md.split("\n"):
        if line.startswith("```"):
            in_block = line.strip() == "```text" if not in_block else False
            continue
        if not in_block:
            continue
        if line.startswith("@@ "):
            current = edits.setdefault(line[3:].strip(), [])
        elif line.startswith(("> ", ">> ", "=> ")):
            mode, anchor = line.split(" ", 1)
            current.append((mode, anchor.strip(), []))
        elif line.startswith("| "):
            current[-1][2].append(line[2:])
        elif line.strip().startswith("//"):
            current[-1][2].append(line.strip())
    return edits


def apply(root, edits):
    out = {}
    for name, items in edits.items():
        lines = (root / name).read_text(encoding="utf-8").split("\n")
        pos = 0
        for mode, anchor, comment in items:
            i = next((k for k in range(pos, len(lines)) if lines[k].strip().startswith(anchor)), None)
            if i is None and mode == "=>" and comment:   # replaced by an earlier run?
                first = next((k for k in range(pos, len(lines)) if lines[k].strip() == comment[0].strip()), None)
                if first is not None and [x.strip() for x in lines[first:first + len(comment)]] == \
                        [c.strip() for c in comment]:
                    pos = first + len(comment)
                    continue
            if i is None:
                sys.exit(f"{name}: no line starting with '{anchor}' after line {pos + 1}")
            after = len(lines) - i      # the anchor's distance from the end survives insertions
            indent = re.match(r"\s*", lines[i]).group(0)
            block = [indent + c for c in comment]
            if mode == "=>":        # replace the anchor line
                lines[i:i + 1] = block
                pos = i + len(block)
                continue
            # a declaration's template header and requires-clause (over one line or several) go
            # with it: insert above them
            j = i
            while j > 0 and lines[j - 1].strip() and not lines[j - 1].lstrip().startswith(("#", "//")) \
                    and not lines[j - 1].rstrip().endswith((";", "{", "}", ":")):
                j -= 1
            if any(re.match(r"\s*(template\s*<|requires\b)", lines[k]) for k in range(j, i)):
                i = j
            indent = re.match(r"\s*", lines[i]).group(0)
            block = [indent + c for c in comment]
            if mode == ">>":        # replace the comment block above the anchor
                start = i
                while start > 0 and lines[start - 1].strip().startswith("//"):
                    start -= 1
                del lines[start:i]
                i = start
            if lines[max(i - len(block), 0):i] != block:
                lines[i:i] = block
            pos = len(lines) - after + 1
        out[name] = "\n".join(lines)
    for name, text in out.items():
        (root / name).write_text(text, encoding="utf-8")


if __name__ == "__main__":
    md = pathlib.Path(sys.argv[1]).read_text(encoding="utf-8")
    root = pathlib.Path(sys.argv[2] if len(sys.argv) > 2 else ".")
    apply(root, parse(md))
