#!/usr/bin/env python3
"""Lists the longest functions in the given folders (clang-formatted C++ assumed).

A function is a definition whose body opens with "{" at the end of a line and closes with a "}"
at the same indentation as its first line; lambdas and local classes count toward the enclosing
function. Exit status 1 if any function is longer than --max lines (body and signature included),
or if a file is longer than --max-file-lines without a sentence in its header (the .h of the
same name, for a .cc) that starts "One concept in a long file" and says why it is one concept.

  scripts/function_lengths.py [--max N] [--max-file-lines N] [--top K] FOLDER...
"""
import argparse
import os
import re
import sys

# A line that starts a function definition: not a control statement, a class, a namespace or an
# initializer, ends with "{" and contains a parameter list.
START = re.compile(r"^(\s*)(?!(if|for|while|switch|do|else|namespace|class|struct|enum|union|"
                   r"extern|return|case|try|catch)\b)[^;#/]*\)[^;]*\{\s*$")
SIGNATURE_START = re.compile(r"^\s*[A-Za-z_~][\w:<>,\s\*&~]*[\w>]\s*[\w:~]*\(")


def functions(path):
    lines = open(path, encoding="utf-8", errors="replace").read().split("\n")
    out = []
    i = 0
    while i < len(lines):
        m = START.match(lines[i])
        if not m or lines[i].lstrip().startswith(("}", ":", ".", "[", "(")) or "=" in lines[i].split("(")[0]:
            i += 1
            continue
        # The signature may start a few lines up (wrapped parameters).
        first = i
        while first > 0 and lines[first - 1].strip() and not lines[first - 1].rstrip().endswith(
                (";", "}", "{", "*/", ":")) and not lines[first - 1].lstrip().startswith(("//", "#")):
            first -= 1
        indent = re.match(r"^(\s*)", lines[first]).group(1)
        end = i + 1
        while end < len(lines) and not (lines[end].startswith(indent + "}") and
                                        not lines[end].startswith(indent + " ")):
            end += 1
        name = re.sub(r"\s+", " ", " ".join(l.strip() for l in lines[first:i + 1]))
        out.append((end - first + 1, path, first + 1, name[:100]))
        i = end + 1
    return out


LONG_FILE_SENTENCE = "One concept in a long file"


def long_files(folder, max_lines):
    """Files over `max_lines` lines whose header does not say why they are one concept."""
    out = []
    for d, _, files in os.walk(folder):
        for f in files:
            if not f.endswith((".cc", ".h")):
                continue
            path = os.path.join(d, f)
            lines = open(path, encoding="utf-8", errors="replace").read().count("\n")
            if lines <= max_lines:
                continue
            header = os.path.splitext(path)[0] + ".h"
            text = open(header, encoding="utf-8", errors="replace").read() if os.path.exists(
                header) else ""
            if LONG_FILE_SENTENCE not in text:
                out.append((lines, path))
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--max", type=int, default=0)
    parser.add_argument("--max-file-lines", type=int, default=0)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("folders", nargs="+")
    args = parser.parse_args()
    found = []
    for folder in args.folders:
        for d, _, files in os.walk(folder):
            for f in files:
                if f.endswith(".cc"):
                    found += functions(os.path.join(d, f))
    found.sort(reverse=True)
    for length, path, line, name in found[:args.top]:
        print(f"{length:5d}  {path}:{line}  {name}")
    too_long = [f for f in found if args.max and f[0] > args.max]
    failed = 0
    if too_long:
        print(f"{len(too_long)} function(s) longer than {args.max} lines")
        failed = 1
    if args.max_file_lines:
        for folder in args.folders:
            for lines, path in long_files(folder, args.max_file_lines):
                print(f"{path}: {lines} lines, and its header does not say why it is one concept "
                      f"(a sentence starting \"{LONG_FILE_SENTENCE}\")")
                failed = 1
    return failed


if __name__ == "__main__":
    sys.exit(main())
