"""Writes mars_cli/data/head_prompts.jsonl: the prompt set for draft-head self-distillation.

Hand-written topics and instructions, crossed with a fixed seed, so the set is reproducible and
owes nothing to hub data sets. None of these prompts is a benchmark or eval-suite prompt.

    python benchmarks/tools/make_head_prompts.py
"""

from __future__ import annotations

import json
import random
from pathlib import Path

TOPICS = [
    "photosynthesis", "compound interest", "the water cycle", "volcanoes", "the immune system",
    "black holes", "electric cars", "recycling plastic", "the printing press", "vaccines",
    "solar panels", "earthquakes", "the stock market", "machine learning", "the Roman Empire",
    "honey bees", "ocean tides", "inflation", "the internet", "coral reefs", "sleep",
    "the French Revolution", "rainbows", "antibiotics", "wind turbines", "democracy",
    "the human heart", "glaciers", "credit scores", "the Moon landing", "composting",
    "batteries", "migration of birds", "the Great Wall of China", "coffee", "time zones",
    "chess", "DNA", "public libraries", "remote work",
]
TOPIC_TEMPLATES = [
    "Explain {t} in simple terms.",
    "What are the most important facts about {t}?",
    "Write a short paragraph about {t} for a school newsletter.",
    "What are common misconceptions about {t}?",
    "Give me a short quiz with three questions about {t}, with answers.",
    "Why does {t} matter in everyday life?",
    "Describe the history of {t} in a few sentences.",
    "Write a haiku about {t}.",
]
ACTIVITIES = [
    "learning a new language", "saving money on groceries", "running a first marathon",
    "keeping houseplants alive", "writing a cover letter", "cooking for a large family",
    "getting better sleep", "starting a small business", "organising a messy garage",
    "preparing for a job interview", "travelling on a budget", "taking care of a puppy",
    "making friends in a new city", "reducing screen time", "learning to play the guitar",
    "planning a birthday party", "staying healthy in winter", "studying for a maths exam",
    "painting a room", "giving a good presentation",
]
ACTIVITY_TEMPLATES = [
    "Give me some practical advice for {a}.",
    "What mistakes should I avoid when {a}?",
    "Make a simple step-by-step plan for {a}.",
]
CODE_TASKS = [
    ("reverse_words(s)", "reverses the order of the words in a sentence"),
    ("count_vowels(s)", "counts the vowels in a string"),
    ("fibonacci(n)", "returns the first n Fibonacci numbers as a list"),
    ("is_prime(n)", "checks whether a number is prime"),
    ("flatten(items)", "flattens a nested list of lists"),
    ("word_frequencies(text)", "returns a dictionary counting how often each word appears"),
    ("celsius_to_fahrenheit(c)", "converts a temperature from Celsius to Fahrenheit"),
    ("merge_sorted(a, b)", "merges two sorted lists into one sorted list"),
    ("remove_duplicates(items)", "removes duplicates from a list while keeping the order"),
    ("max_subarray(nums)", "returns the largest sum of a contiguous subarray"),
    ("binary_search(items, target)", "finds the index of a value in a sorted list"),
    ("capitalize_words(s)", "capitalises the first letter of every word"),
    ("gcd(a, b)", "computes the greatest common divisor of two integers"),
    ("chunk(items, size)", "splits a list into chunks of a given size"),
    ("is_anagram(a, b)", "checks whether two strings are anagrams"),
    ("factorial(n)", "computes the factorial of n iteratively"),
    ("read_csv_rows(path)", "reads a CSV file and returns its rows as dictionaries"),
    ("second_largest(nums)", "returns the second largest number in a list"),
    ("rotate_list(items, k)", "rotates a list to the right by k places"),
    ("valid_parentheses(s)", "checks whether the brackets in a string are balanced"),
    ("sum_digits(n)", "returns the sum of the digits of an integer"),
    ("transpose(matrix)", "transposes a matrix given as a list of lists"),
    ("run_length_encode(s)", "compresses a string with run-length encoding"),
    ("days_between(d1, d2)", "returns the number of days between two ISO dates"),
]
CODE_TEMPLATES = [
    "Write a Python function `{f}` that {d}.",
    "Write a Python function `{f}` that {d}. Include a docstring and a short example.",
    "Write a JavaScript function equivalent to the Python function `{f}` that {d}.",
]
CODE_SNIPPETS = [
    "def mystery(xs):\n    total = 0\n    for x in xs:\n        if x % 2 == 0:\n            total += x\n    return total",
    "def f(s):\n    return s == s[::-1]",
    "result = [x * x for x in range(10) if x % 3 == 0]\nprint(result)",
    "def g(d):\n    return {v: k for k, v in d.items()}",
    "import os\nfor name in sorted(os.listdir('.')):\n    if name.endswith('.txt'):\n        print(name)",
    "def h(n):\n    if n <= 1:\n        return n\n    return h(n - 1) + h(n - 2)",
]
SNIPPET_TEMPLATES = [
    "Explain what this Python code does:\n\n{c}",
    "Add comments and type hints to this code:\n\n{c}",
    "Suggest an improvement to this code and show the new version:\n\n{c}",
]
PASSAGES = [
    "The town library opened a new reading room last month. It has large windows, comfortable "
    "chairs and a small corner for children. Since it opened, the number of visitors has almost "
    "doubled, and the library now plans to stay open later on weekdays.",
    "Scientists studying a mountain lake found that its water has warmed by two degrees over "
    "thirty years. Warmer water holds less oxygen, and some fish species have moved to deeper, "
    "colder parts of the lake. The researchers want to keep measuring for another decade.",
    "A small bakery started delivering bread by bicycle. The owner says deliveries are faster in "
    "the crowded centre and customers like the idea. The bakery now employs three riders and is "
    "looking for a fourth.",
    "The school introduced a rule that phones must stay in lockers during lessons. Teachers report "
    "fewer distractions, while some students say they miss being able to check the time or "
    "contact their parents. The school will review the rule at the end of the year.",
    "A new train line connects two cities that used to be three hours apart by road. The journey "
    "now takes seventy minutes. Local businesses expect more visitors, but some residents worry "
    "about noise near the tracks.",
    "Volunteers planted two thousand trees along the river last spring. Most of the young trees "
    "survived the dry summer thanks to a watering schedule shared among neighbours. The group "
    "hopes the trees will reduce flooding in the future.",
    "The museum's new exhibition shows everyday objects from a hundred years ago: kitchen tools, "
    "toys, letters and clothes. Visitors can touch some of the objects, and a guide explains how "
    "people used them.",
    "A company tested a four-day working week for six months. Employees reported less stress and "
    "the company's output stayed the same. The managers have decided to continue the trial for "
    "another year.",
]
PASSAGE_TEMPLATES = [
    "Summarise this text in one sentence:\n\n{p}",
    "List the key points of this text as bullet points:\n\n{p}",
    "Rewrite this text so that a young child can understand it:\n\n{p}",
    "Write a headline for this news story:\n\n{p}",
]
SENTENCES = [
    "The weather is lovely today.", "Where is the nearest train station?",
    "I would like a cup of tea, please.", "My brother works in a hospital.",
    "We are going to the beach tomorrow.", "This book is very interesting.",
    "Can you help me carry these boxes?", "The meeting starts at nine o'clock.",
    "She has lived in this city for ten years.", "Please close the window.",
]
LANGUAGES = ["French", "Spanish", "German", "Italian"]
PEOPLE = ["my landlord", "a colleague", "my child's teacher", "a customer", "my neighbour", "my manager"]
SUBJECTS = ["a broken heater", "a missed deadline", "a party next weekend", "a refund",
            "a change of schedule", "a thank-you for their help"]
ITEMS = [("apples", "kg"), ("notebooks", "pack"), ("tickets", "ticket"), ("tiles", "box"), ("seeds", "bag")]


def math_prompts(rng: random.Random, count: int) -> list[str]:
    prompts = []
    for _ in range(count):
        kind = rng.randrange(4)
        a, b, c = rng.randint(2, 40), rng.randint(2, 12), rng.randint(2, 9)
        if kind == 0:
            item, unit = rng.choice(ITEMS)
            prompts.append(f"A shop sells {item} at ${b} per {unit}. How much do {a} {unit}s cost "
                           f"with a {c * 5}% discount? Explain step by step.")
        elif kind == 1:
            prompts.append(f"A train travels {a * 10} km in {b} hours. What is its average speed, "
                           f"and how far does it go in {c} hours at that speed?")
        elif kind == 2:
            prompts.append(f"Tom has {a} marbles. He gives {b} to his sister and then buys {c} "
                           f"bags with {b} marbles each. How many marbles does he have now?")
        else:
            prompts.append(f"Solve for x: {b}x + {a} = {a + b * c}. Show your working.")
    return prompts


def build(seed: int = 2026) -> list[dict]:
    rng = random.Random(seed)
    rows: list[tuple[str, str]] = []
    rows += [("chat", t.format(t=topic)) for topic in TOPICS for t in TOPIC_TEMPLATES]
    rows += [("chat", t.format(a=a)) for a in ACTIVITIES for t in ACTIVITY_TEMPLATES]
    rows += [("code", t.format(f=f, d=d)) for f, d in CODE_TASKS for t in CODE_TEMPLATES]
    rows += [("code", t.format(c=c)) for c in CODE_SNIPPETS for t in SNIPPET_TEMPLATES]
    rows += [("summarize", t.format(p=p)) for p in PASSAGES for t in PASSAGE_TEMPLATES]
    rows += [("translate", f"Translate into {lang}: {s}") for s in SENTENCES for lang in LANGUAGES]
    rows += [("chat", f"Write a short, polite email to {who} about {what}.") for who in PEOPLE for what in SUBJECTS]
    rows += [("math", p) for p in math_prompts(rng, 60)]
    rng.shuffle(rows)
    return [{"id": f"head-{i:03d}", "category": cat, "prompt": text} for i, (cat, text) in enumerate(rows)]


if __name__ == "__main__":
    out = Path(__file__).resolve().parents[2] / "mars_cli" / "data" / "head_prompts.jsonl"
    rows = build()
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} prompts to {out}")
