#!/usr/bin/env python3
"""The docs test (ctest docs_test): every fenced block in README.md and docs/*.md says what it is
in its info string, and is checked by what it is, so no command shown goes stale.

  ```text                 output shown, not a command: not checked
  ```sh                   run: bash -euo pipefail in a sandbox (a directory with the repository's
                          top-level entries linked, ../shared beside it, so files a command writes
                          land in the sandbox; build/demo/ holds the demo pair's artifact, fitted
                          small), its own process group, killed at the end; exit 0
  ```sh needs=WHAT        what this machine cannot run (WHAT: gpu, cluster, docker -- a Docker
                          engine; make compose-test runs the compose sequence through podman):
                          bash -n, and every flag checked as below
  ```synopsis             a usage line with placeholders: every flag checked as below
  ```toml BINARY          a config file: parsed (tomllib), every key one of BINARY's long flags
Flags: a command build/bin/NAME [SUBCOMMAND] is checked against NAME [SUBCOMMAND] --help (every
--flag it uses is offered there); `make TARGET` against the Makefile's targets. And
docs/configuration.md must be what scripts/config_reference.py generates from the daemons' --help.

  scripts/docs_check.py --build BUILD --shared SHARED [FILE.md ...]     exit 0: every block held
  scripts/docs_check.py --self-test                                      the checker's own cases
"""
import argparse
import functools
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KINDS = ("text", "sh", "synopsis", "toml")
NEEDS = ("gpu", "cluster", "docker")
RUN_TIMEOUT_S = 600


def blocks(path):
    """(line, info, body) of every fenced block."""
    out, info, body, start = [], None, [], 0
    with open(path) as f:
        for number, line in enumerate(f, 1):
            if line.startswith("```"):
                if info is None:
                    info, body, start = line[3:].strip(), [], number
                else:
                    out.append((start, info, "".join(body)))
                    info = None
            elif info is not None:
                body.append(line)
    if info is not None:
        out.append((start, info, "".join(body) + "\0unclosed"))
    return out


def commands(body):
    """The simple commands of a shell text: continuation lines joined, comments dropped, split at
    ; && || | &; each a list of words (placeholders such as [--flag] kept as written)."""
    text = re.sub(r"\\\n", " ", body)
    out = []
    for line in text.splitlines():
        try:
            lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|")
            lexer.whitespace_split = True
            lexer.commenters = "#"
            words = list(lexer)
        except ValueError:
            words = line.split()
        current = []
        for word in words:
            if word and set(word) <= set(";&|"):
                if current:
                    out.append(current)
                current = []
            else:
                current.append(word)
        if current:
            out.append(current)
    return out


@functools.lru_cache(maxsize=None)
def help_text(binary, sub):
    args = [binary] + ([sub] if sub else []) + ["--help"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr


def subcommands(text):
    if "Subcommands:" not in text:
        return set()
    section = text.split("Subcommands:", 1)[1]
    return {line.split()[0] for line in section.splitlines() if line.startswith("  ") and line.split()}


@functools.lru_cache(maxsize=None)
def make_targets():
    with open(os.path.join(ROOT, "Makefile")) as f:
        return {m.group(1) for m in re.finditer(r"^([A-Za-z0-9_.-]+):", f.read(), re.M)}


def check_flags(body, build):
    """Problems with the flags and targets the commands of `body` use."""
    problems = []
    for words in commands(body):
        while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):  # VAR=value cmd
            words = words[1:]
        if not words:
            continue
        if words[0] == "make":
            for target in (w for w in words[1:] if not w.startswith("-") and "=" not in w):
                if target not in make_targets():
                    problems.append(f"make {target}: no such target in the Makefile")
            continue
        match = re.match(r"^(?:\./)?build/bin/([a-z0-9-]+)$", words[0])
        if not match:
            continue
        binary = os.path.join(build, "bin", match.group(1))
        if not os.access(binary, os.X_OK):
            problems.append(f"{words[0]}: not built")
            continue
        sub = words[1] if len(words) > 1 and words[1] in subcommands(help_text(binary, None)) else None
        offered = set(re.findall(r"--[a-z0-9][a-z0-9-]*", help_text(binary, sub)))
        for word in words[1:]:
            for flag in re.findall(r"(?:^|\[)(--[a-z0-9][a-z0-9-]*)", word):
                if flag not in offered:
                    problems.append(f"{match.group(1)}{' ' + sub if sub else ''}: {flag} is not "
                                    f"in its --help")
    return problems


def check_toml(body, binary_name, build):
    try:
        config = tomllib.loads(body)
    except tomllib.TOMLDecodeError as error:
        return [f"not TOML: {error}"]
    binary = os.path.join(build, "bin", binary_name)
    if not os.access(binary, os.X_OK):
        return [f"toml {binary_name}: no such binary"]
    offered = set(re.findall(r"--([a-z0-9][a-z0-9-]*)", help_text(binary, None)))
    return [f"{binary_name}: key {key} is no flag of its" for key in config
            if key.replace("_", "-") not in offered]


DEMO_ARTIFACT = "stories260k-to-llama2xs-260k.scd"


@functools.lru_cache(maxsize=None)
def demo_artifact(build, shared):
    """What `make demo` leaves in build/demo/ for the blocks that say "after make demo": the same
    pair fitted small (seconds; the commands, not the artifact's quality, are under test)."""
    out = os.path.join(tempfile.mkdtemp(prefix="scd-docs-demo."), DEMO_ARTIFACT)
    models = os.path.join(shared, "models")
    subprocess.run([os.path.join(build, "bin", "scd-calib"), "fit", "--quiet",
                    "--producer", os.path.join(models, "stories260k"),
                    "--consumer", os.path.join(models, "llama2xs-260k"), "--out", out,
                    "--prefixes", "24", "--tokens", "64", "--rank-k", "1", "--rank-v", "2",
                    "--rank-h", "16", "--patch-budget", "1", "--aligner-epochs", "2",
                    "--aligner-seconds", "0", "--no-vocab-sweep", "--heldout-windows", "4"],
                   check=True, capture_output=True)
    return out


def sandbox(build, shared):
    """A directory standing for the repository (every top-level entry linked; build/ the given
    build's entries linked, with build/demo/ of its own) with ../shared beside it."""
    top = tempfile.mkdtemp(prefix="scd-docs.")
    repo = os.path.join(top, "repo")
    os.mkdir(repo)
    os.symlink(os.path.abspath(shared), os.path.join(top, "shared"))
    for entry in os.listdir(ROOT):
        if entry in (".git", "build"):
            continue
        os.symlink(os.path.join(ROOT, entry), os.path.join(repo, entry))
    os.mkdir(os.path.join(repo, "build"))
    for entry in os.listdir(build):
        if entry != "demo":
            os.symlink(os.path.join(os.path.abspath(build), entry), os.path.join(repo, "build", entry))
    os.mkdir(os.path.join(repo, "build", "demo"))
    os.symlink(demo_artifact(os.path.abspath(build), os.path.abspath(shared)),
               os.path.join(repo, "build", "demo", DEMO_ARTIFACT))
    return top, repo


def run(body, build, shared):
    top, repo = sandbox(build, shared)
    start = time.monotonic()
    # Debian's python3 first (its grpcio, yaml), as on a machine scripts/setup.sh set up.
    env = dict(os.environ, PATH="/usr/bin:" + os.environ.get("PATH", ""))
    # Output to a file, not a pipe: what a block leaves in the background would hold a pipe open.
    with open(os.path.join(top, "output"), "w+") as output:
        process = subprocess.Popen(["bash", "-euo", "pipefail", "-c", body], cwd=repo, env=env,
                                   stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            process.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(process.pid, signal.SIGKILL)  # whatever the block left running
        except ProcessLookupError:
            pass
        process.wait()
        output.seek(0)
        text = output.read()
    subprocess.run(["rm", "-rf", top])
    took = time.monotonic() - start
    if took >= RUN_TIMEOUT_S:
        return [f"still running after {RUN_TIMEOUT_S} s:\n{text[-2000:]}"], took
    if process.returncode != 0:
        return [f"exit {process.returncode} after {took:.1f} s:\n{text[-3000:]}"], took
    return [], took


def check_block(info, body, build, shared, execute=True):
    """(kind, problems, seconds run)."""
    words = info.split()
    kind = words[0] if words else ""
    if kind not in KINDS:
        return kind, [f"info string {info!r}: say what the block is ({', '.join(KINDS)})"], 0
    if body.endswith("\0unclosed"):
        return kind, ["the block is not closed"], 0
    if kind == "text":
        return kind, [], 0
    if kind == "toml":
        if len(words) != 2:
            return kind, ["toml BINARY: name the binary whose config it is"], 0
        return kind, check_toml(body, words[1], build), 0
    problems = check_flags(body, build)
    if kind == "synopsis":
        return kind, problems, 0
    needs = [w.split("=", 1)[1] for w in words[1:] if w.startswith("needs=")]
    if any(n not in NEEDS for n in needs) or len(needs) != len(words) - 1:
        return kind, problems + [f"info string {info!r}: sh [needs={'|'.join(NEEDS)}]"], 0
    syntax = subprocess.run(["bash", "-n", "-c", body], capture_output=True, text=True)
    if syntax.returncode != 0:
        return kind, problems + [f"bash -n: {syntax.stderr.strip()}"], 0
    if needs or problems or not execute:
        return kind + (f" needs={needs[0]}" if needs else ""), problems, 0
    ran, took = run(body, build, shared)
    return kind, ran, took


def self_test(build, shared):
    cases = [
        ("text", "anything at all $(\n", True),
        ("", "echo hi\n", False),                       # no info string
        ("bash", "echo hi\n", False),                   # not a kind
        ("sh needs=moon", "echo hi\n", False),
        ("sh needs=gpu", "echo 'unclosed\n", False),    # bash -n fails
        ("sh", "exit 3\n", False),
        ("sh", "sleep 100 &\necho started\n", True),    # background left: killed, not waited for
        ("synopsis", "build/bin/scd generate --model DIR [--no-such-flag]\n", False),
        ("synopsis", "build/bin/scd generate --model DIR [--stats] \\\n    --max-tokens N\n", True),
        ("synopsis", "make no-such-target\n", False),
        ("synopsis", "make test demo\n", True),
        ("toml scd-producer", 'model = "m"\ncontrol-listen = "0.0.0.0:1"\n', True),
        ("toml scd-producer", 'model = "m"\nno-such-key = 1\n', False),
        ("toml scd-producer", 'model = \n', False),
    ]
    failed = 0
    for info, body, should_pass in cases:
        _, problems, _ = check_block(info, body, build, shared)
        if (not problems) != should_pass:
            failed += 1
            print(f"self-test: {info!r} {body!r}: expected {'pass' if should_pass else 'problems'}, "
                  f"got {problems}")
    print(f"self-test: {len(cases) - failed} of {len(cases)} cases as expected")
    return 1 if failed else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*")
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--shared", default=os.path.join(ROOT, "..", "shared"))
    parser.add_argument("--no-run", action="store_true", help="check, but run no sh block")
    parser.add_argument("--self-test", action="store_true")
    args = parser.parse_args()
    if args.self_test:
        return self_test(args.build, args.shared)
    files = args.files or [os.path.join(ROOT, "README.md")] + sorted(
        os.path.join(ROOT, "docs", f) for f in os.listdir(os.path.join(ROOT, "docs"))
        if f.endswith(".md"))
    failures = 0
    for path in files:
        for line, info, body in blocks(path):
            kind, problems, took = check_block(info, body, args.build, args.shared,
                                               execute=not args.no_run)
            where = f"{os.path.relpath(path, ROOT)}:{line}"
            if problems:
                failures += 1
                print(f"FAIL {where} ({kind}):\n  " + "\n  ".join(problems), flush=True)
            else:
                print(f"ok   {where} ({kind}{f', ran {took:.1f} s' if took else ''})", flush=True)
    if not args.files:  # the generated page, as the daemons' --help says now
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import config_reference
        with open(os.path.join(ROOT, "docs", "configuration.md")) as f:
            if f.read() != config_reference.page(args.build):
                failures += 1
                print("FAIL docs/configuration.md differs from the daemons' --help: run "
                      "scripts/config_reference.py")
            else:
                print("ok   docs/configuration.md (as the daemons' --help says)")
    print(f"docs: {failures} failing block(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
