#!/usr/bin/env python3
"""Doxygen input filter: typegrad's headers document their public names with plain `//`
comments (the project's style). This filter hands Doxygen a copy in which

- the comment block that opens a header (after `#pragma once` / the include guard) becomes the
  file's documentation (`/// \\file`), and
- a block of full-line `//` comments directly above a declaration (template, struct, class,
  enum, using, inline/constexpr variables and functions, macros) becomes a `///` block,

so the reference shows the comments the code already has. Comments inside bodies and after
code stay plain.
Usage (by Doxygen): doxygen_filter.py <header>"""
import re
import sys

DECL = re.compile(r"^\s*(template\b|struct\b|class\b|enum\b|using\b|inline\b|constexpr\b|consteval\b|"
                  r"static\b|auto\b|friend\b|explicit\b|\[\[|#define\b|[A-Za-z_][\w:<>, ]*[\s&*]+[A-Za-z_]\w*\s*\()")
COMMENT = re.compile(r"^(\s*)//(?!/)\s?(.*)$")


def main(path):
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    out = []
    block = []          # pending full-line comments: (indent, text)
    seen_code = False   # past the file's opening comment block
    for line in lines:
        m = COMMENT.match(line)
        if m:
            block.append(m.groups())
            continue
        stripped = line.strip()
        if block:
            if not seen_code and (stripped.startswith("#include") or stripped == ""
                                  or stripped.startswith("#")):
                # the header's own description: the file's documentation (one line more)
                out.append("/// \\file")
                out.extend(f"{indent}/// {text}" for indent, text in block)
            elif DECL.match(line) and not stripped.startswith("return"):
                out.extend(f"{indent}/// {text}" for indent, text in block)
            else:
                out.extend(f"{indent}// {text}" for indent, text in block)
            block = []
        if stripped and not stripped.startswith("#pragma once") and not stripped.startswith("#ifndef") \
                and not stripped.startswith("#define TYPEGRAD_") or stripped.startswith("#include"):
            seen_code = True
        out.append(line)
    out.extend(f"{indent}// {text}" for indent, text in block)
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])
