"""Fallback answer normalizer: decides whether two final answers are the same math value.

Used by rpg_ref.math.reward when math-verify is not installed (or when asked for explicitly).
It never calls eval/exec/sympify on model text: LaTeX-ish strings go through a small tokenizer
and a hand-written recursive-descent parser that only builds sympy numbers, symbols and
+ - * / ^, sqrt, pi, i, and a few named functions. Anything else is "not parseable" and
falls back to comparing canonical strings.

What counts as equal (`answers_equal(pred, gold)`):
  0. first `comparable_pair` (used by both backends of rpg_ref.math.reward): `strip_decorations`
     removes what is not part of the value - `$` delimiters, a \\boxed{}, a currency sign
     (`$32,348`, `\\$32,348`), trailing unit words, bare or in \\text{} ("204 minutes",
     "3\\sqrt{13} units", "864 in^2", "15\\mbox{ cm}^2"; never a word that changes the value:
     "5 hundred", "2 pi", and never a radical or a variable), a trailing remark "(mod 1000)";
     "and"/"or" between values become commas (so a hedge "3 or 5" is a list, never one value).
     Then `align_labels`: a label ("x", "xy", "a_{2023}", "f(2)", "m+n", "(p,q,r)", "\\angle ABC")
     before "=" or "\\in" is dropped when only one side has one, must agree when both do ("y = 5"
     is not "x = 5"), and an equation that is not "label = value" never equals a value
     ("2x = 10" is not 10; "12 \\times 17 = 204" is 204: the sides before the last are constants).
     A hedged or approximate answer ("5 or more", "5 \\text{ hundred}", "\\approx 5", "n \\ge 5")
     and one nested deeper than _MAX_NESTING // 2 brackets never match;
  1. canonical strings are equal (see `canonical`): whitespace, \\left/\\right, spacing
     commands, \\dfrac/\\tfrac, degree signs, `\\%`, thousands separators ("10,\\!080"), leading
     zeros ("025"), trailing ".0" are removed; a lone \\text{...} answer compares
     case-insensitively;
  2. both sides parse as exact rationals (integers, decimals, a/b, \\frac, mixed numbers
     "1\\frac{4}{5}") and the rationals are equal;
  3. both sides parse (parser below) into the same structure - a number/expression, an ordered
     tuple or interval (bracket types must agree), an unordered list ("1, -2", "\\{..\\}",
     "a \\pm b"), a union of intervals (in any order), a matrix, or an equation - and every element
     pair is equal: numbers with no free symbols must agree to a relative 1e-9 after exact
     simplification (so 0.333 is NOT 1/3), expressions with symbols must have `expand(a - b) == 0`,
     equations compare lhs - rhs. Nesting deeper than _MAX_NESTING parser levels is "not
     parseable" (no match), never a RecursionError.
Time: sympy can be slow on adversarial input (e.g. 9^9^9^9); callers must run this under a
time limit (rpg_ref.math.reward.AnswerChecker does, in a worker process).
"""
from __future__ import annotations

import math
import re
from fractions import Fraction

import sympy

_SPACING = [r"\left", r"\right", r"\!", r"\,", r"\;", r"\:", r"\ ", "~", r"\displaystyle",
            r"\big", r"\Big"]
_TEXT_ONLY_RE = re.compile(r"^\\(?:text|textbf|mbox|textrm|mathrm)\{(?P<t>[^{}]*)\}$")
_THOUSANDS_RE = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")
_NUMBER_RE = re.compile(r"^-?(?:\d+\.?\d*|\.\d+)$")


def _strip_dollars(s: str) -> str:
    s = s.strip()
    while len(s) >= 2 and s[0] == "$" and s[-1] == "$" and not s.endswith(r"\$"):
        s = s[1:-1].strip()
    return s


def _unwrap_boxed(s: str) -> str:
    for cmd in (r"\boxed{", r"\fbox{"):
        if s.startswith(cmd) and s.endswith("}") and _matching_brace(s, len(cmd) - 1) == len(s) - 1:
            return s[len(cmd):-1].strip()
    return s


def _matching_brace(s: str, open_at: int) -> int:
    """Index of the '}' matching the '{' at s[open_at], or -1."""
    depth = 0
    for j in range(open_at, len(s)):
        if s[j] == "{":
            depth += 1
        elif s[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return -1


# ---------------------------------------------------------------- decorations: what is not math
# Words that change or hedge a value: never stripped as a unit ("5 hundred" is not 5), and an
# answer that has one never equals a gold without (`_qualified`: "5 or more" is not 5).
_QUALIFIERS = frozenset({
    "hundred", "hundreds", "thousand", "thousands", "million", "millions", "billion", "billions",
    "trillion", "trillions", "dozen", "dozens", "squared", "cubed", "half", "halves", "third",
    "thirds", "quarter", "quarters", "fourth", "fourths", "fifth", "fifths", "sixth", "sixths",
    "seventh", "sevenths", "eighth", "eighths", "ninth", "ninths", "tenth", "tenths", "hundredth",
    "hundredths", "thousandth", "thousandths", "millionth", "millionths", "factorial",
    "repeating", "recurring", "approx", "approximately", "about", "around", "roughly", "nearly",
    "almost", "more", "less", "fewer", "least", "most", "than", "over", "under", "above", "below",
    "up", "plus", "minus", "maybe", "possibly", "perhaps", "probably", "not", "rounded", "rounding",
    "estimate", "estimated"})
# A word after a value is a unit ("204 minutes", "27 miles", "15 cm^2", "12 square units") unless
# it is one of these ("5 pi" is not 5).
_NOT_UNITS = _QUALIFIERS | frozenset({
    "and", "or", "is", "are", "no", "none", "only", "times", "root", "roots", "pi", "sin", "cos",
    "tan", "cot", "sec", "csc", "log", "ln", "lg", "exp", "mod", "pmod", "gcd", "lcm", "det",
    "max", "arcsin", "arccos", "arctan", "infinity", "infty", "undefined", "score", "prime",
    "base", "binary", "decimal", "octal", "hex", "hexadecimal", "bar"})
# Short words (1-3 letters) look like variables ("2 xy"): bare, only these are units; inside
# \text{...} any word not in _NOT_UNITS is one.
_UNIT_ABBREVIATIONS = frozenset({
    "cm", "mm", "km", "nm", "um", "in", "ft", "yd", "mi", "sq", "cu", "kg", "mg", "lb", "lbs",
    "oz", "ml", "mL", "hr", "hrs", "min", "mins", "secs", "ms", "mph", "kph", "kmh", "deg",
    "rad", "cc", "gal", "qt", "pt"})
_FILLER_WORDS = frozenset({"of", "the", "an", "each", "per"})  # "3/4 of the tank", "miles per hour"
_EXPONENT = r"(?:\^\s*\{?\s*[23]\s*\}?|[²³])"
_UNIT_TEXT_END_RE = re.compile(
    r"\\(?:text|mbox|textrm|mathrm|rm|textnormal)\s*\{(?P<words>[^{}]*)\}"
    rf"\s*{_EXPONENT}?\s*$"
)
_UNIT_WORD_END_RE = re.compile(
    r"(?<![\\A-Za-z])(?P<words>[A-Za-z]+\.?)(?:\s*/\s*(?P<per>[A-Za-z]+)\.?)?"
    rf"\s*{_EXPONENT}?\s*$"
)
# one-letter units, bare only in a rate ("5 m/s", "60 km/h"): alone, "5 m" may be 5m
_RATE_LETTERS = frozenset({"m", "g", "s", "h", "L"})
_TRAILING_SPACE_RE = re.compile(r"(?:\\[,;:! ]|\\q?quad|~|\s)+$")
_VALUE_RE = re.compile(r"[\d\\})\]]")  # a number, a command or a bracket: not a plain word
_VALUE_END_RE = re.compile(r"[0-9A-Za-z})\]|!'.]$")
_CONNECTIVE_RE = re.compile(r"\s*\\(?:text|mbox|textrm)\{\s*(?:and|or)\s*\}\s*|\s+(?:and|or)\s+")
_BARE_WORD_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")  # a word, not a command's name
_REMARK_RE = re.compile(r"\((?P<remark>[^()]*)\)\s*$")
_WORD_RE = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{3,}")
_RESTATEMENTS = ("mod", "approx", "about", "roughly", "i.e", "ie ", "that is", "exactly", "rounded",
                 "which is", "in ")
_UNICODE = str.maketrans(
    {
        "\u2212": "-",
        "\u2013": "-",
        "\u00d7": r"\times ",
        "\u22c5": r"\cdot ",
        "\u00b7": r"\cdot ",
        "\u00f7": "/",
        "\u03c0": r"\pi ",
        "\u221e": r"\infty ",
        "\u221a": r"\sqrt ",
        "\u00b2": "^2",
        "\u00b3": "^3",
        "\u2264": r"\le ",
        "\u2265": r"\ge ",
        "\u222a": r"\cup ",
        "\u2208": r"\in ",
        "\u00a0": " ",
        "\u2009": " ",
        "\u202f": " ",
    }
)
_UNESCAPED_DOLLAR_RE = re.compile(r"(?<!\\)\$")
_CURRENCY_RE = re.compile(r"^(-?)\s*(?:\\\$|\$|US\$|USD)\s*(?=[\d.])")


def _is_unit_word(word: str, in_text: bool) -> bool:
    w = word.strip().rstrip(".")
    w = re.sub(rf"{_EXPONENT}$", "", w)
    if not w.isalpha() or w.lower() in _NOT_UNITS:
        return False
    if in_text or w in _UNIT_ABBREVIATIONS or w.lower() in _UNIT_ABBREVIATIONS | _FILLER_WORDS:
        return True
    return len(w) >= 4 and (w.islower() or w.istitle())


def _strip_units(s: str) -> str:
    """Remove trailing unit words, bare or in \\text{...}, with an optional ^2/^3 (up to 6
    words)."""
    for _ in range(6):
        m = _UNIT_TEXT_END_RE.search(s)
        in_text = m is not None
        if not in_text:
            m = _UNIT_WORD_END_RE.search(s)
        if m is None:
            return s
        value = _TRAILING_SPACE_RE.sub("", s[:m.start()])
        if in_text:
            words = re.split(r"[\s/]+", m.group("words").strip())
            is_unit = all(_is_unit_word(w, True) for w in words if w) and any(words)
        else:
            word, per = m.group("words"), m.group("per")
            glued = value == s[:m.start()]  # "15cm": only a known abbreviation
            is_unit = (_is_unit_word(word, False) or (per and word in _RATE_LETTERS)) and (
                not per or _is_unit_word(per, False) or per in _RATE_LETTERS) and (
                not glued or word.rstrip(".") in _UNIT_ABBREVIATIONS)
        if not (is_unit and _VALUE_RE.search(value) and _VALUE_END_RE.search(value)):
            return s
        s = value
    return s


def _remove_dollars(s: str) -> str:
    """`$` pairs are math delimiters ("$5$ dollars"); a lone `$` before a number is currency."""
    if len(_UNESCAPED_DOLLAR_RE.findall(s)) % 2 == 1:
        m = re.search(r"(?<!\\)\$(?=\s*[\d.])", s)
        if m is None:
            return s
        s = s[:m.start()] + s[m.end():]
    return _UNESCAPED_DOLLAR_RE.sub("", s).strip()


def _strip_remark(s: str) -> str:
    """Drop a trailing remark in parentheses: words without numbers ("\\frac13 (exact value)"), or
    a restatement ("12 (mod 1000)", "(approximately 0.33)"). "(3, \\infty)", "f(x)" are no remark
    (no word of three letters), nor is a hedge with a number "(or possibly 6)" or a qualifier
    "(rounded)"."""
    m = _REMARK_RE.search(s)
    if not (m and s[:m.start()].strip() and _WORD_RE.search(m.group("remark"))):
        return s
    remark = m.group("remark").strip().lower()
    if re.search(r"\d", remark):  # a number in it: only a restatement of the value goes
        return s[:m.start()].rstrip() if remark.startswith(_RESTATEMENTS) else s
    if any(w in _QUALIFIERS for w in re.findall(r"[a-z]+", remark)):
        return s  # "5 (rounded)" qualifies the value: kept, so it never matches (`_qualified`)
    return s[:m.start()].rstrip()


def strip_decorations(ans: str) -> str:
    """The answer without what is not part of its value: `$` delimiters, a \\boxed{} around it, a
    trailing full stop, a currency sign (`\\$32,348`, `$32,348`), trailing unit words
    (`204 minutes`, `3\\sqrt{13} units`, `864 in^2`, `15\\mbox{ cm}^2`), a trailing remark in
    parentheses, \\text{} around a number; Unicode math signs become LaTeX (−, ×, π, √, ...);
    "and"/"or" between values become commas (a list never equals a single value, so a hedge
    "3 or 5" stays wrong)."""
    s = ans.translate(_UNICODE)
    s = _unwrap_boxed(_strip_dollars(s))
    s = _remove_dollars(s).replace("{,}", ",")
    m = _TEXT_ONLY_RE.match(s.strip())
    if m and re.search(r"\d", m.group("t")):  # \text{5 cm}: a number written as text
        s = m.group("t")
    s = s.strip().rstrip(".").strip()
    s = _CURRENCY_RE.sub(r"\1", _strip_remark(s))
    s = _strip_units(s)
    return _CONNECTIVE_RE.sub(", ", s).strip()


def _answer_text(ans) -> str:
    if isinstance(ans, bool):
        raise ValueError(f"answer must be str/int/float, got bool {ans!r}")
    if isinstance(ans, float):
        if not math.isfinite(ans):
            raise ValueError(f"answer is not finite: {ans!r}")
        return str(int(ans)) if ans.is_integer() else repr(ans)
    return str(ans)


def canonical(ans) -> str:
    """A canonical string for an answer (str, int or float; floats like 27.0 become "27")."""
    s = strip_decorations(_answer_text(ans))
    s = s.replace("\\\\", "\x00")  # protect matrix row breaks from the "\ " spacing rule
    for tok in _SPACING:
        s = s.replace(tok, " ")
    s = s.replace("\x00", "\\\\")
    s = s.replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac")
    for deg in (r"^\circ", r"^{\circ}", "°", r"\circ", r"\%", "%", r"\$"):
        s = s.replace(deg, "")
    s = s.strip().rstrip(".").strip()
    m = _TEXT_ONLY_RE.match(s)
    if m:  # a word answer: "\text{Evelyn}", "\text{(C)}" -> "evelyn", "c"
        t = m.group("t").strip().lower()
        return t[1:-1] if re.fullmatch(r"\([a-z]\)", t) else t
    s = _drop_spaces(s)
    s = re.sub(r"_\{(\d+)\}", r"_\1", s)  # base subscripts: 4210_{5} -> 4210_5
    if _THOUSANDS_RE.match(s):
        s = s.replace(",", "")
    if _NUMBER_RE.match(s):
        s = _canonical_number(s)
    if re.fullmatch(r"\(?[A-Za-z]\)?|[A-Za-z]+", s):  # a choice "(C)" or a word: no case
        s = s.strip("()").lower()
    return s


def _drop_spaces(s: str) -> str:
    """Whitespace is insignificant in LaTeX math, except that it ends a command name: "\\cot x"."""
    def repl(m):
        keep = re.search(r"\\[A-Za-z]+$", s[:m.start()]) and s[m.end():m.end() + 1].isalpha()
        return " " if keep else ""
    return re.sub(r"\s+", repl, s)


def _canonical_number(s: str) -> str:
    q = Fraction(s)  # "025" -> "25", "27.0" -> "27"; other decimals compare as rationals later
    return str(q.numerator) if q.denominator == 1 else s


# ---------------------------------------------------------------- labels: "xy = 25" -> 25
# A label names what was asked: a variable or a product of variables ("x", "xy", "\theta", "AB"),
# with subscripts, primes or arguments ("a_{2023}", "f(2)", "\angle ABC"), a sum of those ("m+n")
# or a tuple of them ("(p,q,r)"). "2x = 10", "x^2 = 25" or "x+1 = 5" are equations, not labels:
# stripping them would accept 10 for x = 5.
_GREEK = ("alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|"
          "nu|xi|rho|sigma|tau|upsilon|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|Sigma|"
          "Phi|Psi|Omega")
_NAME = rf"(?:[A-Za-z]|\\(?:{_GREEK})(?![A-Za-z]))"
_IDENT = (rf"(?:(?:m\s*)?\\angle\s*)?(?:\\overline\s*\{{[A-Za-z]+\}}|(?:{_NAME}\s*)+)'*"
          r"(?:_\{[^{}]{1,20}\}|_[A-Za-z0-9])?'*(?:\([^()=]{1,20}\))?")
_LABEL_RE = re.compile(
    rf"\s*(?:{_IDENT}(?:\s*\+\s*{_IDENT})*|\(\s*{_IDENT}(?:\s*,\s*{_IDENT})+\s*\))\s*"
)
_IN_RE = re.compile(r"\\in(?![A-Za-z])")
_MAX_LABEL_CHARS = 60
_CHOICE_RE = re.compile(r"\s*(?:\\text(?:bf)?\s*\{\s*)?\(([A-E])\)\s*\}?(?:\s|\\[ ,;:!]|~)*")
# commands that keep a side of "12 \times 17 = 204" a constant (no unknown in it)
_CONSTANT_COMMANDS = frozenset({
    "frac", "dfrac", "tfrac", "sqrt", "pi", "cdot", "times", "div", "left", "right"})


def _is_label(s: str) -> bool:
    return len(s) <= _MAX_LABEL_CHARS and _LABEL_RE.fullmatch(s) is not None


def _is_constant(s: str) -> bool:
    """True for a side with numbers and operators only ("12 \\times 17", "\\frac{3}{4} \\cdot
    100")."""
    if any(c not in _CONSTANT_COMMANDS for c in re.findall(r"\\([A-Za-z]+)", s)):
        return False
    return s.strip() != "" and re.search(r"[A-Za-z]", re.sub(r"\\[A-Za-z]+", "", s)) is None


def split_label(s: str) -> tuple[str | None, str]:
    """(label, value) of "label = value" or "label \\in value", else (None, s). A chain
    "label = 3 \\cdot 5 = 15" (or "3 \\cdot 5 = 15") gives its last side when the sides between are
    constants. A list of labelled values "x = 3, x = 5" gives the values "3, 5" (label "x")."""
    sides = _split_top(s, "=")
    if len(sides) == 1:
        parts = _IN_RE.split(s, maxsplit=1)
        if len(parts) == 2 and _is_label(parts[0]) and not _IN_RE.search(parts[1]):
            return parts[0].strip(), parts[1].strip()
        return None, s
    if all(_is_constant(x) for x in sides[1:-1]) and sides[-1].strip():
        if _is_label(sides[0]):
            return sides[0].strip(), sides[-1].strip()
        if _is_constant(sides[0]):
            return "", sides[-1].strip()
    items = [_split_top(x, "=") for x in _split_top(s, ",")]
    if len(items) > 1 and all(len(x) == 2 and _is_label(x[0]) and x[1].strip() for x in items):
        labels = {re.sub(r"\s+", "", x[0]) for x in items}
        if len(labels) == 1:
            return labels.pop(), ", ".join(x[1].strip() for x in items)
    return None, s


def align_labels(pred: str, gold: str) -> tuple[str, str] | None:
    """The two values to compare once labels are accounted for, or None when they cannot match.

    A label on only one side is dropped (gold "x=5" vs "5", or "xy = 25" vs gold 25: the label
    names what was asked). Labels on both sides must agree ("y = 5" is not gold "x = 5"). An
    equation that is not "label = value" ("2x = 10") never matches a gold without one."""
    pl, pv = split_label(pred)
    gl, gv = split_label(gold)
    if pl and gl:
        return (pv, gv) if re.sub(r"\s+", "", pl) == re.sub(r"\s+", "", gl) else None
    if pl is not None:
        pred = pv
    if gl is not None:
        gold = gv
    if (len(_split_top(pred, "=")) > 1) != (len(_split_top(gold, "=")) > 1):
        return None  # an equation against a value
    return pred, gold


# ---------------------------------------------------------------- exact rationals
_FRAC_RE = re.compile(r"^(-?)\\frac(?:\{(\d+)\}|(\d))(?:\{(\d+)\}|(\d))$")
_MIXED_RE = re.compile(r"^(-?)(\d+)\\frac\{(\d+)\}\{(\d+)\}$")
_SLASH_RE = re.compile(r"^(-?\d+)/(\d+)$")


def as_rational(c: str) -> Fraction | None:
    """Exact value of a canonical string that is a plain rational number, else None."""
    if _NUMBER_RE.match(c):
        return Fraction(c)
    m = _SLASH_RE.match(c)
    if m and int(m.group(2)) != 0:
        return Fraction(int(m.group(1)), int(m.group(2)))
    m = _FRAC_RE.match(c)
    if m:
        num, den = int(m.group(2) or m.group(3)), int(m.group(4) or m.group(5))
        if den != 0:
            return Fraction(num, den) * (-1 if m.group(1) else 1)
    m = _MIXED_RE.match(c)  # "1\frac{4}{5}" is a mixed number (9/5), as in MATH answers
    if m and int(m.group(4)) != 0:
        v = int(m.group(2)) + Fraction(int(m.group(3)), int(m.group(4)))
        return -v if m.group(1) else v
    return None


# ---------------------------------------------------------------- LaTeX-ish expression parser
_FUNCS = {"sqrt": sympy.sqrt, "sin": sympy.sin, "cos": sympy.cos, "tan": sympy.tan,
          "cot": sympy.cot, "sec": sympy.sec, "csc": sympy.csc, "ln": sympy.log,
          "log": sympy.log, "exp": sympy.exp}
_TOKEN_RE = re.compile(r"\s*(?:(?P<num>\d+\.?\d*|\.\d+)|\\(?P<cmd>[A-Za-z]+)|(?P<name>[A-Za-z])"
                       r"|(?P<op>[-+*/^(){}\[\],=&|]|\\\\|\\\{|\\\}))")


_MAX_EXPONENT = 10_000  # 9^(9^9) would take minutes and gigabytes: refuse, as not parseable
_MAX_NESTING = 100  # parser levels (about 50 brackets deep): far below Python's recursion limit


class _ParseError(ValueError):
    pass


def _tokenize(s: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(s):
        m = _TOKEN_RE.match(s, pos)
        if not m or m.end() == pos:
            raise _ParseError(f"unexpected character {s[pos]!r}")
        pos = m.end()
        kind = m.lastgroup
        val = m.group(kind)
        if kind == "cmd" and val in ("cdot", "times"):
            kind, val = "op", "*"
        out.append((kind, val))
    return out


class _Parser:
    """expr := term (('+'|'-') term)*; term := unary (('*'|'/'|implicit) unary)*;
    unary := ('-'|'+') unary | power; power := atom ('^' unary)?

    Every recursion goes through `unary` or `atom`; past _MAX_NESTING of them the input is "not
    parseable" (a _ParseError, hence no match) instead of a RecursionError."""

    def __init__(self, tokens):
        self.t, self.i, self.depth = tokens, 0, 0

    def _enter(self):
        self.depth += 1
        if self.depth > _MAX_NESTING:
            raise _ParseError(f"nested deeper than {_MAX_NESTING} levels")

    def peek(self):
        return self.t[self.i] if self.i < len(self.t) else (None, None)

    def take(self, val=None):
        tok = self.peek()
        if tok[0] is None or (val is not None and tok[1] != val):
            raise _ParseError(f"expected {val!r}, got {tok[1]!r}")
        self.i += 1
        return tok

    def expr(self):
        v = self.term()
        while self.peek()[1] in ("+", "-"):
            op = self.take()[1]
            r = self.term()
            v = v + r if op == "+" else v - r
        return v

    def term(self):
        v = self.unary()
        while True:
            kind, val = self.peek()
            if val in ("*", "/"):
                self.take()
                r = self.unary()
                v = v * r if val == "*" else v / r
            elif kind in ("num", "name") or (kind == "cmd") or val in ("(", "{"):
                v = v * self.power()  # implicit multiplication: 2\pi, 3\sqrt{5}, (a+5)(b+2)
            else:
                return v

    def unary(self):
        self._enter()
        try:
            return self._unary()
        finally:
            self.depth -= 1

    def _unary(self):
        if self.peek()[1] == "-":
            self.take()
            return -self.unary()
        if self.peek()[1] == "+":
            self.take()
            return self.unary()
        return self.power()

    def power(self):
        base = self.atom()
        if self.peek()[1] == "^":
            self.take()
            exp = self.unary_atom()
            if exp.is_number and abs(complex(sympy.N(exp))) > _MAX_EXPONENT:
                raise _ParseError(f"exponent {exp} too large to evaluate")
            return base ** exp
        return base

    def unary_atom(self):
        if self.peek()[1] == "-":
            self.take()
            return -self.atom()
        return self.atom()

    def group(self):
        """A {...} argument or a single token (LaTeX lets \\frac43 mean 4/3)."""
        kind, val = self.peek()
        if val == "{":
            self.take()
            v = self.expr()
            self.take("}")
            return v
        if kind == "num" and len(val) > 1 and val[0].isdigit():
            # LaTeX reads one character per brace-less argument: \frac43 = 4/3, \frac 59 = 5/9
            self.t[self.i] = ("num", val[1:])
            return sympy.Integer(val[0])
        return self.atom()

    def atom(self):
        self._enter()
        try:
            return self._atom()
        finally:
            self.depth -= 1

    def _atom(self):
        kind, val = self.take()
        if kind == "num":
            return _num(val)
        if kind == "name":
            return sympy.I if val == "i" else sympy.Symbol(val)
        if val in ("(", "{"):
            v = self.expr()
            self.take(")" if val == "(" else "}")
            return v
        if kind == "cmd":
            if val == "frac":
                num = self.group()
                den = self.group()
                return num / den
            if val == "pi":
                return sympy.pi
            if val == "infty":
                return sympy.oo
            if val == "sqrt":
                if self.peek()[1] == "[":
                    self.take()
                    n = self.expr()
                    self.take("]")
                    return sympy.root(self.group(), n)
                return sympy.sqrt(self.group())
            if val in _FUNCS:
                return _FUNCS[val](self.power())
        raise _ParseError(f"unsupported token {val!r}")


def _num(val: str):
    return sympy.Rational(val) if "." in val else sympy.Integer(val)


def parse_expr(s: str):
    """Parse one LaTeX-ish scalar expression (or equation a=b -> ('eq', a - b)) into sympy."""
    if "=" in s:
        left, _, right = s.partition("=")
        if "=" in right:
            raise _ParseError("more than one '='")
        return ("eq", _parse_scalar(left) - _parse_scalar(right))
    return _parse_scalar(s)


def _parse_scalar(s: str):
    p = _Parser(_tokenize(s))
    v = p.expr()
    if p.i != len(p.t):
        raise _ParseError(f"trailing input at token {p.t[p.i][1]!r}")
    return v


# ---------------------------------------------------------------- structures
def _split_top(s: str, sep: str) -> list[str]:
    parts, depth, cur, i = [], 0, "", 0
    while i < len(s):
        if s.startswith(sep, i) and depth == 0:
            parts.append(cur)
            cur, i = "", i + len(sep)
            continue
        ch = s[i]
        depth += ch in "([{"
        depth -= ch in ")]}"
        cur += ch
        i += 1
    parts.append(cur)
    return parts


def structure(c: str):
    """Turn a canonical string into a comparable structure of sympy values (or raise
    _ParseError)."""
    m = re.fullmatch(r"\\begin\{[pbv]?matrix\}(.*)\\end\{[pbv]?matrix\}", c)
    if m:
        rows = [r for r in m.group(1).split("\\\\") if r]
        return ("matrix", tuple(tuple(parse_expr(x) for x in r.split("&")) for r in rows))
    if r"\cup" in c:
        return ("union", tuple(structure(p) for p in c.split(r"\cup")))
    if c.startswith(r"\{") and c.endswith(r"\}"):
        return ("set", _items(c[2:-2]))
    if len(c) >= 2 and c[0] in "([" and c[-1] in ")]" and len(_split_top(c[1:-1], ",")) > 1:
        return ("tuple", c[0] + c[-1], tuple(parse_expr(x) for x in _split_top(c[1:-1], ",")))
    if len(_split_top(c, ",")) > 1 or r"\pm" in c:
        return ("set", _items(c))
    return ("value", parse_expr(c))


def _items(s: str) -> tuple:
    out = []
    for part in _split_top(s, ","):
        if r"\pm" in part:  # a \pm b -> {a + b, a - b}
            a, _, b = part.partition(r"\pm")
            out += [parse_expr(a + "+(" + b + ")"), parse_expr(a + "-(" + b + ")")] if a else \
                [parse_expr(b), parse_expr("-(" + b + ")")]
        else:
            out.append(parse_expr(part))
    return tuple(out)


def values_equal(a, b) -> bool:
    if isinstance(a, tuple) or isinstance(b, tuple):
        if not (isinstance(a, tuple) and isinstance(b, tuple)) or a[0] != b[0]:
            return False
        return values_equal(a[1], b[1])
    if a == b:  # structural equality (also covers oo == oo, where a - b is nan)
        return True
    if a.has(sympy.oo, -sympy.oo, sympy.zoo) or b.has(sympy.oo, -sympy.oo, sympy.zoo):
        return False
    d = sympy.expand(a - b)
    if d == 0:
        return True
    if d.free_symbols:
        return sympy.simplify(d) == 0
    dv = complex(sympy.N(d, 30))
    scale = max(1.0, abs(complex(sympy.N(b, 30))))
    return abs(dv) <= 1e-9 * scale


def structures_equal(a, b) -> bool:
    if a[0] != b[0]:
        return False
    kind = a[0]
    if kind == "value":
        return values_equal(a[1], b[1])
    if kind == "tuple":
        return a[1] == b[1] and len(a[2]) == len(b[2]) and all(
            values_equal(x, y) for x, y in zip(a[2], b[2]))
    if kind == "set":
        return _same_multiset(a[1], b[1], values_equal)
    if kind == "union":  # (3,5] \cup (-\infty,1) is (-\infty,1) \cup (3,5]
        return _same_multiset(a[1], b[1], structures_equal)
    if kind == "matrix":
        return len(a[1]) == len(b[1]) and all(
            len(r) == len(s) and all(values_equal(x, y) for x, y in zip(r, s))
            for r, s in zip(a[1], b[1]))
    return False


def _same_multiset(xs, ys, equal) -> bool:
    """Unordered comparison; greedy matching is exact because equality is transitive."""
    rest = list(ys)
    for x in xs:
        j = next((k for k, y in enumerate(rest) if equal(x, y)), None)
        if j is None:
            return False
        rest.pop(j)
    return not rest


def _bracket_depth(s: str) -> int:
    depth = deepest = 0
    for ch in s:
        if ch in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in ")]}":
            depth -= 1
    return deepest


def _qualified(s: str) -> bool:
    """True for a hedged or approximate value: a word of _QUALIFIERS ("5 \\text{ hundred}", "5 or
    more", "about 5") or a relation (\\approx, \\le, <, ...) - math-verify would read 5 in them."""
    if re.search(r"\\(?:approx|sim|simeq|le|leq|ge|geq|lt|gt|ne|neq)(?![A-Za-z])|[<>]", s):
        return True
    return any(w.lower() in _QUALIFIERS for w in _BARE_WORD_RE.findall(s))


def comparable_pair(pred, gold) -> tuple[str, str] | None:
    """(pred, gold) without decorations and with labels accounted for (`align_labels`), or None
    when they cannot match. Both backends compare what this returns. A choice letter before a
    value ("\\textbf{(C)}\\ 12") leaves the letter when the gold is a letter, else the value."""
    p, g = strip_decorations(_answer_text(pred)), strip_decorations(_answer_text(gold))
    if _bracket_depth(p) > _MAX_NESTING // 2:
        return None  # the parser's depth cap, for both backends (math-verify spends seconds there)
    if _qualified(p) and not _qualified(g):
        return None  # "5 \\text{ hundred}", "\\approx 5": math-verify would read 5
    m = _CHOICE_RE.match(p)
    if m and p[m.end():].strip():
        p = m.group(1) if re.fullmatch(r"[a-e]", canonical(g)) else strip_decorations(p[m.end():])
    return align_labels(p, g)


def answers_equal(pred, gold) -> bool:
    """True when `pred` and `gold` are the same answer by the rules in the module docstring."""
    pair = comparable_pair(pred, gold)
    if pair is None:
        return False
    cp, cg = canonical(pair[0]), canonical(pair[1])
    if not cp or not cg:
        return False
    if cp == cg:
        return True
    qp, qg = as_rational(cp), as_rational(cg)
    if qp is not None and qg is not None:
        return qp == qg
    try:
        return structures_equal(structure(cp), structure(cg))
    except (_ParseError, TypeError, ZeroDivisionError, ValueError, RecursionError):
        return False  # RecursionError: sympy itself on a pathological value; the parser caps depth
