r"""Subscription filters. Owns the rules: which filter strings are valid and what they mean — the
Pub/Sub filter language over message attributes — and how a filter is evaluated per message.

`compile_filter(text)` parses once (at CreateSubscription / restore) and returns a `Filter` whose
`matches(attributes)` is a single generated function, cheap enough for the delivery path; an empty
filter compiles to None ("no filter": callers skip evaluation). Every invalid filter raises
InvalidArgument naming the 1-based character position of the problem.

Grammar — the subset of AIP-160 that Pub/Sub documents (cloud.google.com/pubsub/docs/subscription-message-filter):

    filter     = expression END
    expression = term {"AND" term} | term {"OR" term}   ; AND and OR never mix at one level
    term       = {"NOT" | "-"} simple                    ; negation binds tightest
    simple     = "(" expression ")"
               | "attributes" ":" key                    ; the key is present
               | "attributes." key ("=" | "!=") string   ; the value equals / differs from string
               | "hasPrefix" "(" "attributes." key "," string ")"
    key        = 1*(ASCII letter | digit | "_" | "-") | string
    string     = '"' {char | escape} '"' | "'" {char | escape} "'"
    escape     = \\ \" \' \` \? \a \b \f \n \r \t \v | \xHH | \uHHHH | \UHHHHHHHH | \ooo (octal, <= \377)

Decisions where the documentation is silent:
- Whitespace (space, tab, CR, LF, FF, VT) may surround "(", ")", ",", ":", "=", "!=", AND, OR, NOT, "-";
  none is allowed around the "." of attributes.KEY (AIP-160: comparators take whitespace, member
  selection does not). AND/OR/NOT are case-sensitive; `and`, `or`, `not` are errors.
- A key with characters other than letters, digits, "_" and "-" must be quoted (the documented rule).
- Only hasPrefix exists: hasSuffix, regex operators (=~, !~), other functions and the ordering
  comparators (<, <=, >, >=) and "==" are errors saying they are unsupported.
- Whitespace-only text is invalid (an empty expression), unlike "" which means no filter.
- Repeated negation is allowed: `NOT NOT x`, `--x`, `NOT -x` (AIP-160 allows one per term; lenient).

Semantics: `attributes:k` is true when k is present (any value, even ""). A missing key makes
`=`, `!=` and `hasPrefix` all false — so `attributes.k != "v"` needs k present
(https://cloud.google.com/pubsub/docs/subscription-message-filter); NOT negates its whole operand, so
`NOT attributes.k = "v"` is true when k is missing.
"""

from __future__ import annotations

import string
from typing import Callable, Mapping

from pigeon.core import limits
from pigeon.core.errors import InvalidArgument

filter_bytes_max = limits.filter_bytes_max  # UTF-8 bytes; bound here so tests can lift it

_WS = frozenset(" \t\n\r\f\v")
_WORD_START = frozenset(string.ascii_letters + "_")
_WORD_CHARS = frozenset(string.ascii_letters + string.digits + "_")
_KEY_CHARS = frozenset(string.ascii_letters + string.digits + "_-")
# What may directly follow a bare key; anything else means the key needed quotes.
_AFTER_BARE_KEY = _WS | frozenset("()=!,<>")
_HEX = frozenset(string.hexdigits)
_SIMPLE_ESCAPES = {
    "\\": "\\", '"': '"', "'": "'", "`": "`", "?": "?",
    "a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
}
_HEX_ESCAPE_DIGITS = {"x": 2, "u": 4, "U": 8}
_FORMS = 'attributes:KEY, attributes.KEY = "value", hasPrefix(attributes.KEY, "prefix") or (...)'
_CONDITION = "expected a condition: " + _FORMS
_QUOTE_KEY = 'quote keys that contain characters other than letters, digits, "_" and "-"'

Attributes = Mapping[str, str]


class Filter:
    """A compiled filter. `matches(attributes)` is True when a message should be delivered."""

    __slots__ = ("text", "matches")

    def __init__(self, text: str, matches: Callable[[Attributes], bool]):
        self.text = text
        self.matches = matches

    def __repr__(self) -> str:
        return f"Filter({self.text!r})"


def compile_filter(text: str) -> Filter | None:
    """The compiled form of `text`, or None when `text` is empty (no filter: every message matches).
    Raises InvalidArgument for a filter over the size limit or outside the grammar above."""
    assert isinstance(text, str), type(text)
    if not text:
        return None
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > filter_bytes_max:
        raise InvalidArgument(
            f"Invalid filter: it is {size} bytes; a filter must be at most {filter_bytes_max} bytes (UTF-8)."
        )
    return Filter(text, _generate(_Parser(text).parse()))


# --- parsing --------------------------------------------------------------------------------------
# The tree is tuples: ("has", key) ("eq", key, value) ("ne", key, value) ("prefix", key, prefix)
# ("not", node) ("and", [nodes]) ("or", [nodes]). Groups of one are unwrapped, double negations
# cancelled and same-operator groups flattened while parsing, so evaluation depth stays small.
# Recursion costs three frames (expression, term, simple) per "(", and the byte limit allows at most
# 127 levels; chains of NOT/"-" are a loop, not recursion.


class _Parser:
    __slots__ = ("text", "n", "i")

    def __init__(self, text: str):
        self.text = text
        self.n = len(text)
        self.i = 0

    def parse(self) -> tuple:
        node = self.expression()
        self.skip_ws()
        if self.i < self.n:
            self.fail(self.i, self.describe(self.i), self.after_condition_hint(self.i, "the end of the filter"))
        return node

    # -- grammar --

    def expression(self) -> tuple:
        items = [self.term()]
        op = None
        while True:
            self.skip_ws()
            at = self.i
            word = self.word(at)
            if word not in ("AND", "OR"):
                break
            if op is None:
                op = word
            elif word != op:
                self.fail(at, f'unexpected token "{word}"', "AND and OR cannot be mixed without parentheses")
            self.i = at + len(word)
            items.append(self.term())
        if op is None:
            return items[0]
        flat = []
        for node in items:
            flat += node[1] if node[0] == op.lower() else [node]
        return (op.lower(), flat)

    def term(self) -> tuple:
        negate = False
        while True:
            self.skip_ws()
            if self.i < self.n and self.text[self.i] == "-":
                self.i += 1
            elif self.word(self.i) == "NOT":
                self.i += 3
            else:
                break
            negate = not negate
        node = self.simple()
        if not negate:
            return node
        return node[1] if node[0] == "not" else ("not", node)

    def simple(self) -> tuple:
        self.skip_ws()
        start = self.i
        if start < self.n and self.text[start] == "(":
            self.i += 1
            node = self.expression()
            self.skip_ws()
            if not self.take(")"):
                self.fail(self.i, self.describe(self.i),
                          self.after_condition_hint(self.i, f'")" to close the "(" at position {start + 1}'))
            return node
        word = self.word(start)
        if word is None:
            self.fail(start, self.describe(start), _CONDITION)
        self.i = start + len(word)
        if word == "attributes":
            return self.attribute_condition()
        self.skip_ws()
        if self.i < self.n and self.text[self.i] == "(":
            if word == "hasPrefix":
                return self.has_prefix()
            self.fail(start, f'function "{word}" is not supported', "the only function is hasPrefix")
        if word in ("AND", "OR"):
            self.fail(start, f'unexpected token "{word}"', _CONDITION)
        if word == "hasPrefix":
            self.fail(self.i, self.describe(self.i), 'expected "(" after hasPrefix')
        if word.upper() in ("AND", "OR", "NOT"):
            self.fail(start, f'unexpected token "{word}"', "the operators AND, OR and NOT must be uppercase")
        self.fail(start, f'unknown name "{word}"', "a filter can only test message attributes: " + _FORMS)

    def attribute_condition(self) -> tuple:
        """After the word `attributes`: `:KEY`, or `.KEY = "v"` / `.KEY != "v"`."""
        dot = self.i
        self.skip_ws()
        if self.take(":"):
            self.skip_ws()
            return ("has", self.key())
        if self.i < self.n and self.text[self.i] == "." and self.i > dot:
            self.fail(dot, "unexpected whitespace", 'no whitespace is allowed around the "." of attributes.KEY')
        if self.i == dot and self.take("."):
            key = self.member_key()
            self.skip_ws()
            at = self.i
            if self.text.startswith("!=", at):
                kind, self.i = "ne", at + 2
            elif self.text.startswith(("==", "=~", "!~"), at):
                op = self.text[at:at + 2]
                why = 'use "=" to compare values' if op == "==" else "regular expressions are not supported"
                self.fail(at, f'unsupported operator "{op}"', why)
            elif self.take("="):
                kind = "eq"
            elif self.text.startswith(("<", ">"), at):
                op = self.text[at:at + 2] if self.text.startswith(("<=", ">="), at) else self.text[at]
                self.fail(at, f'unsupported operator "{op}"', 'only ":", "=" and "!=" are supported')
            else:
                self.fail(at, self.describe(at), 'expected "=" or "!=" after attributes.KEY')
            self.skip_ws()
            return (kind, key, self.string_literal("the value to compare with must be a string literal"))
        self.fail(self.i, self.describe(self.i), 'expected ":KEY" or ".KEY" after "attributes"')

    def has_prefix(self) -> tuple:
        """After `hasPrefix` and whitespace, at "(": `(attributes.KEY, "prefix")`."""
        self.i += 1
        self.skip_ws()
        at = self.i
        first = 'the first argument of hasPrefix must be attributes.KEY'
        if self.word(at) != "attributes" or not self.text.startswith(".", at + 10):
            self.fail(at, self.describe(at), first)
        self.i = at + 11
        key = self.member_key()
        self.skip_ws()
        if not self.take(","):
            self.fail(self.i, self.describe(self.i), 'expected "," after the first argument of hasPrefix')
        self.skip_ws()
        prefix = self.string_literal("the second argument of hasPrefix must be a string literal")
        self.skip_ws()
        if not self.take(")"):
            self.fail(self.i, self.describe(self.i), 'expected ")": hasPrefix takes two arguments')
        return ("prefix", key, prefix)

    def member_key(self) -> str:
        """The KEY right after "attributes." (no whitespace between)."""
        if self.i < self.n and self.text[self.i] in _WS:
            self.fail(self.i, "unexpected whitespace", 'no whitespace is allowed around the "." of attributes.KEY')
        return self.key()

    def key(self) -> str:
        at = self.i
        if at < self.n and self.text[at] in "\"'":
            return self.string_literal("")
        end = at
        while end < self.n and self.text[end] in _KEY_CHARS:
            end += 1
        if end == at:
            self.fail(at, self.describe(at), f"expected an attribute key ({_QUOTE_KEY})")
        if end < self.n and self.text[end] not in _AFTER_BARE_KEY:
            self.fail(end, self.describe(end), _QUOTE_KEY)
        self.i = end
        return self.text[at:end]

    def string_literal(self, why: str) -> str:
        text, start = self.text, self.i
        if start >= self.n or text[start] not in "\"'":
            self.fail(start, self.describe(start), why or "expected a string literal")
        quote = text[start]
        out = []
        j = start + 1
        while True:
            if j >= self.n:
                self.fail(start, "unterminated string", f"no closing {quote} for the string that starts here")
            c = text[j]
            if c == quote:
                self.i = j + 1
                return "".join(out)
            if c != "\\":
                out.append(c)
                j += 1
                continue
            e = text[j + 1] if j + 1 < self.n else ""
            if e and e in _SIMPLE_ESCAPES:
                out.append(_SIMPLE_ESCAPES[e])
                j += 2
            elif e and e in _HEX_ESCAPE_DIGITS:
                width = _HEX_ESCAPE_DIGITS[e]
                digits = text[j + 2:j + 2 + width]
                if len(digits) < width or not all(d in _HEX for d in digits):
                    self.fail(j, f'invalid escape "\\{e}{digits}"', f"\\{e} takes exactly {width} hexadecimal digits")
                code = int(digits, 16)
                if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
                    self.fail(j, f'invalid escape "\\{e}{digits}"', "it is not a Unicode scalar value")
                out.append(chr(code))
                j += 2 + width
            elif e and e in "0123":
                digits = text[j + 1:j + 4]
                if len(digits) < 3 or not all(d in "01234567" for d in digits):
                    self.fail(j, f'invalid escape "\\{digits}"', "an octal escape takes exactly 3 digits, \\000 to \\377")
                out.append(chr(int(digits, 8)))
                j += 4
            else:
                self.fail(j, f'invalid escape "\\{e}"' if e else "unterminated string",
                          "supported escapes: \\\\ \\\" \\' \\` \\? \\a \\b \\f \\n \\r \\t \\v \\xHH \\uHHHH \\UHHHHHHHH \\ooo")

    # -- lexical helpers --

    def skip_ws(self) -> None:
        while self.i < self.n and self.text[self.i] in _WS:
            self.i += 1

    def take(self, c: str) -> bool:
        if self.i < self.n and self.text[self.i] == c:
            self.i += 1
            return True
        return False

    def word(self, at: int) -> str | None:
        """The identifier ([A-Za-z_][A-Za-z0-9_]*) starting at `at`, without consuming it."""
        if at >= self.n or self.text[at] not in _WORD_START:
            return None
        end = at + 1
        while end < self.n and self.text[end] in _WORD_CHARS:
            end += 1
        return self.text[at:end]

    def describe(self, at: int) -> str:
        """'unexpected ...' for whatever starts at `at`."""
        if at >= self.n:
            return "unexpected end of filter"
        word = self.word(at)
        if word is not None:
            return f'unexpected token "{word}"'
        c = self.text[at]
        if c in "\"'":
            return "unexpected string"
        if self.text.startswith("!=", at):
            return 'unexpected token "!="'
        return f'unexpected character "{c}"' if c.isprintable() else f"unexpected character U+{ord(c):04X}"

    def after_condition_hint(self, at: int, wanted: str) -> str:
        """Why the token at `at` cannot follow a complete condition, where `wanted` could."""
        word = self.word(at)
        if word in ("and", "or", "not"):
            return "the operators AND, OR and NOT must be uppercase"
        if word is not None or (at < self.n and self.text[at] in "-(\"'"):
            return "expected AND or OR between two conditions"
        if at < self.n and self.text[at] in "=!<>":
            return 'attributes:KEY only tests that KEY is present; compare values with attributes.KEY = "value"'
        return f"expected AND, OR or {wanted}"

    def fail(self, at: int, what: str, why: str):
        raise InvalidArgument(f"Invalid filter: {what} at position {at + 1}: {why}")


# --- code generation ------------------------------------------------------------------------------
# One generated lambda per filter: a message costs one Python call instead of one per tree node.
# Safe to generate: keys and values never appear in the source, only as closure variables _c0, _c1, …
# bound by an enclosing function; the source is built from the fixed templates below.


def _generate(tree: tuple) -> Callable[[Attributes], bool]:
    consts: dict[str, str] = {}  # constant -> variable name
    body = _emit(tree, consts)
    names = ", ".join(consts.values())
    source = f"def make({names}):\n    return lambda a: {body}\n"
    namespace: dict = {"__builtins__": {}}
    exec(compile(source, "<pigeon filter>", "exec"), namespace)
    return namespace["make"](*consts)


def _emit(node: tuple, consts: dict[str, str]) -> str:
    def c(value: str) -> str:
        return consts.setdefault(value, f"_c{len(consts)}")

    kind = node[0]
    if kind == "has":
        return f"({c(node[1])} in a)"
    if kind == "eq":  # a missing key gets None, which equals no string
        return f"(a.get({c(node[1])}) == {c(node[2])})"
    if kind == "ne":  # a missing key gets the value itself, so != is false
        value = c(node[2])
        return f"(a.get({c(node[1])}, {value}) != {value})"
    if kind == "prefix":
        if not node[2]:  # every present value starts with ""
            return f"({c(node[1])} in a)"
        return f"a.get({c(node[1])}, '').startswith({c(node[2])})"  # a missing key gets "", never matched
    if kind == "not":
        return f"(not {_emit(node[1], consts)})"
    assert kind in ("and", "or"), node
    return "(" + f" {kind} ".join(_emit(child, consts) for child in node[1]) + ")"
