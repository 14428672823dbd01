"""broker.filter: the Pub/Sub filter language — documented examples, missing-key semantics, precedence,
the AND/OR mixing rule, error positions, the size limit — and property tests: random filter trees
rendered to text agree with a reference evaluator; random text raises nothing but InvalidArgument."""

from __future__ import annotations

import re
import types

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pigeon.broker import filter as flt
from pigeon.broker.filter import Filter, compile_filter, filter_bytes_max
from pigeon.core.errors import InvalidArgument

SETTINGS = settings(max_examples=300, deadline=None)

MSG = {"iana.org/language_tag": "en", "domain": "com", "head": "bar", "ce-type": "dev.chainguard.bar",
       "ce-source": "baz/qux", "みんな": "x"}


def matches(text: str, attrs: dict) -> bool:
    f = compile_filter(text)
    result = f.matches(attrs)
    assert type(result) is bool
    return result


def rejected(text: str) -> str:
    with pytest.raises(InvalidArgument) as e:
        compile_filter(text)
    assert e.value.code == "INVALID_ARGUMENT"
    assert e.value.message.startswith("Invalid filter: ")
    return e.value.message


def position(message: str) -> int:
    return int(re.search(r" at position (\d+)", message).group(1))


# --- the API ---------------------------------------------------------------------------------------

def test_empty_filter_is_none_and_a_filter_keeps_its_text():
    assert compile_filter("") is None
    f = compile_filter("attributes:a")
    assert isinstance(f, Filter) and f.text == "attributes:a"
    assert repr(f) == "Filter('attributes:a')"
    assert isinstance(f.matches, types.FunctionType)  # one generated function, no per-node calls


def test_whitespace_only_is_invalid_not_empty():
    assert position(rejected("   ")) == 4


# --- examples from the Pub/Sub documentation (subscription-message-filter) --------------------------

@pytest.mark.parametrize("text, attrs, expected", [
    ("attributes:name", {"name": "com"}, True),
    ("attributes:name", {"name": ""}, True),
    ("attributes:name", {"other": "x"}, False),
    ("NOT attributes:name", {"other": "x"}, True),
    ("NOT attributes:name", {"name": "x"}, False),
    ('attributes.name = "com"', {"name": "com"}, True),
    ('attributes.name = "com"', {"name": "org"}, False),
    ('attributes.name = "com"', {}, False),
    ('attributes.name != "com"', {"name": "org"}, True),
    ('attributes.name != "com"', {"name": "com"}, False),
    ('hasPrefix(attributes.name, "co")', {"name": "com"}, True),
    ('hasPrefix(attributes.name, "co")', {"name": "org"}, False),
    ('NOT hasPrefix(attributes.name, "co")', {"name": "org"}, True),
    ('NOT hasPrefix(attributes.name, "co")', {}, True),
    ('attributes:"iana.org/language_tag" AND attributes.domain = "com"', MSG, True),
    ('attributes:"iana.org/language_tag" OR attributes.domain = "org" OR attributes.tag = "dot"', MSG, True),
    ('attributes:"iana.org/language_tag" AND (attributes.domain = "net" OR attributes.domain = "org")', MSG, False),
    ('NOT attributes:"\\u307F\\u3093\\u306A"', MSG, False),
    ('NOT attributes:"\\u307F\\u3093\\u306A"', {}, True),
    ('attributes:"iana.org/language_tag" AND (attributes.domain = "net" OR hasPrefix(attributes.domain, "co"))'
     ' AND NOT hasPrefix(attributes.head, "foo")', MSG, True),
    ('attributes.domain != "org" AND NOT attributes:unknown', MSG, True),
    ('-attributes:domain', MSG, False),
    ('-attributes:other', MSG, True),
    # hyphenated keys need no quotes (seen in production filters, e.g. CloudEvents attributes)
    ('attributes.ce-type="dev.chainguard.bar" AND hasPrefix(attributes.ce-source, "baz/")', MSG, True),
    ("attributes.domain = 'com'", MSG, True),
    ("attributes.'domain' = 'com'", MSG, True),
    ('attributes."iana.org/language_tag" = "en"', MSG, True),
])
def test_documented_examples(text, attrs, expected):
    assert matches(text, attrs) is expected


# --- semantics -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ['attributes.k = "v"', 'attributes.k != "v"', 'hasPrefix(attributes.k, "v")',
                                  'hasPrefix(attributes.k, "")', 'attributes.k = ""', 'attributes.k != ""',
                                  "attributes:k"])
def test_a_missing_key_makes_every_comparison_false_and_not_true(text):
    assert matches(text, {"other": "v"}) is False
    assert matches(f"NOT {text}", {"other": "v"}) is True
    assert matches(f"-({text})", {}) is True


def test_present_key_comparisons():
    assert matches('attributes.k != "v"', {"k": ""}) is True
    assert matches('attributes.k = ""', {"k": ""}) is True
    assert matches('hasPrefix(attributes.k, "")', {"k": ""}) is True
    assert matches('hasPrefix(attributes.k, "abc")', {"k": "ab"}) is False
    assert matches('attributes.k = "V"', {"k": "v"}) is False  # case-sensitive
    assert matches('attributes:K', {"k": "v"}) is False


def test_not_binds_tighter_than_and_or():
    # (NOT a) AND b, not NOT (a AND b): with neither present the former is false, the latter true
    assert matches("NOT attributes:a AND attributes:b", {}) is False
    assert matches("-attributes:a AND attributes:b", {}) is False
    assert matches("NOT (attributes:a AND attributes:b)", {}) is True
    assert matches("NOT attributes:a OR attributes:b", {"a": "1"}) is False
    assert matches("NOT NOT attributes:a", {"a": "1"}) is True
    assert matches("--attributes:a", {"a": "1"}) is True
    assert matches("NOT -attributes:a", {}) is False
    assert matches("NOT(attributes:a)", {}) is True


def test_and_or_each_chain_and_group_with_parentheses():
    a, b, c = "attributes:a", "attributes:b", "attributes:c"
    assert matches(f"{a} AND {b} AND {c}", {"a": "", "b": "", "c": ""}) is True
    assert matches(f"{a} AND {b} AND {c}", {"a": "", "b": ""}) is False
    assert matches(f"{a} OR {b} OR {c}", {"c": ""}) is True
    assert matches(f"({a} AND {b}) OR {c}", {"c": ""}) is True
    assert matches(f"{a} AND ({b} OR {c})", {"c": ""}) is False
    assert matches(f"(({a}))", {"a": ""}) is True
    assert matches(f"({a} OR ({b} OR {c})) AND NOT ({a} AND {b})", {"a": "", "b": ""}) is False


@pytest.mark.parametrize("text, pos", [
    ("attributes:a AND attributes:b OR attributes:c", 31),
    ("attributes:a OR attributes:b AND attributes:c", 30),
    ("(attributes:a AND attributes:b OR attributes:c)", 32),
    ("attributes:a AND (attributes:b OR attributes:c) OR attributes:d", 49),
])
def test_and_and_or_cannot_mix_without_parentheses(text, pos):
    message = rejected(text)
    assert position(message) == pos
    assert "AND and OR cannot be mixed without parentheses" in message
    assert message.startswith(f'Invalid filter: unexpected token "{text[pos - 1:pos + 1].strip()}')


def test_whitespace_is_flexible_around_operators():
    for text in ['attributes.k="v"', 'attributes.k  =\t"v"', ' attributes.k = "v" ', '\nattributes.k\n=\n"v"\n',
                 '( attributes.k = "v" )', 'hasPrefix ( attributes.k ,"v" )', 'hasPrefix(attributes.k,"v")',
                 "attributes : k", "attributes:k", '- attributes.k = "w"', 'attributes.k!="w"',
                 'attributes:k AND(attributes:k)', '(attributes:k)AND(attributes:k)']:
        assert matches(text, {"k": "v"}) is True, text


# --- string literals and keys ----------------------------------------------------------------------

@pytest.mark.parametrize("literal, value", [
    (r'"a\"b"', 'a"b'), (r"'it\'s'", "it's"), (r'"back\\slash"', "back\\slash"), ('"it\'s"', "it's"),
    ("'say \"hi\"'", 'say "hi"'), (r'"\a\b\f\n\r\t\v\?\`"', "\a\b\f\n\r\t\v?`"), (r'"\x41\x7a"', "Az"),
    (r'"\u00e9\u307F"', "éみ"), (r'"\U0001F600"', "😀"), (r'"\101\000\377"', "A\x00\xff"), ('"é😀"', "é😀"),
    ('"line\nbreak"', "line\nbreak"), ('""', ""),
])
def test_string_literal_escapes(literal, value):
    assert matches(f"attributes.k = {literal}", {"k": value}) is True
    assert matches(f"attributes:{literal}", {value: "x"}) is True
    assert matches(f"attributes.{literal} = 'x'", {value: "x"}) is True


def test_keys_and_values_never_reach_generated_code_as_source():
    evil = "__import__('os').system('exit 1')"
    text = f'attributes."{evil}" = "{evil}" AND hasPrefix(attributes."\\")", "{{}}")'
    assert matches(text, {evil: evil, '")': "{}x"}) is True
    assert matches(text, {evil: evil}) is False


@pytest.mark.parametrize("key", ["a", "A9", "9", "k-1", "-k", "_", "ce-type", "AND", "OR", "NOT", "attributes"])
def test_bare_keys(key):
    assert matches(f"attributes:{key}", {key: ""}) is True
    assert matches(f'attributes.{key} = "v"', {key: "v"}) is True


# --- errors and their positions --------------------------------------------------------------------

@pytest.mark.parametrize("text, pos, fragment", [
    ('hasSuffix(attributes.k, "x")', 1, 'function "hasSuffix" is not supported'),
    ('attributes:k AND matches(attributes.k, "x.*")', 18, 'function "matches" is not supported'),
    ('hasprefix(attributes.k, "x")', 1, 'function "hasprefix" is not supported'),
    ('attributes.k =~ "x.*"', 14, "regular expressions are not supported"),
    ('attributes.k !~ "x"', 14, "regular expressions are not supported"),
    ('attributes.k < "5"', 14, 'unsupported operator "<"'),
    ('attributes.k >= "5"', 14, 'unsupported operator ">="'),
    ('attributes.k == "5"', 14, 'use "=" to compare'),
    ('attributes.k = 5', 16, "must be a string literal"),
    ('attributes.k = other', 16, "must be a string literal"),
    ("attributes.k", 13, 'expected "=" or "!="'),
    ('attributes:k = "v"', 14, "only tests that KEY is present"),
    ('attributes . k = "v"', 11, "no whitespace is allowed around"),
    ('attributes. k = "v"', 12, "no whitespace is allowed around"),
    ('attributes.iana.org = "en"', 16, "quote keys that contain characters"),
    ("attributes:iana.org/language_tag", 16, "quote keys that contain characters"),
    ("attributes:", 12, "expected an attribute key"),
    ("attributes", 11, 'expected ":KEY" or ".KEY"'),
    ('Attributes:k', 1, 'unknown name "Attributes"'),
    ('data = "x"', 1, 'unknown name "data"'),
    ("attributes:a and attributes:b", 14, "must be uppercase"),
    ("attributes:a AND not attributes:b", 18, "must be uppercase"),
    ("attributes:a attributes:b", 14, "expected AND or OR between two conditions"),
    ("attributes:a AND", 17, "unexpected end of filter"),
    ("AND attributes:a", 1, 'unexpected token "AND"'),
    ("NOT", 4, "expected a condition"),
    ("()", 2, "expected a condition"),
    ("(attributes:a", 14, 'to close the "(" at position 1'),
    ("attributes:a)", 13, 'unexpected character ")"'),
    ('hasPrefix(attributes.k "x")', 24, 'expected ","'),
    ('hasPrefix(attributes:k, "x")', 11, "first argument of hasPrefix must be attributes.KEY"),
    ('hasPrefix("x", attributes.k)', 11, "first argument of hasPrefix must be attributes.KEY"),
    ("hasPrefix(attributes.k, x)", 25, "second argument of hasPrefix must be a string literal"),
    ('hasPrefix(attributes.k, "x", "y")', 28, "hasPrefix takes two arguments"),
    ("hasPrefix", 10, 'expected "(" after hasPrefix'),
    ('attributes.k = "abc', 16, "unterminated string"),
    ("attributes.k = 'abc\"", 16, "unterminated string"),
    ('attributes.k = "a\\', 18, "unterminated string"),
    ('attributes.k = "\\q"', 17, 'invalid escape "\\q"'),
    ('attributes.k = "\\x4"', 17, "takes exactly 2 hexadecimal digits"),
    ('attributes.k = "\\u12g4"', 17, "takes exactly 4 hexadecimal digits"),
    ('attributes.k = "\\uD800"', 17, "not a Unicode scalar value"),
    ('attributes.k = "\\U00110000"', 17, "not a Unicode scalar value"),
    ('attributes.k = "\\400"', 17, "invalid escape"),
    ('attributes.k = "\\08"', 17, "octal escape takes exactly 3 digits"),
    ("attributes:k\x00", 13, "U+0000"),
    ("attributes:k AND attributes:é", 29, "expected an attribute key"),
])
def test_errors_name_the_problem_and_its_position(text, pos, fragment):
    message = rejected(text)
    assert position(message) == pos, message
    assert fragment in message, message


# --- the size limit --------------------------------------------------------------------------------

def test_limit_is_256_utf8_bytes():
    assert filter_bytes_max == 256
    base = 'attributes.k = ""'
    at_limit = base[:-1] + "v" * (256 - len(base)) + '"'
    assert len(at_limit.encode()) == 256
    assert matches(at_limit, {"k": "v" * (256 - len(base))}) is True
    message = rejected(at_limit[:-1] + 'v"')
    assert "257 bytes" in message and "at most 256 bytes" in message
    # characters are not bytes: 120 characters of "é" are 240 bytes, 130 are 260
    assert compile_filter(base[:-1] + "é" * 119 + '"') is not None
    assert "at most 256 bytes" in rejected(base[:-1] + "é" * 130 + '"')


def test_lone_surrogates_are_rejected_not_crashing():
    rejected("attributes:\ud800")
    assert matches('attributes:"\ud800"', {"\ud800": ""}) is True  # inside a string it is just a key


# --- property tests --------------------------------------------------------------------------------
# Trees: ("has", k) ("eq"|"ne"|"prefix", k, v) ("not", t) ("and"|"or", [t, ...]).

KEYS = ["a", "b", "k-1", "9", "AND", "my key", "iana.org/tag", 'q"t', "it's", "\\", "é", "😀"]
VALUES = ["", "v", "va", "val", "x\\y", "'", '"', "é", "\n", "😀", "\x00"]

leaves = st.one_of(
    st.tuples(st.just("has"), st.sampled_from(KEYS)),
    st.tuples(st.sampled_from(["eq", "ne", "prefix"]), st.sampled_from(KEYS), st.sampled_from(VALUES)),
)
trees = st.recursive(
    leaves,
    lambda kids: st.one_of(
        st.tuples(st.just("not"), kids),
        st.tuples(st.sampled_from(["and", "or"]), st.lists(kids, min_size=2, max_size=3)),
    ),
    max_leaves=10,
)
attribute_dicts = st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=6)


def evaluate(tree, attrs) -> bool:
    """The reference semantics, written independently of the module."""
    kind = tree[0]
    if kind == "has":
        return tree[1] in attrs
    if kind in ("eq", "ne", "prefix"):
        if tree[1] not in attrs:
            return False
        value = attrs[tree[1]]
        return {"eq": value == tree[2], "ne": value != tree[2], "prefix": value.startswith(tree[2])}[kind]
    if kind == "not":
        return not evaluate(tree[1], attrs)
    results = [evaluate(t, attrs) for t in tree[1]]
    return all(results) if kind == "and" else any(results)


def quoted(s: str, rnd) -> str:
    q = rnd.choice("\"'")
    out = [q]
    named = {"\n": "\\n", "\t": "\\t", "\a": "\\a", "\b": "\\b", "\f": "\\f", "\r": "\\r", "\v": "\\v"}
    for ch in s:
        code = ord(ch)
        forms = [f"\\U{code:08X}"]
        if ch in (q, "\\"):
            forms.append("\\" + ch)
        else:
            forms.append(ch)
        if ch in named:
            forms.append(named[ch])
        if ch in "\"'?`":
            forms.append("\\" + ch)
        if code < 0x100:
            forms += [f"\\x{code:02x}", f"\\{code:03o}"]
        if code < 0x10000:
            forms.append(f"\\u{code:04X}")
        out.append(rnd.choice(forms))
    return "".join(out) + q


def render(tree, rnd) -> str:
    def ws():
        return rnd.choice(["", "", " ", "  ", "\t", "\n"])

    def sep():
        return rnd.choice([" ", " ", "  ", "\n", "\t "])

    def key(k):
        bare = re.fullmatch(r"[A-Za-z0-9_-]+", k) is not None
        return k if bare and rnd.random() < 0.7 else quoted(k, rnd)

    def child(t, parent_kind):
        text = render(t, rnd)
        needs = t[0] in ("and", "or") and (t[0] != parent_kind or rnd.random() < 0.5)
        if needs or rnd.random() < 0.15:
            return "(" + ws() + text + ws() + ")"
        return text

    kind = tree[0]
    if kind == "has":
        return "attributes" + ws() + ":" + ws() + key(tree[1])
    if kind in ("eq", "ne"):
        return "attributes." + key(tree[1]) + ws() + ("=" if kind == "eq" else "!=") + ws() + quoted(tree[2], rnd)
    if kind == "prefix":
        return ("hasPrefix" + ws() + "(" + ws() + "attributes." + key(tree[1]) + ws() + "," + ws()
                + quoted(tree[2], rnd) + ws() + ")")
    if kind == "not":
        return rnd.choice(["NOT" + sep(), "-" + ws()]) + child(tree[1], kind)
    return (sep() + kind.upper() + sep()).join(child(t, kind) for t in tree[1])


@SETTINGS
@given(trees, st.lists(attribute_dicts, min_size=1, max_size=4), st.randoms(use_true_random=False))
def test_rendered_trees_match_the_reference_evaluator(tree, dicts, rnd):
    text = render(tree, rnd)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(flt, "filter_bytes_max", 1 << 20)  # the grammar, not the size limit, is under test
        f = compile_filter(text)
    for attrs in dicts:
        assert f.matches(attrs) is evaluate(tree, attrs), (text, attrs)


TOKENS = ["attributes", ".", ":", "a", "k-1", '"v"', "'v'", '"', "'", "\\", "\\x4", "\\u00e9", "\\400", "(", ")",
          ",", "=", "!=", "==", "<", "AND", "OR", "NOT", "-", " ", " ", "hasPrefix", "hasSuffix", "and", "\t", "é",
          "\x00", "😀"]
# Whole pieces, so that a fair share of the soup parses and the deeper paths get exercised.
PIECES = [" AND ", " OR ", "NOT ", "-", "(", ")", "attributes:a", 'attributes.a = "v"', "attributes.k-1!='x'",
          'hasPrefix(attributes.a, "v")']


def check_garbage(text: str) -> None:
    try:
        f = compile_filter(text)
    except InvalidArgument as e:
        assert e.message.startswith("Invalid filter: ")
        if "at most" not in e.message:
            assert 1 <= position(e.message) <= len(text) + 1, (text, e.message)
        return
    assert f is None or all(type(f.matches(attrs)) is bool for attrs in ({}, {"a": "v"}, {"k-1": ""}))


@SETTINGS
@given(st.text(max_size=300))
def test_random_text_raises_only_invalid_argument(text):
    check_garbage(text)


@SETTINGS
@given(st.one_of(st.lists(st.sampled_from(TOKENS + PIECES), max_size=40).map("".join),
                 st.lists(st.sampled_from(PIECES), max_size=20).map("".join)))
def test_random_token_soup_raises_only_invalid_argument(text):
    check_garbage(text)


def test_deepest_nesting_within_the_limit():
    leaf = "attributes:a"
    depth = (filter_bytes_max - len(leaf)) // 2
    assert matches("(" * depth + leaf + ")" * depth, {"a": ""}) is True
    assert matches("-" * (filter_bytes_max - len(leaf)) + leaf, {"a": ""}) is True  # 244 is even
    assert matches("NOT (" * 40 + leaf + ")" * 40, {"a": ""}) is True
    alternating = leaf
    for i in range(12):
        alternating = f"attributes:b {'AND' if i % 2 else 'OR'} ({alternating})"
    assert len(alternating.encode()) <= filter_bytes_max
    assert matches(alternating, {"a": "", "b": ""}) is True
