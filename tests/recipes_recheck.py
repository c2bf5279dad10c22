"""Re-check docs/recipes.md's citations against local checkouts of the references: does each row's cited file:line
(at the pinned commit) hold the value the row says the reference uses?

For every table row the script reads each cited `file:line@commit` (git show, so any clone or mirror that has the
commit works, whatever is checked out), then looks in those lines for the row's expected text: the literals of its
"reference" cell (numbers compared as numbers, so 5e-6 matches 5.0e-6; identifiers with `_` and `true`/`false`), or
EXPECT's text for a row whose cell says it in words (docs/data/recipes_expect.yaml, with the tables' short file
names). A row is `ok` (an expected literal is there), `MISS` (none is: the citation drifted or is wrong), `words` (the
cell has no literal and EXPECT no text for it: read it by hand, then add its text to that file's `expect:`), or
`no-ref` (no checkout given for its reference). Exit status 1 when any row is MISS. A check of the docs, not a
benchmark: a tests/ tool (it needs the references' clones, so no test tier runs it whole; tests/test_recipes_recheck.py
runs it against a stand-in repository).

    python tests/recipes_recheck.py --mirror-root /work/.mirror          # <root>/<owner>+<name>/repo clones
    python tests/recipes_recheck.py --ref siiRL=~/src/siiRL --ref RLinf=~/src/RLinf ...
    python tests/recipes_recheck.py --mirror-root /work/.mirror --only MISS   # just the drifted rows
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RECIPES = os.path.join(ROOT, "docs", "recipes.md")

# reference short name -> (GitHub owner/name, pinned commit) as docs/recipes.md's first table names them
REFERENCES: Dict[str, Tuple[str, str]] = {
    "siiRL": ("sii-research/siiRL", "af00a77"),
    "SimpleVLA-RL": ("PRIME-RL/SimpleVLA-RL", "7c51662"),
    "OpenVLA-OFT-RL": ("AbhinandanVellanki/OpenVLA-OFT-RL", "f82c92f"),
    "RLinf": ("RLinf/RLinf", "a3816b5"),
    "FlowIPO": ("jiabingyang01/FlowIPO", "c8a97cd"),
    "LUFFY": ("ElliottYan/LUFFY", "01f4ae0"),
    "openvla-oft": ("moojink/openvla-oft", "213c5ff"),
}
# the hand-read tables, in docs/data/recipes_expect.yaml: SHORT (the tables' short file names -> the path in the
# reference) and EXPECT ((config, key or the key-less row's first cell) -> text the cited lines must hold, for cells
# written in words)
with open(os.path.join(ROOT, "docs", "data", "recipes_expect.yaml"), encoding="utf-8") as _f:
    _TABLES = yaml.safe_load(_f)
SHORT: Dict[Tuple[str, str], str] = {(ref, cited): path for ref, names in _TABLES["short_names"].items()
                                     for cited, path in names.items()}
EXPECT: Dict[Tuple[str, str], str] = {(config, key): text for config, keys in _TABLES["expect"].items()
                                      for key, text in keys.items()}
CITE = re.compile(r"(?:(siiRL|SimpleVLA-RL|OpenVLA-OFT-RL|RLinf|FlowIPO|LUFFY|openvla-oft)\s+)?"
                  r"((?:SVLA script|script|start|quickstart|train\.sh|[\w./-]+\.\w+)):(\d+(?:[-,] ?\d+)*)(?:@(\w+))?")
NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:e[-+]?\d+)?(?![\w.]*[a-df-z])", re.I)
IDENT = re.compile(r"\b[A-Za-z]\w*_\w+\b")


def rows() -> List[Tuple[str, str, str, str]]:
    """(config, key or first cell, reference cell, source cell) of every table row under a `configs/...` heading."""
    out, current = [], None
    with open(RECIPES, encoding="utf-8") as f:
        for line in f:
            heading = re.match(r"#{2,3} .*?`configs/([\w.]+\.yaml)`", line)
            if heading and line.count("`configs/") == 1:
                current = heading.group(1)
                continue
            if line.startswith("#"):
                current = None
            if current is None or not line.startswith("| ") or line.startswith(("| key ", "|---", "| |")):
                continue
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == 5:
                out.append((current, cells[0].strip("`"), cells[2], cells[3]))
    return out


def citations(source: str) -> List[Tuple[str, str, List[int], str]]:
    """(reference, path as cited, lines, commit) of a source cell; a citation without a reference name takes the
    previous one's (`siiRL script:50-52@af00a77; siirl/engine/fsdp_workers.py:212@af00a77`)."""
    out, ref = [], None
    for m in CITE.finditer(source):
        ref = m.group(1) or ref
        if ref is None:
            continue
        lines: List[int] = []
        for part in m.group(3).replace(" ", "").split(","):
            a, _, b = part.partition("-")
            lines += list(range(int(a), int(b or a) + 1))
        out.append((ref, m.group(2), lines, m.group(4) or REFERENCES[ref][1]))
    return out


class Checkout:
    """A reference's git repository (any clone or mirror holding the pinned commit): files read with git show."""

    def __init__(self, path: str):
        self.path = path
        self._trees: Dict[str, List[str]] = {}

    def git(self, *args: str) -> Optional[str]:
        out = subprocess.run(["git", "-C", self.path, *args], capture_output=True, text=True, errors="replace")
        return out.stdout if out.returncode == 0 else None

    def resolve(self, ref: str, cited: str, commit: str) -> Optional[str]:
        """The path a cited name stands for at `commit`: a table short name, the path itself, or the one file whose
        path ends with it."""
        if (ref, cited) in SHORT:
            return SHORT[ref, cited]
        if commit not in self._trees:
            self._trees[commit] = (self.git("ls-tree", "-r", "--name-only", commit) or "").splitlines()
        tree = self._trees[commit]
        if cited in tree:
            return cited
        ends = [p for p in tree if p.endswith("/" + cited)]
        if not ends and "/" not in cited:  # a bare file name cited after its folder (mix_fsdp_worker.py)
            ends = [p for p in tree if os.path.basename(p) == cited]
        return ends[0] if len(ends) == 1 else None

    def lines(self, path: str, commit: str, numbers: List[int]) -> Optional[str]:
        text = self.git("show", f"{commit}:{path}")
        if text is None:
            return None
        all_lines = text.splitlines()
        return "\n".join(all_lines[n - 1] for n in numbers if 0 < n <= len(all_lines))


def literals(cell: str) -> Tuple[List[float], List[str]]:
    """The numbers and identifiers a reference cell names (what its cited line should hold)."""
    words = re.sub(r"`", "", cell)
    numbers = []
    for m in NUMBER.finditer(words):
        try:
            numbers.append(float(m.group(0)))
        except ValueError:
            pass
    idents = IDENT.findall(words) + [w for w in ("True", "False", "true", "false") if re.search(rf"\b{w}\b", words)]
    return numbers, idents


def holds(text: str, numbers: List[float], idents: List[str], expect: Optional[str]) -> bool:
    if expect is not None:
        return expect in text
    found = set()
    for m in NUMBER.finditer(text):
        try:
            found.add(float(m.group(0)))
        except ValueError:
            pass
    return any(n in found for n in numbers) or any(i.lower() in text.lower() for i in idents)


def check(checkouts: Dict[str, Checkout]) -> List[Tuple[str, str, str, str]]:
    """(status, config, key, detail) of every row."""
    out = []
    for config, key, reference, source in rows():
        cites = citations(source)
        if not cites:
            out.append(("words", config, key, f"no reference file:line in {source!r}"))
            continue
        texts, missing = [], []
        for ref, cited, numbers, commit in cites:
            if ref not in checkouts:
                missing.append(ref)
                continue
            path = checkouts[ref].resolve(ref, cited, commit)
            text = checkouts[ref].lines(path, commit, numbers) if path else None
            if text is None:
                texts.append(("", f"{ref} {cited}@{commit}: not found"))
            else:
                texts.append((text, f"{ref} {path}:{numbers[0]}-{numbers[-1]}@{commit}"))
        if missing and not texts:
            out.append(("no-ref", config, key, ", ".join(sorted(set(missing)))))
            continue
        numbers, idents = literals(reference)
        expect = EXPECT.get((config, key))
        if expect is None and not numbers and not idents:
            out.append(("words", config, key, "; ".join(w for _, w in texts)))
            continue
        ok = any(holds(t, numbers, idents, expect) for t, _ in texts)
        detail = "; ".join(w for _, w in texts) + ("" if ok else f" | wanted {expect or (numbers + idents)}")
        out.append(("ok" if ok else "MISS", config, key, detail))
    return out


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mirror-root", default=None, help="a folder of <owner>+<name>/repo (or <name>) git checkouts")
    p.add_argument("--ref", action="append", default=[], help="NAME=PATH: a reference's checkout (NAME as the "
                   f"tables spell it: {', '.join(REFERENCES)})")
    p.add_argument("--only", default=None, help="print only rows of this status (ok, MISS, words, no-ref)")
    args = p.parse_args(argv)
    checkouts: Dict[str, Checkout] = {}
    for name, (repo, _) in REFERENCES.items():
        if args.mirror_root:
            for folder in (repo.replace("/", "+") + "/repo", repo.replace("/", "+"), repo.split("/")[1]):
                path = os.path.join(os.path.expanduser(args.mirror_root), folder)
                if os.path.isdir(path):
                    checkouts[name] = Checkout(path)
                    break
    for item in args.ref:
        name, _, path = item.partition("=")
        if name not in REFERENCES:
            raise SystemExit(f"error: --ref {item}: unknown reference {name!r}; use one of {', '.join(REFERENCES)}")
        checkouts[name] = Checkout(os.path.expanduser(path))
    if not checkouts:
        raise SystemExit("error: give --mirror-root or --ref NAME=PATH (the references' git checkouts)")
    results = check(checkouts)
    counts: Dict[str, int] = {}
    for status, config, key, detail in results:
        counts[status] = counts.get(status, 0) + 1
        if args.only in (None, status):
            print(f"{status:6} {config:28} {key:40} {detail}")
    print("rows: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) + f" (of {len(results)})")
    return 1 if counts.get("MISS") else 0


if __name__ == "__main__":
    sys.exit(main())
