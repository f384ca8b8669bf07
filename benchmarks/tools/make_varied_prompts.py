"""Writes a second, more varied prompt set for draft-head self-distillation (issue 27, step 12).

The head trained on `head_prompts_large.jsonl` got better on that set's held-out prompts much
faster than on the eval suites (docs/head.md): those prompts share forty topics and a few dozen
templates. This set brings what they lack, each kind from its own source:

- `followup`: real two-turn conversations. The first turn is a training prompt of the large set,
  the assistant turn the target's own greedy answer to it (from a generations file), the second a
  follow-up request; the target answers the follow-up. Held-out first prompts are never used.
- `roleplay`: "you are a <role>" prompts, a role and a situation it meets.
- `reasoning`: small word problems (orderings, weekdays, rates, ages, percentages, change), with
  random names and numbers.
- `everyday`: questions about household objects, natural phenomena, differences between two
  things, and ideas for occasions.
- `python`: questions about Python standard-library functions, found by introspection (name,
  signature, the first line of the docstring).

None equals or contains an eval-suite, calibration or benchmark prompt (make_head_prompts's
check, every turn of the multi-turn suites included). Reproducible from the seed and the
generations file (the follow-ups depend on the answers in it).

    python benchmarks/tools/make_varied_prompts.py --answers gen-all.jsonl --out prompts-varied.jsonl
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import random
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_head_prompts import _normalise, eval_prompts  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

FOLLOWUPS = {
    "any": [
        "Can you make that shorter?", "Please explain that in simpler words.", "Give me one concrete example.",
        "Turn your answer into a bulleted list.", "What is the most important point in your answer, and why?",
        "Rewrite that in a more formal tone.", "Rewrite that for a ten-year-old.", "Add a short title to it.",
        "What would someone who disagrees say?", "Can you summarise your answer in one sentence?",
        "Which part of that is most often misunderstood?", "Can you give me two more ideas along the same lines?",
        "Thanks! Now write it as a short message I could send to a friend.", "What should I do first?",
        "Are there any risks or downsides I should know about?", "Make it sound more enthusiastic.",
        "Put the steps in a numbered list.", "Explain the second point in more detail.",
    ],
    "code": [
        "Now add a few test cases for it.", "What is the time complexity of your solution?",
        "How would it handle empty input?", "Rewrite it without using any imports.",
        "Add type hints and a docstring.", "Can you explain the code line by line?",
        "Rewrite it in JavaScript.", "Make it handle invalid input by raising a ValueError.",
    ],
    "math": [
        "Can you check your answer another way?", "Now change the numbers: double the first one and solve it again.",
        "Explain each step as if to a student who finds maths hard.", "Write a similar problem for me to practise.",
    ],
    "creative": [
        "Make it rhyme.", "Give it a sad ending instead.", "Now make it twice as long.", "Tell it from another character's view.",
    ],
}
ROLES = [
    "librarian", "train conductor", "zookeeper", "pharmacist", "firefighter", "tour guide in Rome",
    "bicycle mechanic", "night-shift nurse", "beekeeper", "astronaut on a space station", "baker",
    "football coach", "tailor", "park ranger", "taxi driver", "air traffic controller", "piano teacher",
    "plumber", "marine biologist", "wedding planner", "bookshop owner", "lighthouse keeper", "chess coach",
    "school bus driver", "gardener at a botanical garden", "weather forecaster", "veterinarian",
    "fisherman", "hotel receptionist", "museum curator", "yoga teacher", "detective", "pilot",
    "radio host", "farmer", "carpenter", "ice-cream seller", "history teacher", "mountain guide",
    "customer-support agent for an internet provider",
]
ROLE_SITUATIONS = [
    "Introduce yourself to a visitor and describe what you do.",
    "Explain to a group of children what a normal working day looks like for you.",
    "A customer is in a hurry and a little rude. Reply politely and help them.",
    "Give a newcomer in your job three pieces of advice.",
    "Describe the strangest thing that ever happened to you at work.",
    "Someone asks what they need to learn to do your job. Answer them.",
    "Write a short notice for the people you work with about a change next week.",
    "Tell a short, funny story from your work.",
]
NAMES = ["Ana", "Ben", "Chloe", "David", "Elif", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kofi", "Lena",
         "Mateo", "Nadia", "Omar", "Priya", "Quentin", "Rosa", "Sami", "Tara", "Umar", "Vera", "Wei", "Yara", "Zoe"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"]
OBJECTS = [
    "a wooden cutting board", "a cast-iron pan", "a leaking tap", "a squeaky door", "a slow laptop",
    "a bike chain", "white sneakers", "a burnt pot", "a wool jumper", "a blocked sink", "a dusty keyboard",
    "a scratched phone screen", "a wobbly table", "a kettle with limescale", "a smelly fridge",
    "an umbrella that will not close", "a stuck zip", "a flat bicycle tyre", "glass shower doors",
    "a houseplant with yellow leaves", "a dull kitchen knife", "a mattress", "leather boots", "a rusty tool",
    "an oven", "a washing machine that smells", "a hoodie that shrank", "a tangled necklace",
]
OBJECT_TEMPLATES = ["How do I clean {o}?", "What is the best way to look after {o}?",
                    "How can I fix {o} myself?", "What should I check before I replace {o}?"]
PHENOMENA = [
    "the sky turn red at sunset", "we get hiccups", "cats purr", "onions make us cry", "bread go stale",
    "ice float on water", "our ears pop on a plane", "the Moon change shape", "dogs wag their tails",
    "metal feel colder than wood", "popcorn pop", "we yawn", "stars twinkle", "some people snore",
    "fingers wrinkle in water", "leaves fall in autumn", "soap remove grease", "thunder follow lightning",
    "apples turn brown when cut", "we get goosebumps", "bubbles look rainbow-coloured", "the sea taste salty",
    "birds fly in a V shape", "coffee keep us awake", "mirrors flip left and right",
]
PAIRS = [
    ("weather", "climate"), ("a virus", "a bacterium"), ("baking soda", "baking powder"), ("a lake", "a pond"),
    ("speed", "velocity"), ("a crocodile", "an alligator"), ("a loan", "a mortgage"), ("a cold", "the flu"),
    ("a simile", "a metaphor"), ("a hurricane", "a tornado"), ("a city", "a town"), ("a debit card", "a credit card"),
    ("affect", "effect"), ("a fruit", "a vegetable"), ("a meteor", "a meteorite"), ("a monkey", "an ape"),
    ("an herb", "a spice"), ("jam", "jelly"), ("a sweater", "a cardigan"), ("a violin", "a viola"),
    ("RAM", "storage"), ("a router", "a modem"), ("latitude", "longitude"), ("a sea", "an ocean"),
    ("a poem", "a song"), ("a museum", "a gallery"), ("bread flour", "cake flour"), ("a hobby", "a job"),
]
OCCASIONS = [
    "a picnic in the park", "a rainy Sunday at home", "a colleague's farewell", "a first date",
    "a family reunion", "a class of eight-year-olds on the last day of school", "a long train journey",
    "a cheap weekend in the city", "a neighbour's new baby", "a garden party", "a camping trip with friends",
    "a grandparent's ninetieth birthday", "a team-building afternoon", "a snowy day", "a book club meeting",
]
OCCASION_TEMPLATES = ["Give me three ideas for {o}.", "What could I bring to {o}?", "Plan a simple schedule for {o}.",
                      "Write a short invitation to {o}."]
PYTHON_MODULES = [
    "string", "itertools", "collections", "functools", "os.path", "math", "statistics", "datetime", "json", "re",
    "random", "textwrap", "pathlib", "csv", "heapq", "bisect", "shutil", "time", "zipfile", "urllib.parse",
    "difflib", "fractions", "decimal", "calendar", "operator", "glob", "hashlib", "secrets", "uuid", "base64",
    "copy", "fnmatch", "html", "unicodedata", "gzip", "tempfile", "shlex", "struct", "array", "enum",
]
PYTHON_TEMPLATES = [
    "How do I use `{q}` in Python? Show a short example.",
    "What does `{q}` do? Explain it and give an example of when it is useful.",
    "The Python documentation says this about `{q}`: \"{doc}\" Explain what that means with an example.",
    "Write a short Python script that uses `{q}`, and explain each line.",
    "What mistakes do beginners make with `{q}`?",
]


def followups(answers: Path, large: list[dict], rng: random.Random, count: int, target) -> list[tuple[str, object]]:
    """Two-turn conversations from training prompts and the target's greedy answers to them."""
    from mars_cli.prompts import is_held_out

    rows = []
    for line in answers.read_text().splitlines():
        record = json.loads(line)
        index, output = record["index"], record["output_ids"]
        if (record.get("mode") != "greedy" or is_held_out(index, 10) or index >= len(large)
                or not 24 <= len(output) < 256 or output[-1] not in target.eos_token_ids):  # finished answers only
            continue
        rows.append((index, target.tokenizer.decode(output, skip_special_tokens=True).strip()))
    rows.sort()
    rng.shuffle(rows)
    made = []
    for index, answer in rows[:count]:
        category = large[index]["category"]
        options = FOLLOWUPS["any"] + FOLLOWUPS.get(category, []) * 2  # the category's own ones twice as often
        messages = [{"role": "user", "content": large[index]["prompt"]}, {"role": "assistant", "content": answer},
                    {"role": "user", "content": rng.choice(options)}]
        made.append(("followup", messages))
    return made


def reasoning(rng: random.Random, count: int) -> list[tuple[str, object]]:
    made = []
    for _ in range(count):
        a, b, c = rng.sample(NAMES, 3)
        kind = rng.randrange(6)
        if kind == 0:
            text = f"{a} is older than {b}. {c} is younger than {b}. Who is the oldest, and who is the youngest?"
        elif kind == 1:
            day, shift = rng.randrange(7), rng.randint(2, 20)
            text = f"Today is {DAYS[day]}. What day of the week will it be in {shift} days? Explain how you worked it out."
        elif kind == 2:
            speed, hours = rng.randint(3, 90), rng.choice([1.5, 2, 2.5, 3, 4])
            text = f"{a} cycles at {speed} km per hour for {hours} hours. How far does {a} go? Show the steps."
        elif kind == 3:
            age, gap = rng.randint(5, 40), rng.randint(2, 30)
            text = f"{a} is {age} years old and {b} is {gap} years older. How old will {b} be when {a} is {age + 10}?"
        elif kind == 4:
            price, pct = rng.randint(12, 400), rng.choice([5, 10, 15, 20, 25, 30, 40])
            text = f"A jacket costs {price} euros and is on sale at {pct}% off. What is the sale price? Show the steps."
        else:
            paid, cost = rng.choice([10, 20, 50]), rng.randint(1, 9) + rng.randint(0, 99) / 100
            text = f"{a} buys a sandwich for {cost:.2f} and pays with a {paid} note. How much change does {a} get?"
        made.append(("reasoning", text))
    return made


def everyday(rng: random.Random) -> list[tuple[str, object]]:
    rows = [t.format(o=o) for o in OBJECTS for t in OBJECT_TEMPLATES]
    rows += [f"Why do{'es' if p.split()[0] in ('the', 'ice', 'metal', 'bread', 'popcorn', 'soap', 'thunder', 'coffee') else ''} "
             f"{p}?" for p in PHENOMENA]
    rows += [f"What is the difference between {x} and {y}?" for x, y in PAIRS]
    rows += [t.format(o=o) for o in OCCASIONS for t in OCCASION_TEMPLATES]
    rows += [f"Pretend you are a {r}. {s}" for r in ROLES for s in rng.sample(ROLE_SITUATIONS, 4)]
    return [("roleplay" if t.startswith("Pretend") else "everyday", t) for t in rows]


def python_questions(rng: random.Random, count: int) -> list[tuple[str, object]]:
    """Questions about public standard-library functions that have a docstring."""
    found = []
    for module_name in PYTHON_MODULES:
        module = importlib.import_module(module_name)
        for name, item in sorted(vars(module).items()):
            if name.startswith("_") or not callable(item) or getattr(item, "__module__", "") in ("builtins", None):
                continue
            doc = (inspect.getdoc(item) or "").strip().split("\n\n")[0].replace("\n", " ")
            if 20 <= len(doc) <= 200 and not doc.startswith(name):
                found.append((f"{module_name}.{name}", doc))
    rng.shuffle(found)
    return [("python", rng.choice(PYTHON_TEMPLATES).format(q=q, doc=doc)) for q, doc in found[:count]]


def user_turns(prompt: object) -> list[str]:
    """The user turns of a conversation, or the prompt itself."""
    return [m["content"] for m in prompt if m["role"] == "user"] if isinstance(prompt, list) else [prompt]  # type: ignore[union-attr]


def write_prompt_set(rows: list[tuple[str, object]], rng: random.Random, out: Path, prefix: str) -> None:
    """Drop duplicates and any prompt with a user turn equal to or containing an eval-suite,
    calibration or benchmark prompt; shuffle; write `{"id", "category", "prompt"|"messages"}` lines."""
    banned = {_normalise(t) for t in eval_prompts(ROOT)}
    kept, seen = [], set()
    for category, prompt in rows:
        key = _normalise(json.dumps(prompt))
        if key in seen or any(b in _normalise(turn) for turn in user_turns(prompt) for b in banned):
            continue
        seen.add(key)
        kept.append((category, prompt))
    rng.shuffle(kept)
    with out.open("w", encoding="utf-8") as stream:
        for number, (category, prompt) in enumerate(kept):
            field = "messages" if isinstance(prompt, list) else "prompt"
            stream.write(json.dumps({"id": f"{prefix}-{number:05d}", "category": category, field: prompt}) + "\n")
    print(f"wrote {len(kept)} prompts to {out}: {dict(Counter(c for c, _ in kept).most_common())}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--answers", type=Path, required=True, help="generations of head_prompts_large.jsonl")
    parser.add_argument("--followups", type=int, default=900)
    parser.add_argument("--reasoning", type=int, default=300)
    parser.add_argument("--python", type=int, default=400)
    parser.add_argument("--seed", type=int, default=2028)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from mars_cli.models import load_model

    rng = random.Random(args.seed)
    large = [json.loads(line) for line in (ROOT / "mars_cli" / "data" / "head_prompts_large.jsonl").read_text().splitlines()]
    target = load_model("smollm2-135m", device="cpu", dtype="float32")  # its tokenizer and end-of-sequence ids
    rows = (followups(args.answers, large, rng, args.followups, target) + reasoning(rng, args.reasoning)
            + everyday(rng) + python_questions(rng, args.python))
    write_prompt_set(rows, rng, args.out, "headV")

if __name__ == "__main__":
    main()
