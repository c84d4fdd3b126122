#!/usr/bin/env python3
"""Every sleep in the tests says why it is there (issue 49: waits on events, not on timers).

A sleep (absl::SleepFor/SleepUntil, std::this_thread::sleep_for, usleep, time.sleep) in tests/
must carry, in the comment right above it, one of two tags:
  // paces: ...   time passing is the scenario (a slow reader, arrivals spaced out, a sampler's
                  period, the clock under test): it waits for nothing
  // waits: ...   a wait for something that has no event to wait on; says what and why not
Anything else is a defect: wait on the event instead (base/change_notice.h, a node's Stats long
poll, a Notification, a recorder's WaitFor...). At most --max-waits `waits:` may remain.

  test_sleeps.py [--max-waits N] [--list] TESTS_DIR
  test_sleeps.py --self-test
"""
import argparse
import os
import re
import sys

SLEEP = re.compile(r"\b(SleepFor|SleepUntil|sleep_for|usleep|time\.sleep)\s*\(")
TAG = re.compile(r"//\s*(paces|waits):|#\s*(paces|waits):")


def classify(lines):
    """Yields (line_number, kind) for each sleep: kind is 'paces', 'waits' or None."""
    for i, line in enumerate(lines):
        code = line.split("//", 1)[0]
        if not SLEEP.search(code) or re.search(r"\b(void|bool)\s+\w*Sleep", code):
            continue
        kind = None
        j = i - 1  # the comment block right above (a continued comment is part of it)
        while j >= 0 and lines[j].strip().startswith(("//", "#")):
            m = TAG.search(lines[j])
            if m:
                kind = m.group(1) or m.group(2)
            j -= 1
        yield i + 1, kind


def scan(root):
    found = []
    for folder, _, files in os.walk(root):
        for name in sorted(files):
            if not name.endswith((".cc", ".h", ".py", ".mjs", ".sh")):
                continue
            path = os.path.join(folder, name)
            with open(path, encoding="utf-8") as f:
                lines = f.read().split("\n")
            for number, kind in classify(lines):
                found.append((path, number, kind))
    return found


def self_test():
    sample = [
        "  absl::SleepFor(absl::Milliseconds(5));",
        "  // paces: a slow reader",
        "  absl::SleepFor(x);",
        "  // waits: the etcd server; it signals nothing",
        "  //   else",
        "  for (;;) absl::SleepFor(y);",
        "  // an ordinary comment",
        "  usleep(5);",
        "  int no_sleep_here = 0;  // SleepFor(1) in a comment",
    ]
    got = list(classify(sample))
    want = [(1, None), (3, "paces"), (6, "waits"), (8, None)]
    if got != want:
        print(f"self-test: got {got}, want {want}")
        return 1
    print("test_sleeps self-test passed")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", nargs="?")
    parser.add_argument("--max-waits", type=int, default=20)
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test()
    found = scan(args.root)
    untagged = [(p, n) for p, n, k in found if k is None]
    waits = [(p, n) for p, n, k in found if k == "waits"]
    paces = [(p, n) for p, n, k in found if k == "paces"]
    if args.list:
        for p, n, k in found:
            print(f"{p}:{n}: {k}")
    print(f"test sleeps: {len(found)} ({len(paces)} pace, {len(waits)} wait, "
          f"{len(untagged)} untagged); at most {args.max_waits} waits")
    for p, n in untagged:
        print(f"{p}:{n}: a sleep without `// paces:` or `// waits:` above it: wait on an event")
    if untagged or len(waits) > args.max_waits:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
