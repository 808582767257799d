"""The structured-output constraints of a job's body, parsed and bounded before the job is queued
(:mod:`inferq.queue.engine_body` calls these): JSON schemas, regular expressions, choices, EBNF grammars
(:mod:`inferq.queue.grammar`) and the JSON whitespace pattern.

The engine compiles each into an automaton over its vocabulary. What it cannot compile fails the job; what compiles
into something huge (``minLength: 1e8``, ``(a{65535}){65535}``, a grammar nested a thousand deep) takes the engine's
time and memory from every other tenant's requests. Each check raises ``ValueError`` with a sentence that the caller
prefixes with the field's name.

Regular expressions: the dialect the engines share (outlines, xgrammar and llguidance compile regexes into finite
automata): no backreferences, lookarounds, conditionals, atomic groups or inline flags, which no automaton can
express; counted repetition ``{m,n}`` up to :data:`MAX_REPEAT`, and nested counts whose product stays under
:data:`MAX_UNROLLED`. Python's ``re`` then confirms the syntax.

JSON schemas: valid against their metaschema (``jsonschema``'s ``check_schema``, imported on the first schema), at
most :data:`MAX_SCHEMA_DEPTH` levels and :data:`MAX_SCHEMA_NODES` subschemas, the length, size and count keywords
integers up to :data:`MAX_SCHEMA_COUNT`, every ``pattern`` a bounded regex, ``$ref`` local only (``#...``), an
``enum`` of at most :data:`MAX_CHOICES` values.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from typing import Any

from inferq import fastjson

from .grammar import MAX_REPEAT, MAX_UNROLLED, GrammarError
from .grammar import check_grammar as _check_grammar

MAX_REGEX_CHARS = 4096
MAX_WHITESPACE_CHARS = 256
MAX_CHOICES = 1024
MAX_CHOICE_CHARS = 4096
MAX_SCHEMA_DEPTH = 32
"""How deeply a JSON schema may nest (objects and arrays): the engines compile schemas recursively."""
MAX_SCHEMA_NODES = 4096
MAX_SCHEMA_COUNT = 8192
"""The largest ``minLength``, ``maxItems``, ... a schema may ask for: the engine unrolls them."""

COUNT_KEYWORDS = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
                  "minContains", "maxContains")
SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
"""Keywords whose value maps names to subschemas."""
SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
SCHEMA_ONE = ("not", "if", "then", "else", "additionalProperties", "contains", "propertyNames",
              "unevaluatedItems", "unevaluatedProperties", "additionalItems", "items")


# ---------------------------------------------------------------------- regular expressions


_COUNT = re.compile(r"\{(\d*)(,?)(\d*)\}")


class _Regex:
    """A recursive-descent reader of the automaton dialect (see the module)."""

    def __init__(self, pattern: str) -> None:
        self.text = pattern
        self.at = 0

    def alternatives(self, depth: int) -> int:
        if depth > 64:
            raise ValueError("groups nested deeper than 64")
        unrolled = 1
        while self.at < len(self.text) and self.text[self.at] != ")":
            if self.text[self.at] == "|":
                self.at += 1
                continue
            unrolled = max(unrolled, self.item(depth))
        return unrolled

    def item(self, depth: int) -> int:
        char = self.text[self.at]
        inner = 1
        if char == "\\":
            self.escape()
        elif char == "[":
            self.char_class()
        elif char == "(":
            self.group_open()
            inner = self.alternatives(depth + 1)
            if self.at >= len(self.text):
                raise ValueError("a group ( is not closed")
            self.at += 1
        else:
            self.at += 1
        return inner * self.quantifier(inner)

    def escape(self) -> None:
        if self.at + 1 >= len(self.text):
            raise ValueError("a backslash ends the pattern")
        char = self.text[self.at + 1]
        if (char.isdigit() and char != "0") or char in "gk":
            raise ValueError("backreferences cannot be compiled into an automaton")
        self.at += 2

    def char_class(self) -> None:
        self.at += 1
        if self.text.startswith("^", self.at):
            self.at += 1
        if self.text.startswith("]", self.at):
            self.at += 1
        while self.at < len(self.text):
            char = self.text[self.at]
            if char == "\\":
                self.at += 2
                continue
            self.at += 1
            if char == "]":
                return
        raise ValueError("a character class [ is not closed")

    def group_open(self) -> None:
        self.at += 1
        if not self.text.startswith("?", self.at):
            return
        for allowed in ("?:", "?P<"):
            if self.text.startswith(allowed, self.at):
                self.at += len(allowed)
                if allowed != "?:":  # a group's name
                    end = self.text.find(">", self.at)
                    if end < 0:
                        raise ValueError("a group name is not closed")
                    self.at = end + 1
                return
        raise ValueError("lookarounds, conditionals, atomic groups and inline flags cannot be compiled into an "
                         "automaton")

    def quantifier(self, inner: int) -> int:
        """A quantifier after an item (lazy allowed, possessive not); the copies it makes."""
        count = 1
        if self.at < len(self.text) and self.text[self.at] in "*+?":
            self.at += 1
        else:
            match = _COUNT.match(self.text, self.at)
            if match is None or not (match.group(1) or match.group(3)):
                return 1  # a brace that is no count is a literal
            low = int(match.group(1) or 0)
            high = int(match.group(3)) if match.group(3) else (None if match.group(2) else low)
            if low > MAX_REPEAT or (high or 0) > MAX_REPEAT:
                raise ValueError(f"a repetition count above {MAX_REPEAT}")
            count = max(low, high or 1)
            self.at = match.end()
        if self.at < len(self.text) and self.text[self.at] == "+":
            raise ValueError("possessive quantifiers cannot be compiled into an automaton")
        if self.at < len(self.text) and self.text[self.at] == "?":
            self.at += 1
        if inner * count > MAX_UNROLLED:
            raise ValueError(f"nested repetitions unroll into more than {MAX_UNROLLED} copies")
        return count


def check_regex(pattern: Any, *, max_chars: int = MAX_REGEX_CHARS) -> None:
    """A bounded pattern in the automaton dialect, which Python's ``re`` compiles too."""
    if not isinstance(pattern, str) or not pattern or len(pattern) > max_chars:
        raise ValueError(f"must be a regular expression of 1 to {max_chars} characters")
    reader = _Regex(pattern)
    reader.alternatives(0)
    if reader.at < len(pattern):
        raise ValueError("a ) closes no group")
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise ValueError(f"is not a valid regular expression: {str(exc)[:200]}") from None


NOT_WHITESPACE = (*(c for c in string.printable if not c.isspace()), "\x00", "\x7f", "\u00e9")


def check_whitespace_pattern(pattern: Any) -> None:
    """The pattern of the whitespace the engine may put between JSON tokens: a bounded regex that matches nothing
    but whitespace (one that matched ``"a"`` would let the model write anything between the tokens): no printable
    character, alone or between spaces, is matched."""
    check_regex(pattern, max_chars=MAX_WHITESPACE_CHARS)
    compiled = re.compile(pattern)
    for char in NOT_WHITESPACE:
        for sample in (char, " " + char, char + " ", " " + char + " "):
            if compiled.fullmatch(sample) is not None:
                raise ValueError(f"must match whitespace only (it matches {sample!r})")


# ---------------------------------------------------------------------- choices and grammars


def check_choice(choices: Any) -> None:
    if not isinstance(choices, list) or not choices or len(choices) > MAX_CHOICES or not all(
            isinstance(c, str) and len(c) <= MAX_CHOICE_CHARS for c in choices):
        raise ValueError(f"must be a list of 1 to {MAX_CHOICES} strings of at most {MAX_CHOICE_CHARS} characters")


def check_grammar(grammar: Any) -> None:
    if not isinstance(grammar, str):
        raise ValueError("must be an EBNF grammar (a string)")
    try:
        _check_grammar(grammar)
    except GrammarError as exc:
        raise ValueError(f"is not a grammar the engine takes: {exc}") from None


# ---------------------------------------------------------------------- JSON schemas


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _SchemaWalk:
    def __init__(self) -> None:
        self.nodes = 0

    def schema(self, node: Any, depth: int, where: str) -> None:
        if isinstance(node, bool):
            return
        if not isinstance(node, dict):
            raise ValueError(f"{where}: a subschema must be an object or a boolean")
        self.nodes += 1
        if self.nodes > MAX_SCHEMA_NODES:
            raise ValueError(f"the schema has more than {MAX_SCHEMA_NODES} subschemas")
        if depth > MAX_SCHEMA_DEPTH:
            raise ValueError(f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
        for keyword in COUNT_KEYWORDS:
            if keyword in node and (not _is_int(node[keyword]) or not 0 <= node[keyword] <= MAX_SCHEMA_COUNT):
                raise ValueError(f"{where}: {keyword} must be an integer 0 to {MAX_SCHEMA_COUNT}")
        if "pattern" in node:
            try:
                check_regex(node["pattern"])
            except ValueError as exc:
                raise ValueError(f"{where}: pattern {exc}") from None
        ref = node.get("$ref")
        if ref is not None and (not isinstance(ref, str) or not ref.startswith("#")):
            raise ValueError(f"{where}: $ref must point inside the schema (#...)")
        if "enum" in node and (not isinstance(node["enum"], list) or len(node["enum"]) > MAX_CHOICES):
            raise ValueError(f"{where}: enum must be a list of at most {MAX_CHOICES} values")
        for keyword in SCHEMA_MAPS:
            children = node.get(keyword)
            if isinstance(children, dict):
                for name, child in children.items():
                    if keyword == "patternProperties":
                        try:
                            check_regex(name)
                        except ValueError as exc:
                            raise ValueError(f"{where}/patternProperties: {exc}") from None
                    self.schema(child, depth + 1, f"{where}/{keyword}/{name}")
        for keyword in SCHEMA_LISTS:
            children = node.get(keyword)
            if isinstance(children, list):
                for i, child in enumerate(children):
                    self.schema(child, depth + 1, f"{where}/{keyword}/{i}")
        for keyword in SCHEMA_ONE:
            if keyword in node:
                child = node[keyword]
                if keyword == "items" and isinstance(child, list):  # draft 4-7's tuple form
                    for i, item in enumerate(child):
                        self.schema(item, depth + 1, f"{where}/items/{i}")
                else:
                    self.schema(child, depth + 1, f"{where}/{keyword}")


def _depth_ok(value: Any, level: int = 0) -> bool:
    """Whether a JSON value nests at most :data:`MAX_SCHEMA_DEPTH` levels (iteratively bounded: the recursion
    stops at the limit)."""
    if level > MAX_SCHEMA_DEPTH * 2:
        return False
    if isinstance(value, dict):
        return all(_depth_ok(v, level + 1) for v in value.values() if isinstance(v, dict | list))
    if isinstance(value, list):
        return all(_depth_ok(v, level + 1) for v in value if isinstance(v, dict | list))
    return True


_VALID_SCHEMAS: dict[bytes, None] = {}
"""Digests of schemas found valid, newest last (a client sends the same schema with many jobs; checking one
against its metaschema takes about a millisecond): at most :data:`VALID_SCHEMAS_KEPT`."""
VALID_SCHEMAS_KEPT = 1024


def check_schema(schema: Any) -> None:
    """A JSON Schema the engine can compile within bounds: an object (or a JSON text of one)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except (ValueError, RecursionError):
            raise ValueError("must be a JSON schema (an object, or a string holding one)") from None
    if isinstance(schema, bool):
        return  # true/false are schemas too
    if not isinstance(schema, dict):
        raise ValueError("must be a JSON schema (an object, or a string holding one)")
    if not _depth_ok(schema):
        raise ValueError(f"the schema nests deeper than {MAX_SCHEMA_DEPTH} levels")
    try:
        key = hashlib.sha256(fastjson.dumps(schema)).digest()
    except (TypeError, ValueError):  # not JSON after all (cannot come from a parsed request)
        raise ValueError("must be a JSON schema") from None
    if key in _VALID_SCHEMAS:
        return
    _SchemaWalk().schema(schema, 0, "#")
    from jsonschema import SchemaError, validators  # lazily: only requests with a schema pay the import

    try:
        validators.validator_for(schema, default=validators.Draft202012Validator).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.path) or "the schema's root"
        raise ValueError(f"is not a valid JSON schema at {where}: {exc.message[:200]}") from None
    except RecursionError:
        raise ValueError("the schema is too deeply nested") from None
    _VALID_SCHEMAS[key] = None
    if len(_VALID_SCHEMAS) > VALID_SCHEMAS_KEPT:
        del _VALID_SCHEMAS[next(iter(_VALID_SCHEMAS))]
