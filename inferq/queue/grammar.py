"""A bounded parser of the EBNF grammars the engine's structured output takes (``structured_outputs.grammar``,
``guided_grammar``): the GBNF form xgrammar reads, which vLLM's documentation uses::

    root   ::= answer ("," answer)*       # a rule: a name, ::=, alternatives of sequences
    answer ::= "yes" | "no" | [0-9]{1,3}  # strings, character classes, repetition, groups, rule names

A grammar is parsed whole before it is queued, so one the engine cannot compile, or one whose compilation would
take the engine's time or memory (deep nesting, huge repetition counts, thousands of rules), is a 422 naming the
field instead of a job that fails or stalls the engine. What is accepted: rules ``name ::= alternatives``,
``"..."`` strings with ``\\n \\r \\t \\\\ \\" \\xHH \\uHHHH`` escapes, ``[...]`` classes (``^`` negation, ranges,
the same escapes), rule references, ``( )`` groups, ``* + ?`` and ``{m}``, ``{m,}``, ``{m,n}``, ``#`` comments; a
``root`` rule; every referenced rule defined once. Lark grammars (no ``::=``) are refused: vLLM converts them with a
best-effort translator, and this module does not guess at it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

MAX_GRAMMAR_CHARS = 32 * 1024
MAX_RULES = 1024
MAX_DEPTH = 32
"""Groups nested in groups, per rule."""
MAX_REPEAT = 1024
"""The largest count in ``{m,n}``: an engine unrolls counted repetition into its automaton."""
MAX_UNROLLED = 4096
"""The largest product of the counts of nested repetitions within a rule (``("a"{100}){100}`` is 10,000)."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")
_ESCAPES = {"n", "r", "t", "\\", '"', "'", "]", "[", "-", "^", "/", "0", "b", "f", "v"}


class GrammarError(ValueError):
    """Why a grammar is refused (a sentence for the 422)."""


@dataclass
class _Cursor:
    text: str
    at: int = 0

    def error(self, problem: str) -> GrammarError:
        line = self.text.count("\n", 0, self.at) + 1
        return GrammarError(f"{problem} (line {line})")

    def skip(self) -> None:
        """Spaces, newlines and comments."""
        while self.at < len(self.text):
            char = self.text[self.at]
            if char in " \t\r\n":
                self.at += 1
            elif char == "#":
                end = self.text.find("\n", self.at)
                self.at = len(self.text) if end < 0 else end
            else:
                return

    def peek(self, token: str) -> bool:
        return self.text.startswith(token, self.at)

    def done(self) -> bool:
        return self.at >= len(self.text)


def _escape(cursor: _Cursor) -> None:
    """After a backslash: one of the escapes the engine reads."""
    if cursor.done():
        raise cursor.error("a backslash ends the grammar")
    char = cursor.text[cursor.at]
    if char == "x":
        digits = 2
    elif char == "u":
        digits = 4
    elif char == "U":
        digits = 8
    elif char in _ESCAPES:
        cursor.at += 1
        return
    else:
        raise cursor.error(f"unknown escape \\{char}")
    value = cursor.text[cursor.at + 1: cursor.at + 1 + digits]
    if len(value) != digits or not all(c in "0123456789abcdefABCDEF" for c in value):
        raise cursor.error(f"\\{char} needs {digits} hex digits")
    cursor.at += 1 + digits


def _string(cursor: _Cursor) -> None:
    quote = cursor.text[cursor.at]
    cursor.at += 1
    while not cursor.done():
        char = cursor.text[cursor.at]
        cursor.at += 1
        if char == quote:
            return
        if char == "\\":
            _escape(cursor)
        elif char == "\n":
            break
    raise cursor.error("a string is not closed")


def _char_class(cursor: _Cursor) -> None:
    cursor.at += 1  # [
    if cursor.peek("^"):
        cursor.at += 1
    members = 0
    while not cursor.done():
        char = cursor.text[cursor.at]
        cursor.at += 1
        if char == "]":
            if members == 0:
                raise cursor.error("an empty character class")
            return
        if char == "\\":
            _escape(cursor)
        elif char == "\n":
            break
        members += 1
    raise cursor.error("a character class is not closed")


def _repeat(cursor: _Cursor) -> int:
    """``{m}``, ``{m,}``, ``{m,n}`` with counts up to :data:`MAX_REPEAT`; the copies an engine unrolls."""
    end = cursor.text.find("}", cursor.at)
    if end < 0:
        raise cursor.error("a repetition {m,n} is not closed")
    body = cursor.text[cursor.at + 1: end].replace(" ", "")
    match = re.fullmatch(r"(\d{1,7})(?:(,)(\d{1,7})?)?", body)
    if match is None:
        raise cursor.error(f"{{{body}}} is not a repetition count")
    low = int(match.group(1))
    high = int(match.group(3)) if match.group(3) else (None if match.group(2) else low)
    if low > MAX_REPEAT or (high is not None and high > MAX_REPEAT):
        raise cursor.error(f"a repetition count above {MAX_REPEAT}")
    if high is not None and high < low:
        raise cursor.error(f"{{{body}}}: the upper bound is below the lower")
    cursor.at = end + 1
    return max(low, high or 1)


def _alternatives(cursor: _Cursor, refs: set[str], depth: int) -> int:
    """Sequences separated by ``|``, up to the end of the rule (the next ``name ::=``), a ``)`` or the end; the
    most copies any of its items unrolls into."""
    if depth > MAX_DEPTH:
        raise cursor.error(f"groups nested deeper than {MAX_DEPTH}")
    items, unrolled = 0, 1
    while True:
        cursor.skip()
        if cursor.done() or cursor.peek(")") or _rule_starts(cursor):
            if items == 0:
                raise cursor.error("an empty alternative")
            return unrolled
        if cursor.peek("|"):
            if items == 0:
                raise cursor.error("an empty alternative")
            cursor.at += 1
            items = 0
            continue
        unrolled = max(unrolled, _item(cursor, refs, depth))
        items += 1


def _item(cursor: _Cursor, refs: set[str], depth: int) -> int:
    """One item and its quantifier; the copies it unrolls into (its own count times its group's)."""
    char = cursor.text[cursor.at]
    inner = 1
    if char in "\"'":
        _string(cursor)
    elif char == "[":
        _char_class(cursor)
    elif char == "(":
        cursor.at += 1
        inner = _alternatives(cursor, refs, depth + 1)
        if not cursor.peek(")"):
            raise cursor.error("a group ( is not closed")
        cursor.at += 1
    elif char == ".":
        cursor.at += 1
    else:
        match = _NAME.match(cursor.text, cursor.at)
        if match is None:
            raise cursor.error(f"unexpected {char!r}")
        refs.add(match.group())
        cursor.at = match.end()
    count = 1
    if not cursor.done():  # a quantifier right after the item
        if cursor.text[cursor.at] in "*+?":
            cursor.at += 1
        elif cursor.text[cursor.at] == "{":
            count = _repeat(cursor)
    if inner * count > MAX_UNROLLED:
        raise cursor.error(f"nested repetitions unroll into more than {MAX_UNROLLED} copies")
    return inner * count


def _rule_starts(cursor: _Cursor) -> bool:
    match = _NAME.match(cursor.text, cursor.at)
    if match is None:
        return False
    rest = cursor.text[match.end():].lstrip(" \t")
    return rest.startswith("::=")


def check_grammar(text: str) -> None:
    """Raise :class:`GrammarError` unless ``text`` is an EBNF grammar this module accepts (see the module)."""
    if not text.strip():
        raise GrammarError("the grammar is empty")
    if len(text) > MAX_GRAMMAR_CHARS:
        raise GrammarError(f"the grammar is longer than {MAX_GRAMMAR_CHARS} characters")
    if "::=" not in text:
        raise GrammarError("not an EBNF grammar (rules are `name ::= ...`; Lark grammars are not accepted)")
    cursor = _Cursor(text)
    defined: set[str] = set()
    refs: set[str] = set()
    cursor.skip()
    while not cursor.done():
        match = _NAME.match(text, cursor.at)
        if match is None or not _rule_starts(cursor):
            raise cursor.error("expected a rule `name ::= ...`")
        name = match.group()
        if name in defined:
            raise cursor.error(f"rule {name} is defined twice")
        defined.add(name)
        if len(defined) > MAX_RULES:
            raise cursor.error(f"more than {MAX_RULES} rules")
        cursor.at = text.index("::=", match.end()) + 3
        _alternatives(cursor, refs, 0)
        if cursor.peek(")"):
            raise cursor.error("a ) closes no group")
        cursor.skip()
    if "root" not in defined:
        raise GrammarError("no `root` rule (the engine starts there)")
    undefined = sorted(refs - defined)
    if undefined:
        raise GrammarError(f"rule(s) used but not defined: {', '.join(undefined[:5])}")
