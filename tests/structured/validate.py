#!/usr/bin/env python3
"""Independent validator for Tandem's structured outputs (constrained decoding).

Tandem's grammar engine masks the model's tokens so that what it generates
matches a JSON Schema, a regex or a list of choices by construction.  This
script checks the generated text with code that shares nothing with the
engine: Python's json module and the jsonschema package.

    validate.py SUITE OUTPUTS      check generated outputs against the suite
    validate.py --check-suite SUITE  check the suite file itself

SUITE is tests/structured/suite.json, a JSON array of cases:
    {"name": ..., "kind": "json_schema", "schema": {...}}
    {"name": ..., "kind": "regex", "pattern": "..."}
    {"name": ..., "kind": "choice", "choices": ["...", ...]}
    {"name": ..., "kind": "json_object"}
OUTPUTS is JSON lines, one per generation:
    {"name": case, "mode": "greedy"|"sampled", "model": ..., "text": ...,
     "finish": "stop"|"length"}

An output passes when its finish is "stop" and its text
  json_schema  parses as JSON (no duplicate keys, no NaN/Infinity) and
               Draft 2020-12 validation reports no error, formats asserted;
  regex        matches the whole pattern;
  choice       is exactly one of the choices;
  json_object  parses as a JSON object.

Where the jsonschema package is lenient or needs extra packages, this file
is stricter, following JSON Schema itself:
  * formats date, time, date-time, uuid, ipv4 and email are checked here
    (RFC 3339 for the dates and times, a simple local@domain.tld for email);
  * `enum` compares like `const` (true is not 1, also inside objects/arrays);
  * regexes use JSON Schema's ECMA-262 reading where Python's differs in a
    way that matters here: \\d and \\w are ASCII only, and `$` matches only
    at the very end (Python's also matches before a final newline).  \\s is
    ASCII whitespace.

Exit status: 0 when every output passed, 1 when one failed or OUTPUTS held
none (and, with --check-suite, when the suite has a problem).
"""

import argparse
import datetime
import functools
import json
import re
import sys
from collections import Counter

from jsonschema import Draft202012Validator, FormatChecker, validators
from jsonschema.exceptions import SchemaError, ValidationError

# Least number of cases of each kind the suite must hold.
MIN_CASES = {"json_schema": 110, "regex": 15, "choice": 6, "json_object": 2}

# The JSON Schema subset Tandem's grammar engine supports (the suite must
# stay inside it and use every part of it at least MIN_USES times).
SUPPORTED_KEYWORDS = {
    "type", "properties", "required", "additionalProperties", "enum",
    "const", "items", "prefixItems", "minItems", "maxItems", "anyOf",
    "oneOf", "allOf", "$ref", "$defs", "definitions", "minLength",
    "maxLength", "pattern", "format", "minimum", "maximum",
    "exclusiveMinimum", "exclusiveMaximum",
}
ANNOTATIONS = {
    "title", "description", "default", "examples", "$schema", "$id",
    "$comment", "deprecated", "readOnly", "writeOnly",
}
TYPES = {"object", "array", "string", "integer", "number", "boolean", "null"}
FORMATS = {"date", "time", "date-time", "uuid", "ipv4", "email"}
INTEGER_BOUNDS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
MAX_LENGTH_LIMIT = 64
MIN_USES = 3

TEXT_REPR_LIMIT = 200


# --- formats ---------------------------------------------------------------

_DATE_RE = re.compile(r"\d{4}-\d{2}-\d{2}", re.ASCII)
_TIME_RE = re.compile(
    r"(\d{2}):(\d{2}):(\d{2})(?:\.\d+)?(?:[Zz]|([+-])(\d{2}):(\d{2}))", re.ASCII)
_UUID_RE = re.compile(r"[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_IPV4_RE = re.compile(rf"{_OCTET}(?:\.{_OCTET}){{3}}")


def is_date(value):
    """RFC 3339 full-date: YYYY-MM-DD naming a real day."""
    if not isinstance(value, str):
        return True
    if not _DATE_RE.fullmatch(value):
        return False
    if value.startswith("0000"):  # RFC 3339 allows year 0 (a leap year); Python does not
        value = "2000" + value[4:]
    try:
        datetime.date.fromisoformat(value)
    except ValueError:
        return False
    return True


def is_time(value):
    """RFC 3339 full-time: HH:MM:SS(.frac)?(Z|+HH:MM|-HH:MM), offset required.

    Second 60 is a leap second, allowed only at 23:59 UTC (as in JSON
    Schema's own test suite).
    """
    if not isinstance(value, str):
        return True
    m = _TIME_RE.fullmatch(value)
    if not m:
        return False
    hour, minute, second = int(m[1]), int(m[2]), int(m[3])
    if m[4]:
        off_hour, off_minute = int(m[5]), int(m[6])
        if off_hour > 23 or off_minute > 59:
            return False
        offset = (off_hour * 60 + off_minute) * (1 if m[4] == "+" else -1)
    else:
        offset = 0
    try:
        datetime.time(hour, minute, min(second, 59))
    except ValueError:
        return False
    if second == 60:
        return (hour * 60 + minute - offset) % (24 * 60) == 23 * 60 + 59
    return True


def is_date_time(value):
    """RFC 3339 date-time: full-date 'T' full-time ('t' allowed, as RFC 3339 says)."""
    if not isinstance(value, str):
        return True
    if len(value) < 11 or value[10] not in "Tt":
        return False
    return is_date(value[:10]) and is_time(value[11:])


def is_uuid(value):
    """8-4-4-4-12 hex digits."""
    return not isinstance(value, str) or bool(_UUID_RE.fullmatch(value))


def is_ipv4(value):
    """Four decimal octets 0-255, no leading zeros."""
    return not isinstance(value, str) or bool(_IPV4_RE.fullmatch(value))


def is_email(value):
    """local@domain: local part non-empty, no space or '@'; domain has a dot."""
    if not isinstance(value, str):
        return True
    local, at, domain = value.rpartition("@")
    if not at or not local or "@" in local or any(c.isspace() for c in value):
        return False
    labels = domain.split(".")
    return len(labels) >= 2 and all(labels)


OWN_FORMATS = {
    "date": is_date,
    "time": is_time,
    "date-time": is_date_time,
    "uuid": is_uuid,
    "ipv4": is_ipv4,
    "email": is_email,
}


def make_format_checker():
    checker = FormatChecker()
    for name, check in OWN_FORMATS.items():
        checker.checks(name)(check)
    return checker


# --- regexes and the stricter enum -----------------------------------------

@functools.lru_cache(maxsize=None)
def compile_regex(pattern):
    """Compiles a JSON Schema (ECMA-262) pattern for Python's re module.

    Outside character classes, `$` becomes `\\Z`; \\d and \\w are ASCII.
    """
    out = []
    i, in_class = 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            out.append(c)
            i += 1
            # Python reads ']' right after '[' or '[^' as a literal.
            if pattern.startswith("^", i):
                out.append("^")
                i += 1
            if pattern.startswith("]", i):
                out.append("]")
                i += 1
            continue
        elif c == "$":
            c = r"\Z"
        out.append(c)
        i += 1
    return re.compile("".join(out), re.ASCII)


def json_equal(a, b):
    """Equality of JSON values as JSON Schema defines it (true != 1, 1 == 1.0)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(json_equal, a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def _enum(validator, enums, instance, schema):
    if not any(json_equal(instance, e) for e in enums):
        yield ValidationError(f"{instance!r} is not one of {enums!r}")


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not compile_regex(pattern).search(instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


Validator = validators.extend(
    Draft202012Validator, {"enum": _enum, "pattern": _pattern})


# --- outputs ---------------------------------------------------------------

def _object_without_duplicates(pairs):
    obj = {}
    for key, value in pairs:
        if key in obj:
            raise ValueError(f"duplicate key {key!r}")
        obj[key] = value
    return obj


def _reject_constant(name):
    raise ValueError(f"{name} is not JSON")


def parse_json(text):
    return json.loads(text, object_pairs_hook=_object_without_duplicates,
                      parse_constant=_reject_constant)


def _json_path(path):
    return "$" + "".join(f"[{p!r}]" if isinstance(p, str) else f"[{p}]" for p in path)


class Checker:
    def __init__(self, cases):
        self.cases = cases
        self.format_checker = make_format_checker()
        self.validators = {}

    def schema_validator(self, case):
        name = case["name"]
        if name not in self.validators:
            self.validators[name] = Validator(
                case["schema"], format_checker=self.format_checker)
        return self.validators[name]

    def check_text(self, case, text):
        """Returns why text fails the case, or None when it passes."""
        kind = case["kind"]
        if kind == "regex":
            if compile_regex(case["pattern"]).fullmatch(text):
                return None
            return f"does not match /{case['pattern']}/"
        if kind == "choice":
            return None if text in case["choices"] else "not one of the choices"
        try:
            value = parse_json(text)
        except (ValueError, RecursionError) as e:
            return f"invalid JSON: {e}"
        if kind == "json_object":
            return None if isinstance(value, dict) else f"not a JSON object but {type(value).__name__}"
        errors = sorted(self.schema_validator(case).iter_errors(value),
                        key=lambda e: list(map(str, e.absolute_path)))
        if not errors:
            return None
        first = errors[0]
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        message = first.message if len(first.message) <= 160 else first.message[:157] + "..."
        return f"schema: at {_json_path(first.absolute_path)}: {message}{more}"

    def check_record(self, record):
        """Returns a list of reasons the output record fails (empty: passes)."""
        name = record.get("name")
        case = self.cases.get(name) if isinstance(name, str) else None
        if case is None:
            return [f"unknown case {record.get('name')!r}"]
        reasons = []
        if record.get("finish") != "stop":
            reasons.append(f"finish is {record.get('finish')!r}, not 'stop'")
        text = record.get("text")
        if not isinstance(text, str):
            reasons.append("no text")
        else:
            reason = self.check_text(case, text)
            if reason:
                reasons.append(reason)
        return reasons


def _text_repr(text):
    r = repr(text)
    return r if len(r) <= TEXT_REPR_LIMIT else r[:TEXT_REPR_LIMIT - 3] + "..."


def validate_outputs(suite_path, outputs_path):
    cases = {case["name"]: case for case in load_json(suite_path)}
    checker = Checker(cases)
    total = failed = 0
    with open(outputs_path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            total += 1
            try:
                record = json.loads(line)
                if not isinstance(record, dict):
                    raise ValueError("not a JSON object")
            except ValueError as e:
                failed += 1
                print(f"FAIL line {line_no}: unreadable output record: {e}")
                continue
            reasons = checker.check_record(record)
            if reasons:
                failed += 1
                print(f"FAIL {record.get('name')} mode={record.get('mode')} "
                      f"model={record.get('model')}: {'; '.join(reasons)}: "
                      f"{_text_repr(record.get('text'))}")
    print(f"validated {total} outputs: {failed} failed")
    if total == 0:
        print(f"{outputs_path} holds no outputs")
        return 1
    return 1 if failed else 0


# --- checking the suite ----------------------------------------------------

def walk_schema(schema, visit, path="#"):
    """Calls visit(schema, path) on schema and each subschema in it."""
    if not isinstance(schema, dict):
        return
    visit(schema, path)
    for key in ("properties", "$defs", "definitions"):
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                walk_schema(sub, visit, f"{path}/{key}/{name}")
    for key in ("items", "additionalProperties"):
        walk_schema(schema.get(key), visit, f"{path}/{key}")
    for key in ("prefixItems", "anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list):
            for i, sub in enumerate(schema[key]):
                walk_schema(sub, visit, f"{path}/{key}/{i}")


def resolve_local_ref(root, ref):
    node = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def schema_problems(schema, uses):
    """Problems with a suite schema outside Tandem's subset; counts uses."""
    problems = []

    def visit(sub, path):
        types = sub.get("type", [])
        types = [types] if isinstance(types, str) else types
        for key in sub:
            if key not in SUPPORTED_KEYWORDS | ANNOTATIONS:
                problems.append(f"{path}: keyword {key!r} is not supported")
            uses[key] += 1
        for t in types:
            uses[f"type:{t}"] += 1
        if isinstance(sub.get("type"), list):
            uses["type:[list]"] += 1
        if "format" in sub:
            uses[f"format:{sub['format']}"] += 1
            if sub["format"] not in FORMATS:
                problems.append(f"{path}: format {sub['format']!r} is not supported")
        if INTEGER_BOUNDS & sub.keys() and ("integer" not in types or "number" in types):
            problems.append(f"{path}: numeric bounds need type integer (not number)")
        if "allOf" in sub and len(sub["allOf"]) != 1:
            problems.append(f"{path}: allOf must have exactly one element")
        if sub.get("maxLength", 0) > MAX_LENGTH_LIMIT:
            problems.append(f"{path}: maxLength over {MAX_LENGTH_LIMIT}")
        if {"pattern", "format"} & sub.keys() and {"minLength", "maxLength"} & sub.keys():
            problems.append(f"{path}: Tandem refuses pattern/format with minLength/maxLength")
        if "pattern" in sub and "format" in sub:
            problems.append(f"{path}: Tandem refuses pattern together with format")
        if "pattern" in sub:
            p = sub["pattern"]
            if not (p.startswith("^") and p.endswith("$")):
                problems.append(f"{path}: pattern {p!r} is not anchored with ^...$")
            try:
                compile_regex(p)
            except re.error as e:
                problems.append(f"{path}: pattern {p!r}: {e}")
        if "additionalProperties" in sub:
            ap = sub["additionalProperties"]
            uses[f"additionalProperties:{json.dumps(ap) if isinstance(ap, bool) else 'schema'}"] += 1
        if "items" in sub and "prefixItems" in sub:
            uses["prefixItems+items"] += 1
        if "$ref" in sub:
            ref = sub["$ref"]
            kind = ("#" if ref == "#" else "#/$defs/" if ref.startswith("#/$defs/")
                    else "#/definitions/" if ref.startswith("#/definitions/") else None)
            if kind is None:
                problems.append(f"{path}: $ref {ref!r} is not #, #/$defs/ or #/definitions/")
            elif resolve_local_ref(schema, ref) is None:
                problems.append(f"{path}: $ref {ref!r} does not resolve")
            else:
                uses[f"$ref:{kind}"] += 1

    walk_schema(schema, visit)
    return problems


def check_suite(suite_path):
    problems = []
    try:
        suite = load_json(suite_path)
    except (OSError, ValueError) as e:
        print(f"cannot read {suite_path}: {e}")
        return 1
    if not isinstance(suite, list):
        print(f"{suite_path}: not a JSON array")
        return 1
    counts = Counter()
    uses = Counter()
    names = Counter()
    for i, case in enumerate(suite):
        if not isinstance(case, dict):
            problems.append(f"case {i}: not an object")
            continue
        name, kind = case.get("name"), case.get("kind")
        where = f"case {i} ({name!r})"
        names[name] += 1
        if not isinstance(name, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", name):
            problems.append(f"{where}: name is not snake_case")
        counts[kind] += 1
        fields = {"json_schema": {"schema"}, "regex": {"pattern"},
                  "choice": {"choices"}, "json_object": set()}.get(kind)
        if fields is None:
            problems.append(f"{where}: unknown kind {kind!r}")
            continue
        if case.keys() != {"name", "kind"} | fields:
            problems.append(f"{where}: fields {sorted(case)}, expected {sorted({'name', 'kind'} | fields)}")
            continue
        if kind == "json_schema":
            schema = case["schema"]
            if not isinstance(schema, dict):
                problems.append(f"{where}: schema is not an object")
                continue
            try:
                Draft202012Validator.check_schema(schema)
            except SchemaError as e:
                problems.append(f"{where}: not a valid Draft 2020-12 schema: {e.message}")
            problems += [f"{where}: {p}" for p in schema_problems(schema, uses)]
        elif kind == "regex":
            try:
                compile_regex(case["pattern"])
            except (re.error, TypeError) as e:
                problems.append(f"{where}: bad pattern: {e}")
        elif kind == "choice":
            choices = case["choices"]
            if (not isinstance(choices, list) or not choices
                    or not all(isinstance(c, str) and c for c in choices)
                    or len(set(choices)) != len(choices)):
                problems.append(f"{where}: choices must be distinct non-empty strings")
    problems += [f"name {n!r} is used {k} times" for n, k in names.items() if k > 1]
    for kind, least in MIN_CASES.items():
        if counts[kind] < least:
            problems.append(f"only {counts[kind]} {kind} cases, need {least}")
    wanted = (SUPPORTED_KEYWORDS | ANNOTATIONS | {f"type:{t}" for t in TYPES}
              | {f"format:{f}" for f in FORMATS}
              | {"type:[list]", "additionalProperties:true", "additionalProperties:false",
                 "additionalProperties:schema", "prefixItems+items",
                 "$ref:#", "$ref:#/$defs/", "$ref:#/definitions/"})
    for key in sorted(wanted):
        if uses[key] < MIN_USES:
            problems.append(f"{key} is used {uses[key]} times, need {MIN_USES}")

    print("cases: " + ", ".join(f"{kind} {counts[kind]}" for kind in MIN_CASES)
          + f" ({len(suite)} in all)")
    print("uses: " + ", ".join(f"{k} {uses[k]}" for k in sorted(uses)))
    for problem in problems:
        print(f"PROBLEM {problem}")
    print(f"{suite_path}: {'OK' if not problems else f'{len(problems)} problems'}")
    return 1 if problems else 0


def load_json(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description="Validate Tandem structured outputs against the suite.")
    parser.add_argument("--check-suite", metavar="SUITE",
                        help="check the suite file itself and exit")
    parser.add_argument("suite", nargs="?", help="suite.json")
    parser.add_argument("outputs", nargs="?", help="outputs, JSON lines")
    args = parser.parse_args(argv)
    if args.check_suite:
        if args.suite or args.outputs:
            parser.error("--check-suite takes only the suite")
        return check_suite(args.check_suite)
    if not (args.suite and args.outputs):
        parser.error("need SUITE and OUTPUTS (or --check-suite SUITE)")
    return validate_outputs(args.suite, args.outputs)


if __name__ == "__main__":
    sys.exit(main())
