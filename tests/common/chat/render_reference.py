#!/usr/bin/python3
"""Renders Jinja chat templates with Python's jinja2, configured as Hugging Face transformers
does (transformers/utils/chat_template_utils.py: _compile_jinja_template), for
jinja_reference_test.cc.

stdin: {"now": <unix seconds>, "cases": [{"template": str, "context": object}, ...]}
stdout: [{"ok": true, "output": str} | {"ok": false, "error": str}, ...] in the same order.
strftime_now formats the fixed time `now` in UTC, as the C++ side does with RenderLimits::now.
"""
import json
import sys
from datetime import datetime, timezone

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class AssistantTracker(Extension):
    # transformers' {% generation %} ... {% endgeneration %}: renders its body.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        call = self.call_method("_generation_support")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def make_environment(now):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return now.strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    request = json.load(sys.stdin)
    env = make_environment(datetime.fromtimestamp(request["now"], tz=timezone.utc))
    results = []
    for case in request["cases"]:
        try:
            template = env.from_string(case["template"])
            results.append({"ok": True, "output": template.render(**case["context"])})
        except Exception as e:  # jinja2's errors and Python's (TypeError, ...) alike
            results.append({"ok": False, "error": f"{type(e).__name__}: {e}"})
    json.dump(results, sys.stdout, ensure_ascii=False)


if __name__ == "__main__":
    main()
