#!/usr/bin/env python3
"""Renders chat templates as transformers' apply_chat_template does (Jinja2 sandbox with
trim_blocks and lstrip_blocks, raise_exception), the reference of tests/chat_template_test.cc.

  chat_template_reference.py CASES.json     -> a JSON list: {"out": text} or {"error": message}

Needs Debian's python3-jinja2 (/usr/bin/python3)."""
import json
import sys

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment


def raise_exception(message):
    raise TemplateError(message)


def main():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    # transformers' own tojson (not Jinja's HTML-safe one).
    env.filters["tojson"] = lambda x, ensure_ascii=False, indent=None, separators=None, \
        sort_keys=False: json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                                    separators=separators, sort_keys=sort_keys)
    results = []
    for case in json.load(open(sys.argv[1]))["cases"]:
        try:
            results.append({"out": env.from_string(case["template"]).render(**case["context"])})
        except TemplateError as e:
            results.append({"error": str(e)})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
