"""Writes a fourth prompt set for draft-head self-distillation (issue 27, step 14).

Steps 12 and 13 brought new kinds of prompt from hand-written lists, which are now nearly used
up. This set draws on real text already on the machine, so it grows without new lists:

- `passage`: a paragraph of prose from Python's own documentation (the language reference in
  `pydoc_data.topics` and standard-library docstrings) with a task on it: summarise it, explain
  it to a beginner, list its points, rewrite it, ask about it. A long user turn then comes
  before the answer, as in the multi-turn suite's second turns.
- `source`: a short pure-Python standard-library function with a task on it: explain it, add a
  docstring, write example calls, suggest tests, simplify it.
- `restyled`: step 13's everyday requests and writing tasks in the wordings step 13 did not use
  (every template for every filler, less the step-13 rows rebuilt from its seed).

The same check as before drops any prompt equal to or containing an eval-suite, calibration or
benchmark prompt. Reproducible from the seed on the same Python version (its docs are the text).

    python benchmarks/tools/make_step14_prompts.py --out prompts-step14.jsonl
    python benchmarks/tools/make_step14_prompts.py --packages numpy,pandas,networkx,sympy,matplotlib,requests,\
        click,rich,jinja2,dateutil,hypothesis,pygments,datasets,huggingface_hub,yaml,packaging,PIL \
        --restyled 0 --passage 500 --source 400 --seed 2031 --out prompts-step14b.jsonl

With `--packages` the passages and functions come from those installed packages' files, parsed
with `ast` (nothing imported), test folders left out.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import random
import re
import sys
import textwrap
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_step13_prompts as step13  # noqa: E402
from make_varied_prompts import write_prompt_set  # noqa: E402

PASSAGE_TEMPLATES = [
    "Summarise the following passage in two or three sentences.\n\n{x}",
    "Explain the following to someone who is new to programming, in simple words.\n\n{x}",
    "List the key points of this text as short bullet points.\n\n{x}",
    "Read this passage and write three questions a student could answer from it.\n\n{x}",
    "Rewrite the following paragraph so that it is easier to read.\n\n{x}",
    "What is the main idea of this passage? Answer in one paragraph.\n\n{x}",
    "{x}\n\nGive this passage a short title and explain why it fits.",
    "Here is a paragraph from some documentation:\n\n{x}\n\nWhat does it mean in practice? Give an example.",
]
SOURCE_TEMPLATES = [
    "Explain what this Python function does, step by step.\n\n```python\n{x}\n```",
    "Add a docstring to this function and explain each part of it.\n\n```python\n{x}\n```",
    "```python\n{x}\n```\n\nWrite two or three example calls of this function and say what each returns.",
    "Suggest a few unit tests for this function.\n\n```python\n{x}\n```",
    "Can this function be written more simply? Show a version and explain the change.\n\n```python\n{x}\n```",
    "What does this code do? Describe its inputs and outputs.\n\n```python\n{x}\n```",
]
# modules whose import opens a browser, prints, starts a GUI or is slow or platform-bound
SKIPPED_MODULES = {"antigravity", "this", "idlelib", "tkinter", "turtle", "turtledemo", "webbrowser", "pydoc",
                   "lib2to3", "ensurepip", "venv", "msilib", "winreg", "winsound", "_winapi", "msvcrt", "nturl2path"}


def _stdlib_modules() -> list:
    """The importable public standard-library modules, in name order."""
    modules = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in sorted(sys.stdlib_module_names):
            if name.startswith("_") or name in SKIPPED_MODULES:
                continue
            try:
                modules.append(importlib.import_module(name))
            except Exception:  # noqa: BLE001 - a module this platform lacks
                continue
    return modules


def _is_prose(paragraph: str) -> bool:
    """Plain sentences of a readable length: no grammar rules, doctests, tables or lists."""
    letters = sum(c.isalpha() or c.isspace() for c in paragraph)
    return (250 <= len(paragraph) <= 900 and letters / len(paragraph) > 0.8 and paragraph[0].isupper()
            and paragraph.rstrip()[-1] in ".:" and not any(m in paragraph for m in (">>>", "::=", "|", "* ", "+--")))


def passages(modules: list) -> list[str]:
    """Prose paragraphs of the language reference and of module, class and function docstrings."""
    import pydoc_data.topics

    texts = [pydoc_data.topics.topics[key] for key in sorted(pydoc_data.topics.topics)]
    for module in modules:
        texts.append(inspect.getdoc(module) or "")
        for name, member in sorted(vars(module).items()):
            if not name.startswith("_") and (inspect.isclass(member) or inspect.isfunction(member)) \
                    and getattr(member, "__module__", None) == module.__name__:
                texts.append(inspect.getdoc(member) or "")
    return _paragraphs(texts)


def _paragraphs(texts: list[str]) -> list[str]:
    """The prose paragraphs of `texts`, whitespace collapsed, each once, in order."""
    found, seen = [], set()
    for text in texts:
        for paragraph in re.split(r"\n\s*\n", text):
            paragraph = " ".join(paragraph.split())
            if paragraph and paragraph not in seen and _is_prose(paragraph):
                seen.add(paragraph)
                found.append(paragraph)
    return found


def _is_short_function(code: str) -> bool:
    """A plain function (no decorator) of 6 to 30 lines: short enough to ask about as a whole."""
    return 6 <= code.count("\n") + 1 <= 30 and len(code) <= 1200 and code.startswith("def ")


def sources(modules: list) -> list[str]:
    """Public top-level pure-Python functions of 6 to 30 lines, dedented."""
    found = []
    for module in modules:
        for name, member in sorted(vars(module).items()):
            if name.startswith("_") or not inspect.isfunction(member) or member.__module__ != module.__name__:
                continue
            try:
                code = textwrap.dedent(inspect.getsource(member)).strip()
            except (OSError, TypeError):
                continue
            if _is_short_function(code):
                found.append(code)
    return found


def _plain_rst(paragraph: str) -> str:
    """Sphinx roles and literals as plain text: ":func:`~a.b`" -> "a.b", "``x``" -> "x"."""
    return re.sub(r"``([^`]+)``", r"\1", re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", paragraph))


TEST_FOLDERS = frozenset({"tests", "test", "testing"})


def package_folders(names: list[str]) -> list[Path]:
    """The folders of the named installed packages (found, never imported)."""
    import importlib.util

    folders = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit(f"error: {name} is not an installed package")
        folders.extend(Path(folder) for folder in spec.submodule_search_locations)
    return folders


def parsed_files(folders: list[Path], skipped: frozenset[str] = TEST_FOLDERS):
    """(source, ast tree) of every .py file under `folders` that parses, in path order, files
    inside a sub-folder named in `skipped` left out: code read as text, nothing run."""
    import ast

    for folder in folders:
        for path in sorted(folder.rglob("*.py")):
            if skipped & set(path.relative_to(folder).parts):
                continue
            try:
                source = path.read_text(encoding="utf-8")
                yield source, ast.parse(source)
            except (SyntaxError, UnicodeDecodeError, ValueError):
                continue


def package_texts(names: list[str]) -> tuple[list[str], list[str]]:
    """Prose docstring paragraphs and short public top-level functions of installed packages,
    read from their files with `ast` (nothing is imported or run); test folders left out."""
    import ast

    docs, functions = [], []
    for source, tree in parsed_files(package_folders(names)):
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)):
                docs.append(_plain_rst(ast.get_docstring(node) or ""))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("_"):
                code = ast.get_source_segment(source, node) or ""
                if _is_short_function(code):
                    functions.append(code)
    return _paragraphs(docs), sorted(set(functions))


def tasks(rng: random.Random, texts: list[str], templates: list[str], count: int, category: str) -> list:
    """`count` texts drawn at random, each with a random task of `templates`."""
    chosen = rng.sample(texts, min(count, len(texts)))
    return [(category, rng.choice(templates).format(x=text)) for text in chosen]


def restyled(rng: random.Random, count: int) -> list:
    """Step 13's chat and writing fillers in every template, less the rows step 13 drew."""
    old = random.Random(2029)
    taken = {text for _, text in step13.chat(old, 450) + step13.functions(old, 450) + step13.writing(old, 450)}
    every = 99  # more than any list's templates: _crossed then takes each template once
    crossed = [(step13.WAYS, step13.WAYS_TEMPLATES), (step13.HELPS, step13.HELPS_TEMPLATES),
               (step13.ROUTINES, step13.ROUTINE_TEMPLATES), (step13.MACHINES, step13.MACHINE_TEMPLATES),
               (step13.TIPS, step13.TIP_TEMPLATES), (step13.BENEFITS, step13.BENEFIT_TEMPLATES),
               (step13.MISHAPS, step13.MISHAP_TEMPLATES), (step13.NOTES, step13.NOTE_TEMPLATES),
               (step13.EMAILS, step13.EMAIL_TEMPLATES), (step13.EVENTS, step13.EVENT_TEMPLATES),
               (step13.PRODUCTS, step13.PRODUCT_TEMPLATES), (step13.STORIES, step13.STORY_TEMPLATES),
               (step13.APOLOGIES, step13.APOLOGY_TEMPLATES), (step13.THANKS, step13.THANK_TEMPLATES)]
    made = [text for fillers, templates in crossed for text in step13._crossed(rng, fillers, templates, every)]
    fresh = sorted(set(made) - taken)
    return [("restyled", text) for text in rng.sample(fresh, min(count, len(fresh)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--passage", type=int, default=700)
    parser.add_argument("--source", type=int, default=450)
    parser.add_argument("--restyled", type=int, default=400)
    parser.add_argument("--packages", default="",
                        help="comma-separated installed packages to read (with ast) instead of the standard library")
    parser.add_argument("--seed", type=int, default=2030)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    if args.packages:
        found_passages, found_sources = package_texts([n for n in args.packages.split(",") if n])
    else:
        modules = _stdlib_modules()
        found_passages, found_sources = passages(modules), sources(modules)
    print(f"{len(found_passages)} passages, {len(found_sources)} functions found", file=sys.stderr)
    rows = (tasks(rng, found_passages, PASSAGE_TEMPLATES, args.passage, "passage")
            + tasks(rng, found_sources, SOURCE_TEMPLATES, args.source, "source")
            + restyled(rng, args.restyled))
    write_prompt_set(rows, rng, args.out, "headF")


if __name__ == "__main__":
    main()
