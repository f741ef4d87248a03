"""Mutation testing of the differential allow-lists (harness/data/differential/allow-*.yaml).

Every shipped entry is widened the standard ways -- its ``match`` with an anchor dropped (^,
$), a character class widened to ``.``, a literal alternative group widened to a class
(``std::(length_error|bad_alloc)`` -> ``std::[a-z_]+``), a word of the line's vocabulary given
its siblings as alternatives (``same-step$`` -> ``(same-step|a-further|b-further)$``), a word
boundary dropped, a required suffix dropped (`` / survived$``), a counted repeat widened to
``+``; its ``cmd`` to ``*``; its ``kind`` to ``*`` -- and each widened list must let pass a
planted divergence that the shipped list rejects (or, for the kind, be refused when loaded).

The planted divergences are built from the entries themselves: each entry's own divergence (a
line it allows, :func:`examples`) with the part the widening touches replaced by probe text,
so that the line lies just outside the entry. A divergence is (kind, command, line), judged by
the differential's own decision (``allow_list.allowing``) over the whole list.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from harness.fuzz.bounds import ACCEPTED_OOB
from harness.fuzz.allow_list import allowing, load_allow
from harness.fuzz.divergence import _further
from harness.fuzz.errors import DifferentialError

# The words a divergence line is made of, by family: a widening that adds a word's siblings
# as alternatives allows the lines that carry a sibling.
VOCABULARY = (
    (_further(1, 1), _further(2, 1), _further(1, 2)),  # same-step, a-further, b-further
    ("stale-base", "stale-handle", "near-handle", "cross-base", "valid"),  # close causes
    ("crash", "hang", "memory", "protocol"),  # what a death was
    ("SIGABRT", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL"),
)
OTHER_COMMANDS = ("GET_ALIGNMENT", "BUFFER_CLEAR", "GET_TENSOR", "GRAPH_COMPUTE", "SET_TENSOR",
                  "ALLOC_BUFFER")
# What replaces the touched part of an entry's own divergence: text outside a class, a word
# outside an alternative group, what a side says when it broke too (a dropped " / survived").
PROBES = ("x ", "x", " x", "_", "Z", "!", " ", "p 7", "zz", "zz_zz", "zz-zz", "00", "",
          " / crash SIGABRT x", " / crash SIGSEGV x", " / hang  x")
# What may stand where a required suffix stood: the other side broke too, the other side
# went further, anything.
SUFFIXES = (" / crash SIGABRT x", " / crash SIGSEGV x", " / hang  x", " a-further",
            " b-further", " x")
_LITERAL_ALTERNATIVE = re.compile(r"[A-Za-z0-9_:-]+")


@dataclass(frozen=True)
class Token:
    kind: str  # anchor | boundary | class | group | repeat
    start: int
    end: int
    text: str


def tokens(pattern: str) -> list[Token]:
    """The parts of a regular expression a widening touches, with their spans."""
    out: list[Token] = []
    stack: list[int] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            esc = pattern[i:i + 2]
            if esc == r"\b":
                out.append(Token("boundary", i, i + 2, esc))
            elif esc[1:] in "dwsSDW":
                i = _class(out, pattern, i, i + 2)
                continue
            i += 2
            continue
        if c == "[":
            j = i + 1
            if j < len(pattern) and pattern[j] == "^":
                j += 1
            if j < len(pattern) and pattern[j] == "]":
                j += 1
            while pattern[j] != "]":
                j += 2 if pattern[j] == "\\" else 1
            i = _class(out, pattern, i, j + 1)
            continue
        if c in "^$":
            out.append(Token("anchor", i, i + 1, c))
        elif c == "(":
            stack.append(i)
        elif c == ")":
            start = stack.pop()
            out.append(Token("group", start, i + 1, pattern[start:i + 1]))
        elif c == "{":
            j = pattern.index("}", i)
            out.append(Token("repeat", i, j + 1, pattern[i:j + 1]))
            i = j + 1
            continue
        i += 1
    return out


def _class(out: list[Token], pattern: str, start: int, end: int) -> int:
    """A class token with the quantifier after it (``[0-9a-f]+``: the whole run is what a
    widening to ``.+`` lets another text into); returns where scanning goes on."""
    m = re.match(r"(?:[*+?]|\{\d+(?:,\d*)?\})\??", pattern[end:])
    stop = end + (m.end() if m else 0)
    out.append(Token("class", start, stop, pattern[start:stop]))
    return stop


@dataclass(frozen=True)
class Widening:
    entry: dict
    what: str  # how it was widened, for the report
    widened: dict  # the entry as widened
    marked: str | None = None  # the match with the widened part as group ``mut`` (None: cmd)
    probes: tuple[str, ...] = PROBES
    insert: bool = False  # the probe goes at the (empty) span rather than replacing it


def _class_of(words: list[str]) -> str:
    chars = set("".join(words))
    parts = [r for r, test in (("a-z", str.islower), ("A-Z", str.isupper), ("0-9", str.isdigit))
             if any(test(ch) for ch in chars)]
    parts += sorted(ch for ch in chars if not ch.isalnum() and ch != "-")
    return "[" + "".join(parts) + ("-" if "-" in chars else "") + "]+"


def _mark(p: str, start: int, end: int) -> str:
    return f"{p[:start]}(?P<mut>{p[start:end]}){p[end:]}"


def match_widenings(entry: dict) -> list[Widening]:
    p = entry["match"]
    out: list[Widening] = []

    def add(what: str, widened: str, marked: str, probes=PROBES, insert=False) -> None:
        re.compile(widened)  # a generator bug, not a finding
        out.append(Widening(entry, what, {**entry, "match": widened}, marked, tuple(probes),
                            insert))

    toks = tokens(p)
    for t in toks:
        cut = p[:t.start] + p[t.end:]
        if t.kind == "anchor":
            add(f"drop the anchor {t.text} at {t.start}", cut, _mark(p, t.start, t.end),
                insert=True)
        elif t.kind == "boundary":
            add(f"drop the word boundary at {t.start}", cut, _mark(p, t.start, t.end),
                insert=True)
        elif t.kind == "class":
            quantifier = re.sub(r"^(\\.|\[(?:\\.|[^\]])*\])", "", t.text)
            add(f"widen the class {t.text} to .{quantifier}",
                p[:t.start] + "." + quantifier + p[t.end:], _mark(p, t.start, t.end))
        elif t.kind == "repeat":
            # the atom before the count, repeated any number of times
            atom = next((a for a in toks if a.end == t.start), None)
            start = atom.start if atom else t.start - 1
            add(f"widen the repeat {t.text} to +", p[:t.start] + "+" + p[t.end:],
                _mark(p, start, t.end))
        elif t.kind == "group":
            inner = t.text[1:-1]
            words = inner.split("|")
            if len(words) > 1 and all(_LITERAL_ALTERNATIVE.fullmatch(w) for w in words):
                add(f"widen the alternatives {t.text} to a class",
                    p[:t.start] + _class_of(words) + p[t.end:],
                    f"{p[:t.start]}(?P<mut>{inner}){p[t.end:]}")
    inside = [(t.start, t.end) for t in toks if t.kind == "class"]
    for family in VOCABULARY:
        for word in family:
            for m in re.finditer(rf"(?<![\w\\-]){re.escape(word)}(?![\w-])", p):
                if any(a <= m.start() < b for a, b in inside):
                    continue
                others = [w for w in family if w != word]
                add(f"add the alternatives {'|'.join(others)} to {word}",
                    f"{p[:m.start()]}({'|'.join([word, *others])}){p[m.end():]}",
                    _mark(p, m.start(), m.end()), probes=others)
    if p.endswith("$") and not p.endswith("\\$"):
        cut = p.rfind(" / ")
        cut = cut if cut >= 0 else p.rfind(" ")
        if cut > 0:
            add(f"drop the required suffix {p[cut:]!r}", p[:cut], _mark(p, cut, len(p)),
                probes=SUFFIXES)
    return out


def widenings(entry: dict) -> list[Widening]:
    """Every standard widening of one entry."""
    out = match_widenings(entry) if entry.get("match") else []
    if entry["cmd"] != "*":
        out.append(Widening(entry, f"widen the command {entry['cmd']} to *",
                            {**entry, "cmd": "*"}))
    out.append(Widening(entry, f"widen the kind {entry['kind']} to *", {**entry, "kind": "*"}))
    return out


# ------------------------------------------------------------------ the entries' own divergences
def examples(entry: dict, deaths: list[str]) -> list[tuple[str, str]]:
    """(command, line) of divergences ``entry`` lets pass: the deaths of the test's planted
    lines, and a close point or an answer of each kind the shipped lists name."""
    cmd = "SET_TENSOR" if entry["cmd"] == "*" else entry["cmd"]
    if entry["kind"] == "death":
        lines = [f"p7 broke: {_death_kind(d)} {_death_signal(d)} {_death_line(d)} / survived"
                 for d in deaths]
    elif entry["kind"] == "close":
        lines = [f"close point: p7 ok, ref-7.0.0 closed <- {causes} {further}"
                 for causes, further in CLOSE_CAUSES]
    else:
        buf = "55aa0000" + "0" * 8 + "00100000" + "0" * 8  # a buffer handle and its size
        lines = [f"p7 {'0' * 32} / ref-7.0.0 {buf}", f"p7 {buf} / ref-7.0.0 {'0' * 32}"]
    return [(cmd, line) for line in lines if re.search(entry["match"], line)]


CLOSE_CAUSES = (
    ("framing:len_huge", "same-step"),
    ("field:buffer stale-base", "a-further"),
    ("field:buffer stale-handle", "a-further"),
    ("field:buffer near-handle", "a-further"),
    ("cross-base field:data", "a-further"),
    ("field:graph_class field:graph_class:tensors_past_bound", "a-further"),
    ("field:scale_class field:scale_class:fanin_65536_leaves", "a-further"),
    ("field:combinatorial field:combinatorial:src.buffer=other_src.data=own:end-nbytes_"
     "src.shape=zero_elements_dst.buffer=other_dst.data=own:end-nbytes_"
     "dst.shape=zero_elements", "a-further"),
)


def _death_kind(d: str) -> str:
    return "hang" if d.startswith("hang:") else ACCEPTED_OOB if d.startswith("oob:") \
        else "crash"


def _death_signal(d: str) -> str:
    return "" if d.startswith(("hang:", "oob:")) else "SIGSEGV" if d.startswith("SIGSEGV") \
        else "SIGABRT"


def _death_line(d: str) -> str:
    return d.removeprefix("hang:").removeprefix("oob:")


# ------------------------------------------------------------------ catching a widening
@dataclass
class Verdict:
    widening: Widening
    caught_by: tuple[str, str, str] | None = None  # (kind, command, line) the widening lets pass
    refused: str | None = None  # why the widened list does not load
    near: list = field(default_factory=list)


def _realistic(line: str) -> str:
    """A death line whose other side broke too is a "both broke" line."""
    other = line.rsplit(" / ", 1)[-1]
    if line.startswith("p7 broke: ") and other.split(" ")[0] in VOCABULARY[2]:
        return "both" + line[len("p7"):]
    return line


def near_lines(w: Widening, cmd: str, line: str) -> list[tuple[str, str]]:
    """(command, line) just outside ``w.entry`` that ``w`` may let pass, from its example."""
    if w.marked is None:  # the command widened: the same line, at other commands
        return [(c, line) for c in OTHER_COMMANDS if c != w.entry["cmd"]]
    m = re.search(w.marked, line)
    if m is None or m.start("mut") < 0:
        return []  # this example does not go through the widened part
    a, b = m.span("mut")
    out = []
    for probe in w.probes:
        near = line[:a] + probe + (line[a:] if w.insert else line[b:])
        out.append((cmd, _realistic(near)))
    return out


def judge(w: Widening, shipped: list[dict], deaths: list[str], tmp: Path) -> Verdict:
    verdict = Verdict(w)
    if w.widened["kind"] == "*":
        # no kind is wider than another in the format: such an entry must not load
        path = tmp / "widened.yaml"
        path.write_text(yaml.safe_dump([{k: v for k, v in w.widened.items()}]))
        try:
            load_allow(path, defaults=False)
        except DifferentialError as e:
            verdict.refused = str(e)
        return verdict
    index = shipped.index(w.entry)
    widened = shipped[:index] + [w.widened] + shipped[index + 1:]
    kind = w.entry["kind"]
    for cmd, line in examples(w.entry, deaths):
        for near_cmd, near in near_lines(w, cmd, line):
            verdict.near.append((near_cmd, near))
            if allowing(shipped, kind, near_cmd, near) is None and \
                    allowing(widened, kind, near_cmd, near) is not None:
                verdict.caught_by = (kind, near_cmd, near)
                return verdict
    return verdict


def own_entries(path: Path) -> list[dict]:
    """The entries a list file ships itself (those it includes are another file's), as
    loaded."""
    loaded = load_allow(path, defaults=False)
    raw = [e for e in yaml.safe_load(path.read_text()) if "include" not in e]
    keys = {(e["cmd"], e.get("kind", "answer"), e.get("match")) for e in raw}
    return [e for e in loaded if (e["cmd"], e["kind"], e.get("match")) in keys]
