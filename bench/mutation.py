"""Mutation testing of the search package: mutmut's score, then every seed-000 pitfall as a hand-written mutant.

    python bench/mutation.py            # mutmut run + pitfalls (the `make mutation` target)
    python bench/mutation.py --pitfalls # only the pitfall mutants (about a minute)
    python bench/mutation.py --pitfalls --only=-inf,ties   # the pitfalls whose name holds one of the texts

Prints ``mutation-score: 0.87 (killed/total)`` and one line per pitfall; exits non-zero if the score is below
0.90 or a pitfall mutant survives.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ENGINE, POLICIES, RANKING = (
    "src/beamkit/search/engine.py",
    "src/beamkit/search/policies.py",
    "src/beamkit/search/ranking.py",
)
KERNELS = "src/beamkit/search/kernels.py"
EXPAND, VIEW, ENTRIES = (
    "src/beamkit/search/expand.py",
    "src/beamkit/search/view.py",
    "src/beamkit/search/entries.py",
)
DECODE, STATE = "src/beamkit/decode.py", "src/beamkit/state.py"

# the narrow policy's ranking cut, and the two sorts of the ranking (all candidates finite, or some not)
NARROW_RANKED = 'its candidates further down)."""\n        return book.beam'  # Narrow's and Compete's (_FirstBeam)
TIES_ALL = "order = np.lexsort((-key, req) if ordered else (tok, row, -key, req))"
TIES_ALL_MUTANT = "order = np.lexsort((-row, -key, req) if ordered else (-tok, -row, -key, req))"
TIES_SOME = "order = idx[np.lexsort((k, r) if ordered else (tok[idx], row[idx], k, r))]"
TIES_SOME_MUTANT = "order = idx[np.lexsort((-row[idx], k, r) if ordered else (-tok[idx], -row[idx], k, r))]"
HEAD_TIES = "(row[i] < row[w] or (row[i] == row[w] and tok[i] < tok[w]))"
HEAD_TIES_MUTANT = "(row[i] > row[w] or (row[i] == row[w] and tok[i] > tok[w]))"

# (name, [(file, original text, mutated text), ...], the test that must kill it): a pitfall the engine guards
# against in more than one place (a check and a cut that both keep it out) is mutated in each of them at once
PITFALLS: list[tuple[str, list[tuple[str, str, str]], str]] = [
    (
        "1 best K tokens of each hypothesis",
        [
            (POLICIES, "return rank < (beam - finished)[req]", "return rank >= 0"),
            (
                POLICIES,
                NARROW_RANKED,
                NARROW_RANKED + " * book.beam",
            ),
        ],
        "test_beam_never_holds_more_than_beam_size",
    ),
    (
        "2 raw logits instead of log-probs",
        [
            (EXPAND, "copy=True), np.where(ok, -lse, -np.inf)", "copy=True), 0 * lse"),
            (EXPAND, "offset = np.where(np.isfinite(lse), -lse, -np.inf)", "offset = 0 * lse"),
        ],
        "test_logits_need_not_be_normalized",
    ),
    (
        "3 eos hypothesis keeps going",
        [
            (VIEW, "self.is_eos(cand.tok, cand.req), length, last", "cand.tok == -7, length, last"),
        ],
        "test_eos_finishes_and_shrinks_the_beam",
    ),
    (
        "4 live hypotheses dropped at max_len",
        [
            (POLICIES, "new.append(scoring.entries(view, surv[cut], False))", "pass"),
        ],
        "test_max_len_returns_unfinished",
    ),
    (
        "5 -inf candidates kept",
        [
            (RANKING, "finite = np.isfinite(key) & valid", "finite = ~np.isnan(key)"),
            (KERNELS, "or not valid[i] or not (a > -np.inf and a < np.inf):", "or a != a:"),
        ],
        "test_masked_tokens_are_never_chosen",
    ),
    (
        "6 state not gathered by parent",
        [
            (ENGINE, "            state = select_state(state, parents)\n", "            state = state\n"),
        ],
        "test_state_follows_parents_in_a_real_search",
    ),
    (
        "eos left out of the length",
        [
            (ENTRIES, "self.scores(rows, cand, sel, view.length)", "self.scores(rows, cand, sel, view.length - 1)"),
        ],
        "test_hand_example_length_penalty",
    ),
    (
        "ranked by logprob, not score",
        [
            (ENTRIES, 'np.argsort(-pool.score, kind="stable")', 'np.argsort(-pool.lp, kind="stable")'),
        ],
        "test_length_penalty_changes_the_winner",
    ),
    (
        "ties to the highest index",
        [
            (
                RANKING,
                TIES_ALL,
                TIES_ALL_MUTANT,
            ),
            (
                RANKING,
                TIES_SOME,
                TIES_SOME_MUTANT,
            ),
            (KERNELS, HEAD_TIES, HEAD_TIES_MUTANT),  # the compiled head scan (both of its comparisons)
        ],
        "test_ties_go_to_the_lowest_id",
    ),
    (
        "survivors finalized one step early",
        [
            (VIEW, "last = length >= b.max_len[cand.req]", "last = length + 1 >= b.max_len[cand.req]"),
        ],
        "test_max_len_returns_unfinished",
    ),
    (
        "NamedTuple rebuilt as a tuple",
        [
            (STATE, "return type(state)(*items)", "return tuple(items)"),
        ],
        "test_select_state_keeps_the_structure",
    ),
    (
        "lists not searched",
        [
            (STATE, "return [_map_leaves(s, fn) for s in state]", "return state"),
        ],
        "test_select_state_keeps_the_structure",
    ),
    (
        "greedy scored with length penalty 1",
        [
            (DECODE, "length_penalty=0.0, **options)[0]", "length_penalty=1.0, **options)[0]"),
        ],
        "test_hand_example_greedy_commits_to_a",
    ),
    (
        "model called after every hypothesis finished",
        [
            (POLICIES, "surv = np.flatnonzero(take & ~ends)", "surv = np.flatnonzero(take)"),
        ],
        "test_search_stops_when_the_last_hypothesis_finishes",
    ),
]


def run_pitfalls(only: list[str] | None = None) -> bool:
    """Apply each pitfall to a copy of the source and check that its test fails (``only``: the pitfalls whose
    name holds one of these texts)."""
    ok = True
    for name, edits, test in PITFALLS:
        if only and not any(part in name for part in only):
            continue
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copytree(ROOT / "src", Path(tmp) / "src")
            missing = [path for path, old, _ in edits if old not in (Path(tmp) / path).read_text()]
            if missing:
                print(f"pitfall[{name}]: ERROR mutant text not found in {', '.join(missing)}")
                ok = False
                continue
            for path, old, new in edits:
                target = Path(tmp) / path
                target.write_text(target.read_text().replace(old, new))
            env = dict(os.environ, PYTHONPATH=str(Path(tmp) / "src"))
            cmd = [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-x",
                "-p",
                "no:cacheprovider",
                f"tests/test_contract.py::{test}",
            ]
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
            killed = proc.returncode == 1
            ok &= killed
            print(f"pitfall[{name}]: {'killed' if killed else 'SURVIVED'} by {test}")
    return ok


def run_mutmut() -> float:
    """Run mutmut over the search package and return killed / total."""
    shutil.rmtree(ROOT / "mutants", ignore_errors=True)
    mutmut = str(Path(sys.executable).parent / "mutmut")
    subprocess.run([mutmut, "run", "--max-children", str(os.cpu_count() or 2)], cwd=ROOT, capture_output=True)
    out = subprocess.run([mutmut, "results", "--all", "true"], cwd=ROOT, capture_output=True, text=True).stdout
    statuses = re.findall(r":\s*(killed|survived|timeout|no tests|suspicious|skipped|segfault)\s*$", out, re.M)
    total = len(statuses)
    killed = sum(s in ("killed", "timeout", "segfault") for s in statuses)
    score = killed / total if total else 0.0
    print(f"mutation-score: {score:.3f} ({killed}/{total}; timeouts count as killed)")
    return score


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pitfalls", action="store_true", help="only the pitfall mutants")
    ap.add_argument("--only", default="", help="comma-separated texts: only the pitfalls whose name holds one")
    args = ap.parse_args()
    score = 1.0 if args.pitfalls else run_mutmut()
    ok = run_pitfalls([part for part in args.only.split(",") if part] or None)
    return 0 if ok and score >= 0.90 else 1


if __name__ == "__main__":
    sys.exit(main())
