"""Writes a fifth prompt set for draft-head self-distillation (issue 27, step 16): function tasks
in the code suite's phrasing, made from real functions.

Step 15 showed where the head loses on the suites: the code suite asks "Write a Python function
`name(args)` that returns ...", and step 14's function prompts asked to explain, document or test
existing code instead. Step 13's 450 tasks of the suite's kind came from a hand-written list, now
used. This set takes the tasks from the functions already on the machine: each public top-level
function of the standard library and of the given installed packages (read with `ast`, nothing
imported or run) whose docstring opens with a short sentence in the imperative ("Return the ...",
"Convert ...") becomes "Write a Python function `name(args)` that returns the ...", with step 13's
openings and endings. Its signature keeps the parameter names only (as the suite's do); functions
with more than four parameters, `*args`, or a name used by the code suite or step 13 are left out.

The same check as before drops any prompt equal to or containing an eval-suite, calibration or
benchmark prompt. Reproducible from the seed on the same installed files.

    python benchmarks/tools/make_step16_prompts.py --packages numpy,pandas,sympy,networkx,matplotlib,\
        requests,click,rich,jinja2,dateutil,pygments,packaging,PIL --count 900 --out prompts-step16.jsonl
"""

from __future__ import annotations

import argparse
import ast
import json
import random
import re
import sys
import sysconfig
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_step13_prompts as step13  # noqa: E402
from make_step14_prompts import TEST_FOLDERS, package_folders, parsed_files  # noqa: E402
from make_varied_prompts import write_prompt_set  # noqa: E402

# third-person forms of the imperative verbs docstrings open with, where adding "s" is wrong
IRREGULAR = {"do": "does", "undo": "undoes"}
# the verbs a task may open with: docstrings also open with nouns ("Helper ...", "Path of ...")
VERBS = set("""return create compute convert check get find generate set evaluate test parse read construct add
apply determine write encode split decode move multiply remove extract simplify replace calculate
turn solve iterate clear divide validate normalize combine subtract ensure make detect transform
flatten build reduce compare wrap retrieve execute differentiate sort walk translate update escape expand
render format shift reverse count select factor strip merge filter sum integrate stack rename collect
intersect join insert round verify fill transpose reshape load pick partition repeat tokenize map
identify traverse relabel concatenate append scale sample shuffle pad trim truncate compress decompress
encrypt decrypt hash quote unquote interpolate approximate estimate list group rotate invert negate
print open copy yield""".split())
MAX_PARAMETERS = 4
SUMMARY_CHARACTERS = (20, 110)
# in the standard library's folder: installed packages, and the IDLE, 2to3 and turtle demo sources
SKIPPED_FOLDERS = TEST_FOLDERS | {"site-packages", "idlelib", "lib2to3", "turtledemo"}


def third_person(verb: str) -> str:
    """"Return" -> "returns", "Match" -> "matches", "Apply" -> "applies" (lower case)."""
    verb = verb.lower()
    if verb in IRREGULAR:
        return IRREGULAR[verb]
    if re.search(r"(s|sh|ch|x|z)$", verb):
        return verb + "es"
    if re.search(r"[^aeiou]y$", verb):
        return verb[:-1] + "ies"
    return verb + "s"


def task_clause(docstring: str) -> str | None:
    """The docstring's first sentence as a "that ..." clause, or None when it is not a short
    imperative sentence of plain words (a verb first, no markup, no reference to other text)."""
    first = docstring.strip().split("\n\n")[0].replace("\n", " ")
    sentence = re.split(r"(?<=[a-z0-9)])\.(\s|$)", first)[0].strip()
    low, high = SUMMARY_CHARACTERS
    if not low <= len(sentence) <= high or re.search(r"[`:<>*|\\{}\[\]#@]|e\.g|i\.e|>>>|See |see ", sentence):
        return None
    verb, _, rest = sentence.partition(" ")
    if not verb[:1].isupper() or verb.lower() not in VERBS or not rest:
        return None  # "Returns ...", "Helper ...", "Path of ...": not an instruction
    return f"{third_person(verb)} {rest.rstrip('.')}"


def signature(node: ast.FunctionDef) -> str | None:
    """`name(a, b)`: the parameter names as the suite writes them, or None when the function
    takes `*args`, `**kwargs`, keyword-only parameters or more than four parameters."""
    arguments = node.args
    if arguments.vararg or arguments.kwarg or arguments.kwonlyargs or arguments.posonlyargs:
        return None
    names = [a.arg for a in arguments.args if a.arg not in ("self", "cls")]
    if len(names) > MAX_PARAMETERS:
        return None
    return f"{node.name}({', '.join(names)})"


def function_tasks(folders: list[Path], skipped_names: set[str]) -> dict[str, str]:
    """{signature: clause} for the public top-level functions found (first found wins a name)."""
    found: dict[str, str] = {}
    seen_names = set(skipped_names)
    for _, tree in parsed_files(folders, SKIPPED_FOLDERS):
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or node.name in seen_names:
                continue
            clause = task_clause(ast.get_docstring(node) or "")
            written = signature(node)
            if clause and written:
                seen_names.add(node.name)
                found[written] = clause
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--packages", default="", help="comma-separated installed packages read besides the stdlib")
    parser.add_argument("--count", type=int, default=900, help="functions drawn (one prompt each)")
    parser.add_argument("--seed", type=int, default=2032)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    suite = step13.ROOT / "mars_cli" / "data" / "suites" / "code.jsonl"
    skipped = {json.loads(line)["entry_point"] for line in suite.read_text().splitlines() if line.strip()}
    skipped |= {sig.partition("(")[0] for sig, _, _ in step13.TASKS}
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found = function_tasks([stdlib, *package_folders([n for n in args.packages.split(",") if n])], skipped)
    print(f"{len(found)} functions with an imperative summary found", file=sys.stderr)
    chosen = rng.sample(sorted(found), min(args.count, len(found)))
    rows = [("write", rng.choice(step13.FUNCTION_OPENINGS).format(sig=sig, what=found[sig])
             + rng.choice(step13.FUNCTION_ENDINGS)) for sig in chosen]
    write_prompt_set(rows, rng, args.out, "headG")


if __name__ == "__main__":
    main()
