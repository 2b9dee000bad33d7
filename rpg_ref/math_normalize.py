"""Fallback answer normalizer: decides whether two final answers are the same math value.

Used by rpg_ref.math_reward when math-verify is not installed (or when asked for explicitly).
It never calls eval/exec/sympify on model text: LaTeX-ish strings go through a small tokenizer
and a hand-written recursive-descent parser that only builds sympy numbers, symbols and
+ - * / ^, sqrt, pi, i, and a few named functions. Anything else is "not parseable" and
falls back to comparing canonical strings.

What counts as equal (`answers_equal(pred, gold)`):
  1. canonical strings are equal (see `canonical`): whitespace, `$`, \\left/\\right, spacing
     commands, \\dfrac/\\tfrac, degree signs, `\\%`, `\\$`, trailing unit words in \\text{}/\\mbox{},
     a leading "x =" / "x \\in", thousands separators ("10,\\!080"), leading zeros ("025"),
     trailing ".0" are removed; a lone \\text{...} answer compares case-insensitively;
  2. both sides parse as exact rationals (integers, decimals, a/b, \\frac, mixed numbers
     "1\\frac{4}{5}") and the rationals are equal;
  3. both sides parse (parser below) into the same structure - a number/expression, an ordered
     tuple or interval (bracket types must agree), an unordered list ("1, -2", "\\{..\\}", "a \\pm b"),
     a union of intervals, a matrix, or an equation - and every element pair is equal:
     numbers with no free symbols must agree to a relative 1e-9 after exact simplification
     (so 0.333 is NOT 1/3), expressions with symbols must have `expand(a - b) == 0`,
     equations compare lhs - rhs.
Time: sympy can be slow on adversarial input (e.g. 9^9^9^9); callers must run this under a
time limit (rpg_ref.math_reward.AnswerChecker does, in a worker process).
"""
from __future__ import annotations

import math
import re
from fractions import Fraction

import sympy

_SPACING = [r"\left", r"\right", r"\!", r"\,", r"\;", r"\:", r"\ ", "~", r"\displaystyle",
            r"\big", r"\Big"]
_UNIT_RE = re.compile(r"^(?P<val>.*?\S)\s*\\(?:text|mbox|textrm|mathrm)\{\s*[A-Za-z][A-Za-z\s.]*\}"
                      r"(?:\^\{?[23]\}?)?$")
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


def canonical(ans) -> str:
    """A canonical string for an answer (str, int or float; floats like 27.0 become "27")."""
    if isinstance(ans, bool):
        raise ValueError(f"answer must be str/int/float, got bool {ans!r}")
    if isinstance(ans, float):
        if not math.isfinite(ans):
            raise ValueError(f"answer is not finite: {ans!r}")
        ans = str(int(ans)) if ans.is_integer() else repr(ans)
    s = _unwrap_boxed(_strip_dollars(str(ans)))
    s = s.replace("\\\\", "\x00")  # protect matrix row breaks from the "\ " spacing rule
    for tok in _SPACING:
        s = s.replace(tok, " ")
    s = s.replace("\x00", "\\\\")
    s = s.replace(r"\dfrac", r"\frac").replace(r"\tfrac", r"\frac")
    for deg in (r"^\circ", r"^{\circ}", "°", r"\circ", r"\%", "%", r"\$"):
        s = s.replace(deg, "")
    s = s.strip().rstrip(".").strip()
    m = _UNIT_RE.match(s)
    if m:  # "864 \mbox{ inches}^2" -> "864"; a bare "\text{east}" is kept (handled below)
        s = m.group("val").strip()
    m = _TEXT_ONLY_RE.match(s)
    if m:  # a word answer: "\text{Evelyn}", "\text{(C)}" -> "evelyn", "c"
        t = m.group("t").strip().lower()
        return t[1:-1] if re.fullmatch(r"\([a-z]\)", t) else t
    s = _drop_spaces(s)
    s = re.sub(r"^[A-Za-z]=(?=.)", "", s)  # "x=5" -> "5"; "5x-7y+11z+4=0" is left alone
    s = re.sub(r"^[A-Za-z]\\in(?=.)", "", s)
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
    unary := ('-'|'+') unary | power; power := atom ('^' unary)?"""

    def __init__(self, tokens):
        self.t, self.i = tokens, 0

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
    """Turn a canonical string into a comparable structure of sympy values (or raise _ParseError)."""
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
    if kind == "set":  # unordered: greedy matching is exact here because equality is transitive
        rest = list(b[1])
        for x in a[1]:
            j = next((k for k, y in enumerate(rest) if values_equal(x, y)), None)
            if j is None:
                return False
            rest.pop(j)
        return not rest
    if kind == "union":
        return len(a[1]) == len(b[1]) and all(structures_equal(x, y) for x, y in zip(a[1], b[1]))
    if kind == "matrix":
        return len(a[1]) == len(b[1]) and all(
            len(r) == len(s) and all(values_equal(x, y) for x, y in zip(r, s))
            for r, s in zip(a[1], b[1]))
    return False


def answers_equal(pred, gold) -> bool:
    """True when `pred` and `gold` are the same answer by the rules in the module docstring."""
    cp, cg = canonical(pred), canonical(gold)
    if not cp or not cg:
        return False
    if cp == cg:
        return True
    qp, qg = as_rational(cp), as_rational(cg)
    if qp is not None and qg is not None:
        return qp == qg
    try:
        return structures_equal(structure(cp), structure(cg))
    except (_ParseError, TypeError, ZeroDivisionError, ValueError):
        return False
