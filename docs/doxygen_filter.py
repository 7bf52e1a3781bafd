#!/usr/bin/env python3
"""Doxygen input filter: typegrad's headers document their public names with plain `//`
comments (the project's style). This filter hands Doxygen a copy in which

- the comment block that opens a header (after `#pragma once` / the include guard) becomes the
  file's documentation (`/// \\file`), and
- a block of full-line `//` comments directly above a declaration (template, struct, class,
  enum, using, inline/constexpr variables and functions, data members, macros) becomes a `///`
  block, and
- a `//` comment after a one-line data member or enumerator (`double lr = 1e-3;  // text`,
  `relu,  // text`) becomes a `///<` comment on it,

- a comment above the invocation of a `TYPEGRAD_DETAIL_*` macro that defines public functions
  (expanded by Doxygen, docs/Doxyfile.in) documents every function the invocation defines: the
  invocation becomes a member group, whose first member's comment the others share
  (DISTRIBUTE_GROUP_DOC),

so the reference shows the comments the code already has. Runs of lines indented by two spaces
or more after `// ` (the headers' code examples) become `\code` blocks. Other comments after code stay plain;
Doxygen ignores the ones inside function bodies (HIDE_IN_BODY_DOCS).
Usage (by Doxygen): doxygen_filter.py <header>"""
import re
import sys

DECL = re.compile(r"^\s*(template\b|struct\b|class\b|enum\b|using\b|inline\b|constexpr\b|consteval\b|"
                  r"static\b|auto\b|friend\b|explicit\b|\[\[|#define\b|"
                  # functions and operators (`type name(`), constructors (`name(`), data members
                  r"[A-Za-z_][\w:<>, ]*[\s&*]+(operator\b[^(]*|[A-Za-z_]\w*)\s*\(|~?[A-Za-z_]\w*\s*\(|"
                  r"[A-Za-z_][\w:<>, ]*[\s&*]+[A-Za-z_]\w*\s*(\[[^]]*\]\s*)?(\{[^;]*\}\s*)?(=[^;]*)?;)")
COMMENT = re.compile(r"^(\s*)//(?!/)\s?(.*)$")
MACRO_CALL = re.compile(r"^\s*TYPEGRAD_DETAIL_[A-Z0-9_]+\(.*\)\s*$")
# a data member (`type name [= init];`) or an enumerator (`name [= value],`) with a comment after it
TRAILING = re.compile(r"^(\s*(?:[A-Za-z_][\w:<>, ]*[\s&*]+[A-Za-z_]\w*\s*(?:\[[^]]*\]\s*)?(?:=[^;/]*)?;"
                      r"|[A-Za-z_]\w*\s*(?:=\s*[^,/]+)?,))\s*//(?!/)\s?(.*)$")


def doc_block(block):
    """A comment block as /// lines, its indented runs (code examples) inside \\code ... \\endcode."""
    out = []
    in_code = False
    for indent, text in block:
        code = text.startswith("  ")
        if code != in_code:
            out.append(f"{indent}/// " + ("\\code" if code else "\\endcode"))
            in_code = code
        out.append(f"{indent}/// {text}")
    if in_code:
        out.append(f"{block[-1][0]}/// \\endcode")
    return out


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
                out.extend(doc_block(block))
            elif MACRO_CALL.match(line):
                out.append(f"{block[0][0]}///@{{")
                out.extend(doc_block(block))
                out.append(line)
                out.append(f"{block[0][0]}///@}}")
                block = []
                continue
            elif DECL.match(line) and not stripped.startswith("return"):
                out.extend(doc_block(block))
            else:
                out.extend(f"{indent}// {text}" for indent, text in block)
            block = []
        if stripped and not stripped.startswith("#pragma once") and not stripped.startswith("#ifndef") \
                and not stripped.startswith("#define TYPEGRAD_") or stripped.startswith("#include"):
            seen_code = True
        t = TRAILING.match(line)
        if t and not stripped.startswith("return"):
            line = f"{t.group(1)}  ///< {t.group(2)}"
        out.append(line)
    out.extend(f"{indent}// {text}" for indent, text in block)
    sys.stdout.write("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1])
