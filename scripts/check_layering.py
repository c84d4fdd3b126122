#!/usr/bin/env python3
"""Checks that dependencies point one way (DEVELOPERS' architecture, README "Layout").

Every source folder may include only the project folders listed for it below, and the torch-free
folders may not include libtorch at all. Run by every build (CMake target scd_layering) and by the
test suite (ctest -R layering). Exit status 1 and one line per violation when the rules are broken.

  scripts/check_layering.py [ROOT]     check the tree at ROOT (default: this checkout)
  scripts/check_layering.py --self-test
"""
import os
import re
import sys
import tempfile

# Folder -> project folders its files may include. Lower layers never include upper ones.
ALLOWED = {
    "base": [],
    "tokenizer": ["base"],
    "model": ["base", "tokenizer"],
    "codec": ["base", "tokenizer", "model"],
    "calib": ["base", "tokenizer", "model", "codec"],
    # The wire protocol; its codec framing (code_chunk_framing) is the one file that sees codec/.
    "proto": ["base", "tokenizer", "model", "codec"],
    # Bytes and frames only: never models or codecs.
    "transport": ["base", "proto"],
    # The daemons' libraries. Producer and consumer meet only through transport and proto; the
    # coordinator routes without models (torch-free; codec/transfer_mode only).
    "producer": ["base", "tokenizer", "model", "codec", "proto", "transport"],
    "consumer": ["base", "tokenizer", "model", "codec", "proto", "transport"],
    "coordinator": ["base", "tokenizer", "codec", "proto", "transport"],
    # Front ends and harnesses sit on top and may use everything.
    "tools": None,
    "bench": None,
    "tests": None,
}
TORCH_FREE = {"base", "tokenizer", "transport", "coordinator"}
TORCH_PREFIXES = ("torch/", "ATen/", "c10/", "caffe2/")
SOURCE_SUFFIXES = (".h", ".cc", ".hpp", ".cpp")
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def violations(root):
    out = []
    project = set(ALLOWED)
    for folder in sorted(os.listdir(root)):
        path = os.path.join(root, folder)
        if folder.startswith(".") or folder.startswith("build") or not os.path.isdir(path):
            continue
        sources = [os.path.join(d, f) for d, _, files in os.walk(path) for f in files
                   if f.endswith(SOURCE_SUFFIXES)]
        if not sources:
            continue
        if folder not in ALLOWED:
            out.append(f"{folder}/: source folder missing from scripts/check_layering.py's map")
            continue
        allowed = ALLOWED[folder]
        for src in sorted(sources):
            rel = os.path.relpath(src, root)
            with open(src, encoding="utf-8", errors="replace") as f:
                for lineno, line in enumerate(f, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    target = m.group(2)
                    top = target.split("/", 1)[0]
                    if folder in TORCH_FREE and target.startswith(TORCH_PREFIXES):
                        out.append(f"{rel}:{lineno}: {folder}/ is torch-free but includes "
                                   f"<{target}>")
                    # transport/ sees only the generated protocol, never proto/'s codec framing.
                    if folder == "transport" and top == "proto" and not target.endswith(".pb.h"):
                        out.append(f"{rel}:{lineno}: transport/ may include only generated "
                                   f"proto/*.pb.h, not {target}")
                    if allowed is None or "/" not in target or top not in project:
                        continue
                    if top != folder and top not in allowed:
                        out.append(f"{rel}:{lineno}: {folder}/ may not include {target} "
                                   f"({folder}/ may use: {', '.join(allowed) or 'nothing'})")
    return out


def self_test():
    cases = [
        ({"base/a.h": '#include "base/b.h"\n', "model/m.cc": '#include "codec/x.h"\n'}, 1),
        ({"tokenizer/t.cc": "#include <ATen/ATen.h>\n"}, 1),
        ({"transport/t.cc": '#include "proto/code_chunk_framing.h"\n'}, 1),
        ({"transport/t.cc": '#include "proto/scd/v1/transfer.pb.h"\n'}, 0),
        ({"base/a.h": '#include "tokenizer/t.h"\n'}, 1),
        ({"weird/w.cc": "int x;\n"}, 1),
        ({"codec/c.cc": '#include "model/m.h"\n#include "base/b.h"\n#include <ATen/ATen.h>\n',
          "tools/t.cc": '#include "calib/c.h"\n'}, 0),
    ]
    for files, expected in cases:
        with tempfile.TemporaryDirectory() as root:
            for name, text in files.items():
                os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
                with open(os.path.join(root, name), "w") as f:
                    f.write(text)
            got = violations(root)
            if len(got) != expected:
                print(f"self-test failed for {sorted(files)}: expected {expected} "
                      f"violation(s), got {got}")
                return 1
    print(f"check_layering self-test: {len(cases)} cases passed")
    return 0


def main(argv):
    if len(argv) > 1 and argv[1] == "--self-test":
        return self_test()
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    found = violations(root)
    for v in found:
        print(f"layering: {v}")
    if found:
        print(f"layering: {len(found)} violation(s); see scripts/check_layering.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
