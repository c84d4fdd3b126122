#!/usr/bin/env python3
"""Checks that dependencies point one way (DEVELOPERS' architecture, docs/layout.md).

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
    # The wire protocol; code_chunk_framing and requested_point see codec/'s libtorch side.
    "proto": ["base", "tokenizer", "model", "codec"],
    # The serving runtime on the wire: the checked public front, event streams, serving metrics,
    # the load generator. Torch-free (codec/: only the torch-free transfer_mode).
    "serving": ["base", "tokenizer", "codec", "proto"],
    # Bytes and frames only: never models or codecs.
    "transport": ["base", "proto"],
    # The daemons' libraries. Producer and consumer meet only through transport and proto; the
    # coordinator routes without models (torch-free: codec/transfer_mode, wire_dtype, frontier).
    "producer": ["base", "tokenizer", "model", "codec", "proto", "serving", "transport"],
    "consumer": ["base", "tokenizer", "model", "codec", "proto", "serving", "transport"],
    "coordinator": ["base", "tokenizer", "codec", "proto", "serving", "transport"],
    # Front ends and harnesses sit on top and may use everything.
    "tools": None,
    "bench": None,
    "tests": None,
}
TORCH_FREE = {"base", "tokenizer", "serving", "transport", "coordinator"}
# transport/ holds the interface, sessions and shared mechanisms; each backend its own subfolder.
# A backend sees the core and itself, never another backend; the core sees no backend except in
# the factory; the services see no backend at all (they pick one through CreateTransport).
TRANSPORT_BACKENDS = {"inproc", "grpc", "ucx"}
TRANSPORT_FACTORY = "transport/transport_factory.cc"
SERVICES = {"producer", "consumer", "coordinator"}
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
                    # Generated protocol headers ("scd/v1/x.pb.h", protoc run with proto/ as the
                    # include root) belong to proto/.
                    if top == "scd" and target.endswith(".pb.h"):
                        target, top = "proto/" + target, "proto"
                    if folder in TORCH_FREE and target.startswith(TORCH_PREFIXES):
                        out.append(f"{rel}:{lineno}: {folder}/ is torch-free but includes "
                                   f"<{target}>")
                    # transport/ sees only the generated protocol, never proto/'s codec framing.
                    if folder == "transport" and top == "proto" and not target.endswith(".pb.h"):
                        out.append(f"{rel}:{lineno}: transport/ may include only generated "
                                   f"proto/*.pb.h, not {target}")
                    out.extend(transport_violations(folder, rel, lineno, target))
                    if allowed is None or "/" not in target or top not in project:
                        continue
                    if top != folder and top not in allowed:
                        out.append(f"{rel}:{lineno}: {folder}/ may not include {target} "
                                   f"({folder}/ may use: {', '.join(allowed) or 'nothing'})")
    return out


def transport_backend(path):
    """The backend subfolder of a transport/ path ("ucx" for transport/ucx/x.h), "" for the core,
    None outside transport/."""
    parts = path.replace(os.sep, "/").split("/")
    if parts[0] != "transport":
        return None
    return parts[1] if len(parts) > 2 else ""


def transport_violations(folder, rel, lineno, target):
    out = []
    to_backend = transport_backend(target)
    from_backend = transport_backend(rel)
    if from_backend and from_backend not in TRANSPORT_BACKENDS:
        out.append(f"{rel}:{lineno}: transport/{from_backend}/ is no backend folder the layering "
                   f"check knows ({', '.join(sorted(TRANSPORT_BACKENDS))})")
    if not to_backend:
        return out
    where = f"{rel}:{lineno}: "
    if from_backend and to_backend != from_backend:
        out.append(where + f"backend transport/{from_backend}/ may not include another backend's "
                   f"{target}")
    elif from_backend == "" and rel.replace(os.sep, "/") != TRANSPORT_FACTORY:
        out.append(where + f"the transport core may not include the backend header {target} "
                   f"(only {TRANSPORT_FACTORY} picks backends)")
    elif folder in SERVICES:
        out.append(where + f"{folder}/ may not include the backend header {target} (choose a "
                   f"backend with transport/transport.h's CreateTransport)")
    return out


def self_test():
    cases = [
        ({"base/a.h": '#include "base/b.h"\n', "model/m.cc": '#include "codec/x.h"\n'}, 1),
        ({"tokenizer/t.cc": "#include <ATen/ATen.h>\n"}, 1),
        ({"transport/t.cc": '#include "proto/code_chunk_framing.h"\n'}, 1),
        ({"transport/t.cc": '#include "scd/v1/transfer.pb.h"\n'}, 0),
        ({"base/a.h": '#include "tokenizer/t.h"\n'}, 1),
        ({"base/a.cc": '#include "scd/v1/inference.pb.h"\n'}, 1),
        ({"weird/w.cc": "int x;\n"}, 1),
        ({"codec/c.cc": '#include "model/m.h"\n#include "base/b.h"\n#include <ATen/ATen.h>\n',
          "tools/t.cc": '#include "calib/c.h"\n'}, 0),
        ({"transport/ucx/u.cc": '#include "transport/grpc/g.h"\n'}, 1),
        ({"transport/ucx/u.cc": '#include "transport/ucx/c.h"\n#include "transport/lane_queue.h"\n',
          "transport/transport_factory.cc": '#include "transport/ucx/ucx_transport.h"\n'}, 0),
        ({"transport/link_shaper.cc": '#include "transport/grpc/grpc_link.h"\n'}, 1),
        ({"producer/p.cc": '#include "transport/ucx/ucx_transport.h"\n'}, 1),
        ({"transport/rdma/r.cc": '#include "transport/frame.h"\n'}, 1),
        ({"tests/t.cc": '#include "transport/grpc/chunk_codec.h"\n'}, 0),
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
