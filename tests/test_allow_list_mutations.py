"""Mutation testing of the shipped allow-lists (tests/allow_mutants.py): every standard widening
of every entry -- of its match, its command and its kind -- lets pass a planted divergence the
shipped list rejects, or does not load. Pure Python: no server runs."""

from __future__ import annotations

import re
from collections import Counter

import pytest

from harness.fuzz.allow_list import SHIPPED_ALLOW_DIR
from allow_mutants import (judge, own_entries, tokens, widenings)
from test_allow_lists import DEATHS

SHIPPED = sorted(SHIPPED_ALLOW_DIR.glob("allow-*.yaml"))


def _all(tmp_path):
    """(list, widening, verdict) of every widening of every shipped entry."""
    from harness.fuzz.allow_list import load_allow
    out = []
    for path in SHIPPED:
        shipped = load_allow(path, defaults=False)
        for entry in own_entries(path):
            for w in widenings(entry):
                out.append((path.name, w, judge(w, shipped, DEATHS, tmp_path)))
    return out


def test_every_widening_of_every_shipped_entry_is_caught(tmp_path, record_property):
    results = _all(tmp_path)
    uncaught = [f"{name}: {w.entry['cmd']} {w.entry['kind']} {w.entry.get('match')!r}: "
                f"{w.what} -> {w.widened.get('match', w.widened['cmd'])!r} "
                f"({len(v.near)} near lines tried)"
                for name, w, v in results if v.caught_by is None and v.refused is None]
    by_kind = Counter(re.sub(r" .*", "", w.what.split(" the ", 1)[1]) for _, w, _ in results)
    entries = len({(name, id(w.entry)) for name, w, _ in results})
    # printed at the end of the run, under xdist too (tests/conftest.py)
    record_property("summary", f"allow-list mutations: {len(results)} widenings of {entries} "
                    f"entries in {len(SHIPPED)} lists "
                    f"({', '.join(f'{k} {n}' for k, n in sorted(by_kind.items()))}), "
                    f"{len(results) - len(uncaught)} caught")
    assert not uncaught, "widenings no planted divergence catches:\n" + "\n".join(uncaught)
    assert len(results) >= 100  # the generator generated


def _one(tmp_path, name: str, match_part: str, widened: str):
    results = [(n, w, v) for n, w, v in _all(tmp_path)
               if n == name and match_part in (w.entry.get("match") or "")
               and w.widened.get("match") == widened]
    assert len(results) == 1, f"{widened!r} is not among the widenings"
    return results[0][2]


@pytest.mark.parametrize("match_part, widen", [
    # the issue's three: same-step widened to every side, a death entry without its
    # ' / survived$' (the reference crashed too), the exception names widened to a class
    (r"\bframing:", lambda m: m.replace("same-step$", "(same-step|a-further|b-further)$")),
    ("std::(length_error|bad_alloc)", lambda m: m.replace(" / survived$", "")),
    ("std::(length_error|bad_alloc)", lambda m: m.replace("(length_error|bad_alloc)", "[a-z_]+")),
])
def test_the_widenings_the_issue_found_are_generated_and_caught(tmp_path, match_part, widen):
    from allow_mutants import own_entries as entries
    entry = next(e for e in entries(SHIPPED_ALLOW_DIR / "allow-7.0.0.yaml")
                 if match_part in e["match"])
    verdict = _one(tmp_path, "allow-7.0.0.yaml", match_part, widen(entry["match"]))
    assert verdict.caught_by is not None, verdict.near
    print(f"caught by {verdict.caught_by}")


def test_a_part_of_a_pattern_that_narrows_nothing_is_reported(tmp_path):
    """Planted: a word boundary after \\w+ (always true there) cannot be caught: the test
    goes red on such an entry instead of counting it."""
    from harness.fuzz.allow_list import load_allow
    path = tmp_path / "allow-planted.yaml"
    path.write_text("- cmd: '*'\n  kind: close\n"
                    "  match: 'close point: .* <- .*framing:\\w+\\b.* same-step$'\n")
    shipped = load_allow(path, defaults=False)
    verdicts = [judge(w, shipped, DEATHS, tmp_path) for w in widenings(shipped[0])]
    missed = [v.widening.what for v in verdicts if v.caught_by is None and v.refused is None]
    assert missed == [next(w.what for w in widenings(shipped[0]) if "boundary" in w.what)]


def test_the_tokens_of_a_pattern():
    kinds = [(t.kind, t.text) for t in tokens(r"^a\b[0-9a-f]+ (x|y)\d{3}0{2}\\$")]
    assert kinds == [("anchor", "^"), ("boundary", r"\b"), ("class", "[0-9a-f]+"),
                     ("group", "(x|y)"), ("class", r"\d{3}"), ("repeat", "{2}"),
                     ("anchor", "$")]
