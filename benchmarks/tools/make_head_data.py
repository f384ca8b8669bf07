"""Makes the draft head's prompt sets and checks every training-data file against benchmarks/data-manifest.json.

The prompts the shipped head (and the heads before it) were trained on are made by this tool, not
committed: each set is hand-written templates and lists crossed with a fixed seed, or real text
already on the machine (Python's documentation, standard-library and installed packages' code),
or the target's own answers and requests. One subcommand a kind of set:

    small      mars_cli/data/head_prompts.jsonl: the 638 prompts `mars train-head` defaults to (seed 2026)
    large      mars_cli/data/head_prompts_large.jsonl: 6,726 prompts in eight categories (seed 2027)
    varied     follow-ups over the target's greedy answers to the large set, role-play, word problems,
               everyday and Python standard-library questions (step 12's kind; seed 2028)
    styles     the eval suites' styles, never their content: everyday requests, function tasks,
               writing tasks, three-turn conversations, explanations (step 13's kind; seed 2029)
    real-text  tasks on real text: prose of Python's docs or installed packages, short functions
               (step 14's kind; seed 2030; depends on the Python version and the packages read)
    functions  "Write a Python function `f(x)` that ..." made from real functions' docstrings
               (step 16's kind; seed 2032; depends on the installed files)
    magpie     user requests the target writes itself (step 17's kind; seed 2033; samples the
               model: same CPU and torch for the same bytes)
    check      remakes every set benchmarks/data-manifest.json can have made again offline (into
               --dir, default $MARS_CACHE/head-data, i.e. ~/.cache/mars-cli/head-data), unpacks the
               kept compressed ones there, and compares each file's sha256 and size with the manifest

None of the sets holds a prompt equal to or containing an eval-suite, calibration or benchmark
prompt (case- and whitespace-insensitive, every user turn of a conversation). Each subcommand's
`--help` lists its flags; the manifest records the exact command of every set:

    python benchmarks/tools/make_head_data.py check                      # everything, ~2 minutes
    python benchmarks/tools/make_head_data.py check --dir .gpu --only step16,step14,step14b
    python benchmarks/tools/make_head_data.py large --out /tmp/head_prompts_large.jsonl
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import importlib
import inspect
import json
import random
import re
import shlex
import subprocess
import sys
import sysconfig
import textwrap
import time
import warnings
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "benchmarks" / "data-manifest.json"



def answer_records(path: Path, file_name: str):
    """The answer records of `path` (JSONL, or gzipped JSONL as gpu_train_head.py writes it) to the
    prompt file `file_name`: records naming another file in their `file` field are left out."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as stream:
        for line in stream:
            if line.strip():
                record = json.loads(line)
                if record.get("file", file_name) == file_name:
                    yield record


# =================================================================================================
# `small` and `large`: hand-written topics and instructions crossed with a seed (mars_cli/data's
# head_prompts.jsonl and head_prompts_large.jsonl; the exclusion check every set shares)
# =================================================================================================

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


# ---------------------------------------------------------------------------------------------
# The large set (`large`): mars_cli/data/head_prompts_large.jsonl. Everything below is written
# for this project; build() above and its lists are left as they were, so head_prompts.jsonl
# does not change. A topic ending in "+" is plural (the templates then say "are", "do", ...).
# ---------------------------------------------------------------------------------------------

L_GENERIC_TEMPLATES = [
    "Tell me about {t}.",
    "What are five interesting facts about {t}?",
    "Write a short article about {t} for a community newsletter.",
    "Give me a three-question quiz about {t}, with the answers at the end.",
    "What are common myths about {t}, and what is the truth?",
    "Summarise what everyone should know about {t} in five bullet points.",
    "I have to give a two-minute talk about {t}. Can you help me outline it?",
    "Explain {t} as if I were twelve years old.",
    "What is one question about {t} that most people never think to ask? Answer it too.",
]
L_DOMAINS: dict[str, tuple[list[str], list[str]]] = {
    "science": ([
        "photosynthesis", "gravity", "volcanoes+", "black holes+", "DNA", "evolution by natural selection",
        "the periodic table", "static electricity", "magnetism", "optical illusions+", "atoms+",
        "plate tectonics", "the greenhouse effect", "sound waves+", "nuclear fusion", "the human brain",
        "bacteria+", "the solar system", "clouds+", "friction", "enzymes+", "climate change",
        "the human skeleton", "lightning", "comets+", "the nitrogen cycle", "red blood cells+", "radioactivity",
    ], [
        "How {does} {t} work?",
        "What is the science behind {t}, in plain language?",
        "How do scientists study {t}?",
        "Explain {t} using an everyday analogy.",
        "What simple experiment could a student do at home to learn about {t}?",
        "What questions about {t} are scientists still trying to answer?",
    ]),
    "history": ([
        "the French Revolution", "the Industrial Revolution", "the invention of the printing press",
        "the building of the Egyptian pyramids+", "the fall of the Western Roman Empire", "the Silk Road trade",
        "the Renaissance", "the Cold War", "the invention of the telephone", "the first modern Olympic Games+",
        "the Viking voyages to North America+", "the fall of the Berlin Wall", "the age of exploration",
        "the first Moon landing", "the invention of writing", "the Black Death", "the abolition of the slave trade",
        "the construction of the Panama Canal", "the spread of railways in the 1800s+", "the Apollo space programme",
        "the invention of paper money", "the women's suffrage movement", "the discovery of penicillin",
        "the Great Fire of London",
    ], [
        "What led to {t}, and what happened afterwards?",
        "Why {is} {t} considered so important by historians?",
        "What was everyday life like for ordinary people around the time of {t}?",
        "Write a short timeline of {t}.",
        "What are two different ways historians have interpreted {t}?",
        "Describe {t} the way a museum guide would to a group of visitors.",
    ]),
    "geography": ([
        "the Sahara Desert", "the Amazon rainforest", "Iceland", "the Himalayas+", "Japan", "Antarctica",
        "Mongolia", "the Andes+", "New Zealand", "the Rocky Mountains+", "Madagascar", "the Alps+",
        "the Gobi Desert", "Patagonia", "the Netherlands", "Kenya", "Peru", "the Scottish Highlands+",
        "Greenland", "Morocco",
    ], [
        "What is the climate like in {t}?",
        "What plants and animals can you find in {t}?",
        "How do people make a living in {t}?",
        "What should a first-time visitor know about {t}?",
        "How has the landscape of {t} been shaped over time?",
        "Describe {t} in a few vivid sentences.",
    ]),
    "technology": ([
        "microwave ovens+", "refrigerators+", "Wi-Fi", "GPS", "smartphones+", "touchscreens+", "QR codes+",
        "electric cars+", "solar panels+", "password managers+", "cloud storage", "3D printing",
        "noise-cancelling headphones+", "barcodes+", "search engines+", "spam filters+", "lithium-ion batteries+",
        "two-factor authentication", "video streaming", "smart thermostats+", "LED light bulbs+",
        "robot vacuum cleaners+", "online maps+", "contactless payment", "open-source software",
    ], [
        "How {do} {t} work?",
        "What are the pros and cons of {t}?",
        "Explain {t} to my grandmother, who is not used to technology.",
        "What are some tips for using {t} safely and well?",
        "How {have} {t} changed over the last twenty years?",
        "What problems {do} {t} still have, and how might they be solved?",
    ]),
    "health": ([
        "sleep", "hydration", "stretching", "stress", "seasonal allergies+", "the common cold", "vitamin D",
        "posture at a desk", "regular walking", "sunscreen", "dental hygiene", "handwashing", "back pain",
        "meditation", "strength training", "caffeine", "hearing protection", "eye strain", "fibre in the diet",
        "healthy snacking",
    ], [
        "What should an ordinary adult know about {t}?",
        "How {does} {t} affect everyday well-being?",
        "Write a short, friendly health-tips leaflet about {t}.",
        "What does research say about {t}, in plain language?",
        "Give me three small changes I could make this week related to {t}.",
        "What questions could I ask a pharmacist or doctor about {t}?",
    ]),
    "money": ([
        "compound interest", "budgeting", "credit scores+", "inflation", "emergency funds+", "student loans+",
        "index funds+", "income tax", "pensions+", "mortgages+", "home insurance", "exchange rates+",
        "interest rates+", "saving for retirement", "credit card debt", "online banking",
    ], [
        "Explain {t} in plain English.",
        "What do young adults most often get wrong about {t}?",
        "How {does} {t} affect a typical household?",
        "Give a simple example with numbers that shows how {t} {works}.",
        "What questions should I ask myself before making decisions about {t}?",
        "What is a good way to start learning about {t}?",
    ]),
    "arts": ([
        "impressionist painting", "jazz", "the sonnet", "opera", "street art", "photography", "film editing",
        "pottery", "ballet", "graphic novels+", "classical music", "folk songs+", "Gothic architecture",
        "stand-up comedy", "origami", "calligraphy", "watercolour painting", "puppet theatre",
    ], [
        "What makes {t} special?",
        "How did {t} develop over time?",
        "How can a beginner learn to appreciate {t}?",
        "Describe the key features of {t}.",
        "Why do some people love {t} while others find {it} hard to enjoy?",
    ]),
    "sports": ([
        "football", "tennis", "swimming", "cycling", "basketball", "rock climbing", "cricket", "table tennis",
        "rowing", "marathon running", "yoga", "skiing", "volleyball", "badminton", "surfing", "orienteering",
    ], [
        "How would a complete beginner get started with {t}?",
        "What skills does {t} develop?",
        "Give me a brief history of {t}.",
        "What equipment do I need for {t}?",
        "What are the most common injuries in {t}, and how can they be prevented?",
        "How should someone train for {t} in their first three months?",
    ]),
    "nature": ([
        "coral reefs+", "honey bees+", "bird migration", "ocean tides+", "glaciers+", "rainforests+", "wolves+",
        "mushrooms+", "octopuses+", "wetlands+", "desert plants+", "earthworms+", "whales+", "bats+",
        "ant colonies+", "mangrove forests+", "lichens+", "owls+", "sea turtles+", "pollinating insects+",
    ], [
        "What role {do} {t} play in nature?",
        "How {is} {t} affected by a changing climate?",
        "How can ordinary people help protect {t}?",
        "Write a short nature-documentary narration about {t}.",
        "What would happen to an ecosystem without {t}?",
    ]),
    "food": ([
        "sourdough bread", "fermentation", "spices+", "olive oil", "rice", "chocolate", "cheese making",
        "coffee roasting", "tea", "fresh pasta", "food preservation", "street food", "vegetarian cooking",
        "umami", "kimchi", "bread baking",
    ], [
        "What is the story of {t}, and where {does} {they} come from?",
        "What is the science behind {t}?",
        "How can I make more use of {t} in everyday cooking?",
        "What are the health benefits and drawbacks of {t}?",
        "What do beginners usually get wrong about {t}?",
    ]),
    "work": ([
        "remote work", "job interviews+", "networking", "performance reviews+", "time management", "burnout",
        "team meetings+", "career changes+", "freelancing", "giving feedback at work", "asking for a raise",
        "onboarding new employees", "the four-day working week",
    ], [
        "What does experience suggest about {t}?",
        "What should a new graduate understand about {t}?",
        "How can managers handle {t} well?",
        "Give me three practical tips about {t}.",
        "What are the pros and cons of the usual approach to {t}?",
    ]),
    "society": ([
        "democracy", "voting", "public libraries+", "urbanisation", "social media", "volunteering",
        "public transport", "recycling programmes+", "immigration", "universal basic income", "free speech",
        "minimum wage laws+", "local elections+", "jury duty", "the census", "community gardens+",
        "online privacy", "the gig economy",
    ], [
        "What are the main arguments for and against {t}?",
        "How {does} {t} affect ordinary people?",
        "Explain {t} in a neutral, balanced way.",
        "How {has} {t} changed in the last fifty years?",
        "What questions would help me understand {t} better?",
    ]),
}
_PLURAL_FILLS = {"is": "are", "does": "do", "do": "do", "has": "have", "have": "have", "was": "were",
                 "it": "them", "they": "they", "works": "work"}
_SINGULAR_FILLS = {"is": "is", "does": "does", "do": "does", "has": "has", "have": "has", "was": "was",
                   "it": "it", "they": "it", "works": "works"}


def _fill_topic(template: str, topic: str) -> str:
    plural = topic.endswith("+")
    words = _PLURAL_FILLS if plural else _SINGULAR_FILLS
    text = template.format(t=topic.rstrip("+"), **words)
    return text[0].upper() + text[1:]


def _article(word: str) -> str:
    return ("an " if word[0].lower() in "aeiou" else "a ") + word


L_ACTIVITIES = [
    "learning to swim as an adult", "growing tomatoes on a balcony", "training for a 10 km run",
    "learning to touch-type", "moving to a new country", "decluttering a small flat", "starting a book club",
    "learning to bake bread", "caring for an elderly parent", "teaching a child to ride a bike",
    "writing a first novel", "preparing for a driving test", "setting up a home office", "learning to draw",
    "building an emergency fund", "paying off a credit card", "cutting down on sugar", "learning to meditate",
    "starting a vegetable garden", "training a rescue dog", "learning basic car maintenance",
    "negotiating a salary", "planning a wedding on a budget", "learning to play chess",
    "starting a podcast", "keeping a daily journal", "learning to sew", "hosting a dinner party",
    "going back to study as an adult", "becoming a volunteer", "learning to code", "improving handwriting",
    "learning to cook with spices", "switching to a plant-based diet", "moving in with a flatmate",
    "preparing for a long-haul flight", "camping for the first time", "keeping a fish tank",
    "learning to knit", "reducing food waste", "organising family photos", "selling things online",
    "learning to juggle", "preparing for a public speaking event", "making a monthly budget",
    "learning sign language", "building a habit of reading", "coaching a children's football team",
    "repairing a bicycle puncture", "learning to ice skate", "working night shifts", "managing a team for the first time",
    "renovating a kitchen", "applying to university", "writing a wedding speech", "raising backyard chickens",
    "learning to dance salsa", "starting a compost heap", "choosing a first car", "living alone for the first time",
    "going on a first solo trip", "learning photography with a phone", "keeping a sourdough starter",
    "waking up earlier", "studying with ADHD", "learning to play the piano",
]
L_ACTIVITY_TEMPLATES = [
    "I'm thinking about {a}. Where should I start?",
    "What are the most common beginner mistakes in {a}, and how can I avoid them?",
    "What will {a} cost me in time, money and effort?",
    "How can I stay motivated while {a}?",
    "My friend says {a} is too hard. What would you tell them?",
    "Give me five quick tips for {a}.",
    "What does a realistic first month of {a} look like?",
]
L_COMPARE_PAIRS = [
    ("a bacterium", "a fungus"), ("an alligator", "a crocodile"), ("a hurricane", "a tornado"),
    ("a simile", "a metaphor"), ("a meteor", "a meteorite"), ("baking soda", "baking powder"),
    ("a debit card", "a credit card"), ("stocks", "bonds"), ("a will", "a trust"), ("RAM", "storage"),
    ("a router", "a modem"), ("HTTP", "HTTPS"), ("a compiler", "an interpreter"), ("a Python list", "a Python tuple"),
    ("SQL", "NoSQL databases"), ("an app", "a website"), ("a frog", "a toad"), ("a rabbit", "a hare"),
    ("a moth", "a butterfly"), ("a mushroom", "a toadstool"), ("a republic", "a monarchy"),
    ("a president", "a prime minister"), ("a town", "a city"), ("a sea", "an ocean"), ("a hill", "a mountain"),
    ("a pond", "a lake"), ("a cold", "the flu"), ("a food allergy", "a food intolerance"),
    ("aerobic exercise", "anaerobic exercise"), ("a psychologist", "a psychiatrist"), ("a nurse", "a doctor"),
    ("empathy", "sympathy"), ("affect", "effect"), ("fewer", "less"), ("who", "whom"), ("its", "it's"),
    ("British English", "American English"), ("a novel", "a novella"), ("a poem", "a song"),
    ("a violin", "a viola"), ("jazz", "blues"), ("a latte", "a cappuccino"), ("green tea", "black tea"),
    ("a sweet potato", "a yam"), ("butter", "margarine"), ("a herb", "a spice"), ("a fruit", "a vegetable"),
    ("a loan", "a mortgage"), ("saving", "investing"), ("gross pay", "net pay"), ("a budget", "a forecast"),
    ("a CV", "a cover letter"), ("a manager", "a leader"), ("a freelancer", "an employee"),
    ("an apprenticeship", "a university degree"), ("speed", "velocity"), ("mass", "weight"),
    ("heat", "temperature"), ("an atom", "a molecule"), ("a star", "a planet"), ("an asteroid", "a comet"),
    ("a solar eclipse", "a lunar eclipse"), ("renewable energy", "non-renewable energy"),
    ("recycling", "upcycling"), ("a fact", "an opinion"), ("a theory", "a hypothesis"),
    ("correlation", "causation"), ("the mean", "the median"), ("a square", "a rectangle"),
    ("an email", "a letter"), ("a blog", "a newspaper"), ("a podcast", "a radio show"),
    ("a museum", "a gallery"), ("a library", "a bookshop"), ("a marathon", "a half marathon"),
    ("a sprint", "a relay race"), ("rugby", "American football"), ("squash", "tennis"),
    ("a laptop", "a tablet"), ("a password", "a passkey"), ("a folder", "a file"), ("weather", "seasons"),
    ("a glacier", "an iceberg"), ("a canyon", "a valley"), ("an island", "a peninsula"),
    ("a dialect", "a language"), ("a tradition", "a habit"),
]
L_COMPARE_TEMPLATES = [
    "What is the difference between {x} and {y}?",
    "How are {x} and {y} similar, and how are they different?",
    "Explain the difference between {x} and {y} with an everyday example.",
]
L_QUESTIONS = [
    "Why is the sky blue?", "Why does bread go stale?", "How do fish breathe underwater?",
    "Why do we get goosebumps?", "How does a compass know where north is?", "Why is sea water salty?",
    "How do planes stay in the air?", "Why do onions make people cry?", "How do vaccines train the body?",
    "Why do we have leap years?", "How does soap clean things?", "Why do cats land on their feet?",
    "What causes hiccups?", "How do noise-cancelling headphones block sound?", "Why does ice float?",
    "How do plants know which way is up?", "Why do stars twinkle?", "How do camels survive in the desert?",
    "Why do our fingers wrinkle in water?", "How is paper made?", "How does a refrigerator keep food cold?",
    "Why do we dream?", "How do birds know where to fly in winter?", "Why does the Moon look bigger near the horizon?",
    "How do glasses help people see better?", "What makes a diamond so hard?", "Why do we yawn?",
    "How do submarines go up and down?", "How do elevators know which floor to stop at?",
    "Why do some trees lose their leaves and others do not?", "How do thermometers work?",
    "Why does popcorn pop?", "How did people tell the time before clocks?", "Why is the ocean blue?",
    "How do bees find their way back to the hive?", "Why do apples turn brown after they are cut?",
    "How are rainbows formed after rain?", "Why do we have different blood types?",
    "What keeps the Earth spinning?", "How does a lock and key work?", "Why does the wind blow?",
    "How do spiders spin webs?", "How does a pencil eraser work?", "Why do balloons float when filled with helium?",
    "How do touchscreens know where my finger is?", "Why is it colder at the top of a mountain?",
    "How do snakes move without legs?", "Why do dogs wag their tails?", "How do hearing aids work?",
    "How long does it take light from the Sun to reach the Earth?", "Why do some people need less sleep than others?",
    "What is the tallest mountain in the solar system?", "How many bones are in an adult human body?",
    "Why is the number zero important in mathematics?", "How do maps show hills and valleys?",
    "Why do bicycles stay upright when they are moving?", "What happens to the body when we run?",
    "How does a dishwasher clean plates?", "Why do tomatoes ripen faster next to bananas?",
    "How do we know how old a tree is?",
]
L_WORDS = [
    "serendipity", "resilient", "ubiquitous", "meticulous", "ephemeral", "pragmatic", "candid", "nostalgia",
    "procrastinate", "benevolent", "ambiguous", "frugal", "tenacious", "eloquent", "mundane", "inevitable",
    "gregarious", "diligent", "lethargic", "scrutinise", "feasible", "plausible", "reluctant", "tedious",
    "vivid", "obsolete", "prudent", "resourceful", "skeptical", "thrifty", "verbose", "whimsical",
    "altruistic", "arbitrary", "cohesive", "deter", "empathy", "foresight", "hinder", "impartial",
    "jargon", "mitigate", "novice", "optimistic", "paradox", "quaint", "redundant", "sustainable",
    "tangible", "versatile",
]
L_WORD_TEMPLATES = [
    "What does the word \"{w}\" mean? Use it in a sentence.",
    "Give me a simple definition of \"{w}\" and two example sentences.",
]
L_STORY_SUBJECTS = [
    "a lighthouse keeper who finds a message in a bottle", "a robot learning to paint",
    "a girl who can talk to trees", "two strangers stuck in a lift", "a lost dog finding its way home",
    "a baker who accidentally makes magic bread", "the last day of summer camp", "a city where it never stops raining",
    "an old man who collects keys", "a fox who wants to be a firefighter", "a school trip to a strange museum",
    "a postal worker on a remote island", "a time traveller stuck in the year 1900", "a dragon afraid of fire",
    "a detective who solves crimes by smell", "a family moving to the countryside", "a chess game that lasts forty years",
    "a garden gnome that comes alive at night", "a young inventor and her broken bicycle",
    "an astronaut who misses the taste of apples", "a library book that keeps coming back",
    "a street musician who plays one song all day", "a snowman who wants to see spring",
    "two rival ice-cream sellers on the same beach", "a ship's cat on a stormy voyage",
    "a shy boy who wins a singing contest", "a clock shop where time runs backwards",
    "the first person to live on Mars", "a grandmother teaching her grandson to fish",
    "a mouse who lives in a concert hall", "a village that wakes up without electricity",
    "a tree that has seen three hundred years", "a runner who finishes a race last and happy",
    "a mysterious new neighbour who never goes out in daylight", "a penguin who wants to fly",
    "an old map found behind a wardrobe", "a robot waiter on its first day at work",
    "a kite that carries a child over the town", "a train that only runs at midnight",
    "a lonely scarecrow who makes friends with the crows",
]
L_STORY_TEMPLATES = [
    "Write a short story about {s}.",
    "Write a bedtime story for a five-year-old about {s}.",
    "Write a 100-word story about {s} with a surprising ending.",
    "Write the opening paragraph of a novel about {s}.",
]
L_POEM_SUBJECTS = [
    "the first snow of winter", "a busy train station", "an old pair of boots", "the smell of fresh bread",
    "a grandmother's kitchen", "the sea at night", "a city waking up", "a cat asleep in the sun",
    "the last leaf on a tree", "a thunderstorm in summer", "a bicycle ride downhill", "moving house",
    "a cup of morning coffee", "the stars over a campsite", "an empty playground", "a garden after rain",
    "friendship", "growing older", "a long road trip", "the sound of a piano next door",
    "autumn in the park", "a fisherman at dawn", "homesickness", "a lighthouse", "a market on Saturday morning",
    "learning to ride a bike", "the Moon", "a library at closing time", "spring flowers", "a quiet Sunday",
]
L_POEM_TEMPLATES = [
    "Write a short rhyming poem about {s}.",
    "Write a free-verse poem about {s}.",
    "Write a funny limerick about {s}.",
    "Write three haiku about {s}.",
]
L_DIALOGUE_PAIRS = [
    "a customer and a waiter", "a teacher and a nervous student", "two astronauts on a spaceship",
    "a detective and a witness", "a grandfather and his granddaughter", "a shopkeeper and a tourist",
    "two neighbours arguing about a fence", "a doctor and a patient", "a cat and a dog", "a job candidate and an interviewer",
    "two friends planning a holiday", "a librarian and a child", "a coach and a player after a lost match",
    "a robot and a human", "a ghost and a new homeowner", "a chef and a food critic",
]
L_DIALOGUE_TEMPLATES = [
    "Write a short dialogue between {p}.",
    "Write a funny conversation between {p}.",
    "Write a short scene for a play with {p}.",
]
L_PRODUCTS = [
    "a reusable water bottle", "a pair of wool socks", "a solar-powered phone charger", "a handmade ceramic mug",
    "a lightweight hiking backpack", "an ergonomic office chair", "a smart plant pot", "a noise-free desk fan",
    "a children's wooden puzzle", "a bamboo toothbrush", "a waterproof bluetooth speaker", "a travel pillow",
    "a bird feeder", "an electric kettle", "a notebook made of recycled paper", "a folding bicycle",
    "a set of kitchen knives", "a pair of running shoes", "a scented candle", "an umbrella that never turns inside out",
    "a board game for families", "a dog raincoat", "a cast-iron pan", "a reading lamp", "a picnic blanket",
]
L_PRODUCT_TEMPLATES = [
    "Write a short product description for {p}.",
    "Write a catchy advertisement of two sentences for {p}.",
    "Write three customer-review style sentences about {p}, one positive, one mixed, one negative.",
]
L_NAMING = [
    "a café that also sells books", "a cycling club", "a cleaning company", "a podcast about history",
    "a children's toy shop", "a yoga studio", "a food truck selling soup", "a gardening blog",
    "a small hotel by the sea", "a board-game café", "a dog-walking business", "a school science club",
]
L_NAMING_TEMPLATES = [
    "Suggest five names for {x}, with a one-line reason for each.",
    "Write a short slogan for {x}.",
]

L_EMAIL_PEOPLE: dict[str, list[str]] = {
    "my landlord": ["a leaking tap in the bathroom", "a late rent payment", "renewing my lease",
                    "noise from the flat upstairs", "getting my deposit back", "a broken washing machine"],
    "my manager": ["taking a day off next week", "a project that is running late", "working from home on Fridays",
                   "a mistake I made in a report", "asking for training", "my workload"],
    "a colleague": ["sharing notes from a meeting", "swapping shifts", "a thank-you for covering for me",
                    "a misunderstanding in a meeting", "planning a farewell lunch", "feedback on a draft"],
    "my child's teacher": ["an absence next Monday", "my child's homework troubles", "a school trip form",
                           "a question about the reading list", "a meeting at parents' evening", "a thank-you at the end of term"],
    "a customer": ["a delayed order", "a price change", "a refund they asked for", "a thank-you for their loyalty",
                   "a damaged delivery", "a new opening time"],
    "my neighbour": ["a party this Saturday", "a parcel I took in for them", "their tree over my fence",
                     "borrowing a ladder", "a lost cat", "a street clean-up day"],
    "a hotel": ["an early check-in", "a room with a view", "a booking I need to cancel", "a lost item",
                "a complaint about noise", "a special request for a birthday"],
    "my doctor's surgery": ["changing an appointment", "a repeat prescription", "test results",
                            "registering a new family member", "a question about a vaccine", "a mistake in my address"],
    "a university admissions office": ["a missing document", "deferring my place", "accommodation",
                                        "the application deadline", "an open day visit", "funding options"],
    "a local council": ["a broken streetlight", "bin collection days", "a pothole on my road",
                        "a parking permit", "noise from a building site", "a new bus stop"],
    "a supplier": ["a late delivery", "a new order", "an invoice error", "changing the delivery address",
                   "a discount for a larger order", "product samples"],
    "an old friend": ["meeting up after many years", "a wedding invitation", "congratulations on a new job",
                      "an apology for losing touch", "a shared memory", "visiting their city next month"],
    "a job applicant": ["an invitation to an interview", "a rejection after the interview", "a job offer",
                        "a request for references", "moving the interview date", "a second-round task"],
    "my sports club": ["cancelling my membership", "volunteering at an event", "a changed training time",
                       "a lost water bottle", "a fee I was charged twice", "joining the team for a tournament"],
}
L_EMAIL_TONES = ["polite", "friendly", "formal", "firm but polite", "apologetic", "warm", "short and clear"]
L_EMAIL_TEMPLATES = [
    "Write {tone} email to {who} about {what}.",
    "Help me write {tone} message to {who} about {what}.",
    "Draft {tone} letter to {who} regarding {what}.",
]

L_DESTINATIONS = [
    "Lisbon", "Kyoto", "Edinburgh", "Istanbul", "Vancouver", "Marrakech", "Prague", "Buenos Aires", "Seoul",
    "Cape Town", "Copenhagen", "Mexico City", "Hanoi", "Vienna", "Dublin", "Barcelona", "Singapore",
    "Budapest", "Reykjavik", "Sydney", "Krakow", "Montreal", "the Lake District", "the Amalfi Coast",
    "Crete", "the Scottish Highlands", "Bavaria", "Tuscany", "the Norwegian fjords", "Provence",
]
L_TRIP_TEMPLATES = [
    "Plan a 3-day trip to {d} for a first-time visitor.",
    "Plan a relaxed weekend in {d} on a small budget.",
    "Plan a 5-day family holiday in {d} with two young children.",
]
L_SHOPPING = [
    "a week of vegetarian dinners for two", "a children's birthday party", "a camping weekend", "a barbecue for ten people",
    "a first flat", "a new puppy", "a student on a tight budget", "a week of healthy lunches", "a picnic in the park",
    "baking a birthday cake", "a cosy movie night", "a family Sunday roast", "a new baby", "a home office",
    "starting to paint with watercolours", "a week of breakfasts", "a rainy weekend indoors", "a beach day",
    "a winter storm", "a dinner party for six",
]
L_SHOPPING_TEMPLATES = [
    "Make a shopping list for {x}.",
    "Make a shopping list for {x}, grouped by shop section.",
]
L_ROUTINES = [
    "a student with exams in a month", "someone starting to run three times a week", "learning Spanish in six months",
    "a family sharing housework", "a freelancer who works from home", "a new parent who needs more rest",
    "preparing a house for sale", "getting ready for a house move", "a person who wants to read more",
    "a small team launching a website", "a retiree who wants to stay active", "a teenager learning to cook",
    "a gardener planting in spring", "someone preparing for a job search", "a musician practising for a concert",
    "a weekly meal prep routine", "a clean and tidy kitchen", "a cheaper monthly budget", "writing a thesis",
    "a community bake sale",
]
L_ROUTINE_TEMPLATES = [
    "Make a weekly schedule for {x}.",
    "Create a checklist for {x}.",
]
L_PACKING = [
    "a week-long beach holiday", "a business trip of two nights", "a winter city break", "a music festival",
    "a school ski trip", "a long-haul flight with a toddler", "a cycling tour", "a wedding abroad",
    "a hospital stay", "a weekend at a friend's house", "a volunteering trip", "a first day at university",
]
L_CODE_TASKS = CODE_TASKS + [
    ("pig_latin(word)", "translates a single English word into Pig Latin"),
    ("caesar_cipher(text, shift)", "encrypts a text with a Caesar cipher, keeping spaces and punctuation"),
    ("most_common_letter(text)", "returns the letter that appears most often in a text, ignoring case"),
    ("title_case(s)", "converts a sentence to title case but keeps short words like 'and' and 'of' lowercase"),
    ("count_islands(grid)", "counts groups of connected 1s in a grid of 0s and 1s"),
    ("matrix_multiply(a, b)", "multiplies two matrices given as lists of lists"),
    ("moving_average(nums, k)", "returns the moving averages of a list over windows of size k"),
    ("find_pairs(nums, target)", "returns all pairs of numbers in a list that add up to a target"),
    ("longest_common_prefix(words)", "returns the longest prefix shared by all strings in a list"),
    ("roman_to_int(s)", "converts a Roman numeral to an integer"),
    ("int_to_roman(n)", "converts an integer between 1 and 3999 to a Roman numeral"),
    ("is_leap_year(year)", "checks whether a year is a leap year in the Gregorian calendar"),
    ("group_by_length(words)", "groups words into a dictionary keyed by their length"),
    ("parse_duration(text)", "turns a string like '1h 30m' into a number of minutes"),
    ("format_bytes(n)", "formats a number of bytes as a human-readable string such as '1.5 MB'"),
    ("slugify(title)", "turns a blog post title into a lowercase URL slug with hyphens"),
    ("validate_email(address)", "checks whether a string looks like a valid email address"),
    ("median(nums)", "returns the median of a list of numbers"),
    ("mode(nums)", "returns the most frequent value in a list of numbers"),
    ("prime_factors(n)", "returns the prime factors of a positive integer in ascending order"),
    ("primes_up_to(n)", "returns all prime numbers up to n using the sieve of Eratosthenes"),
    ("lcm(a, b)", "computes the least common multiple of two positive integers"),
    ("power_set(items)", "returns all subsets of a list"),
    ("permutations(s)", "returns all permutations of the characters of a short string"),
    ("binary_to_decimal(bits)", "converts a string of 0s and 1s into an integer without using int(bits, 2)"),
    ("decimal_to_binary(n)", "converts a non-negative integer into a binary string without using bin()"),
    ("count_words_in_file(path)", "counts the words in a text file"),
    ("top_k_words(text, k)", "returns the k most common words in a text"),
    ("zip_dicts(keys, values)", "builds a dictionary from a list of keys and a list of values"),
    ("invert_dict(d)", "swaps the keys and values of a dictionary, grouping keys that share a value"),
    ("deep_merge(a, b)", "merges two nested dictionaries, with values from b winning"),
    ("compress_spaces(s)", "replaces runs of whitespace in a string with a single space"),
    ("is_pangram(s)", "checks whether a sentence contains every letter of the alphabet"),
    ("spiral_order(matrix)", "returns the elements of a matrix in spiral order"),
    ("pascal_triangle(n)", "returns the first n rows of Pascal's triangle"),
    ("collatz_steps(n)", "counts how many steps the Collatz sequence takes to reach 1"),
    ("bubble_sort(nums)", "sorts a list of numbers with bubble sort"),
    ("insertion_sort(nums)", "sorts a list of numbers with insertion sort"),
    ("merge_sort(nums)", "sorts a list of numbers with merge sort"),
    ("quick_select(nums, k)", "returns the k-th smallest number in an unsorted list"),
    ("interleave(a, b)", "interleaves two lists, appending what is left of the longer one"),
    ("running_total(nums)", "returns the running totals of a list of numbers"),
    ("hamming_distance(a, b)", "counts the positions where two equal-length strings differ"),
    ("levenshtein(a, b)", "computes the edit distance between two strings"),
    ("time_to_seconds(hms)", "converts a time string 'HH:MM:SS' into a number of seconds"),
    ("weekday_name(date_string)", "returns the weekday name for a date given as 'YYYY-MM-DD'"),
    ("password_strength(pw)", "rates a password as weak, medium or strong using simple rules"),
    ("clamp(x, low, high)", "limits a number to a given range"),
    ("dedupe_emails(emails)", "removes duplicate email addresses, ignoring case"),
    ("split_sentences(text)", "splits a paragraph into sentences"),
]
L_CODE_TEMPLATES = [
    "Implement `{f}` in Python: it {d}.",
    "Write a Python function `{f}` that {d}. Add a docstring and three pytest tests.",
    "Write a JavaScript function `{js}` that {d}.",
    "I need a Python function `{f}` that {d}. Write it and explain its time and space complexity.",
    "Write a Python function `{f}` that {d}, then convert it to JavaScript.",
    "My Python function `{f}` should do this: it {d}. But it {bug}. What could be wrong, and how do I fix it?",
    "Write `{f}` in Python without any imports and explain each step. It {d}.",
    "Write a TypeScript function `{js}` with type annotations that {d}.",
    "Before writing any code, explain how you would design a function `{f}` that {d}. Then write it in Python.",
    "Write `{f}` in Python with type hints. The function {d}.",
    "Write a Python function `{f}` that {d}, and show what it returns for two example inputs.",
    "Write unit tests with the unittest module for a Python function `{f}` that {d}.",
]
L_CODE_BUGS = [
    "fails when the input is empty", "raises an IndexError on some inputs", "is very slow for large inputs",
    "returns None instead of the result", "gives a wrong answer for some edge cases",
    "works in the shell but fails inside my script", "gives an off-by-one result",
]
L_CODE_SNIPPETS = CODE_SNIPPETS + [
    "def count(words):\n    d = {}\n    for w in words:\n        if w in d:\n            d[w] = d[w] + 1\n        else:\n            d[w] = 1\n    return d",
    "def clean(xs):\n    out = []\n    for x in xs:\n        if x is not None and x != '':\n            out.append(x.strip())\n    return out",
    "with open('data.txt') as f:\n    lines = f.readlines()\nnumbers = [int(l) for l in lines if l.strip()]\nprint(sum(numbers) / len(numbers))",
    "def find(items, target):\n    for i in range(len(items)):\n        if items[i] == target:\n            return i\n    return -1",
    "const total = prices.reduce((sum, p) => sum + p, 0);\nconsole.log(total.toFixed(2));",
    "function debounce(fn, ms) {\n  let t;\n  return (...args) => {\n    clearTimeout(t);\n    t = setTimeout(() => fn(...args), ms);\n  };\n}",
    "const names = users.filter(u => u.active).map(u => u.name).sort();",
    "for (let i = 0; i < items.length; i++) {\n  if (items[i].price > 100) {\n    expensive.push(items[i]);\n  }\n}",
    "def grade(score):\n    if score >= 90:\n        return 'A'\n    elif score >= 80:\n        return 'B'\n    elif score >= 70:\n        return 'C'\n    return 'F'",
    "class Counter:\n    def __init__(self):\n        self.n = 0\n\n    def tick(self):\n        self.n += 1\n        return self.n",
    "def pairs(xs):\n    result = []\n    for i in range(len(xs)):\n        for j in range(i + 1, len(xs)):\n            result.append((xs[i], xs[j]))\n    return result",
    "import json\n\nwith open('config.json') as f:\n    config = json.load(f)\nport = config.get('port', 8080)",
    "def memo(fn):\n    cache = {}\n    def wrapper(n):\n        if n not in cache:\n            cache[n] = fn(n)\n        return cache[n]\n    return wrapper",
    "async function load(url) {\n  const res = await fetch(url);\n  if (!res.ok) throw new Error(res.status);\n  return res.json();\n}",
    "def chunks(xs, n):\n    return [xs[i:i + n] for i in range(0, len(xs), n)]",
    "words = text.split()\nlongest = ''\nfor w in words:\n    if len(w) > len(longest):\n        longest = w",
    "const byCity = {};\nfor (const p of people) {\n  (byCity[p.city] ||= []).push(p);\n}",
    "def safe_div(a, b):\n    try:\n        return a / b\n    except ZeroDivisionError:\n        return None",
    "from collections import Counter\nprint(Counter('mississippi').most_common(2))",
    "let s = '';\nfor (const c of text) {\n  s = c + s;\n}\nconsole.log(s);",
]
L_SNIPPET_TEMPLATES = [
    "What does this code do? Explain it line by line:\n\n{c}",
    "Refactor this code to make it shorter and clearer:\n\n{c}",
    "Add helpful comments to this code:\n\n{c}",
    "Is there a bug or an edge case this code misses?\n\n{c}",
    "Rewrite this {lang} code in {other}:\n\n{c}",
    "What is the time complexity of this code, and can it be improved?\n\n{c}",
]
L_CODE_CONCEPTS = [
    "Python decorators", "Python generators", "Python context managers", "list comprehensions in Python",
    "dictionary comprehensions in Python", "Python's *args and **kwargs", "Python dataclasses",
    "type hints in Python", "virtual environments in Python", "exceptions in Python", "lambda functions in Python",
    "the difference between `is` and `==` in Python", "mutable default arguments in Python", "Python's `with` statement",
    "f-strings in Python", "slicing in Python", "sets in Python", "the `enumerate` function in Python",
    "the `zip` function in Python", "recursion", "Big O notation", "hash tables", "binary search",
    "JavaScript promises", "async and await in JavaScript", "closures in JavaScript", "`let`, `const` and `var` in JavaScript",
    "arrow functions in JavaScript", "the JavaScript event loop", "destructuring in JavaScript",
    "array methods like map, filter and reduce in JavaScript", "`==` versus `===` in JavaScript",
    "JSON", "regular expressions", "unit testing", "git branches", "environment variables",
    "REST APIs", "SQL joins", "database indexes", "pure functions", "immutability",
    "object-oriented programming", "inheritance versus composition", "caching",
]
L_CONCEPT_TEMPLATES = [
    "Explain {c} with a short example.",
    "When is it a good idea to use {c}, and when is it not?",
    "What mistakes do beginners make with {c}?",
]
L_SQL_TASKS = [
    "lists all customers who placed an order in the last 30 days",
    "finds the average price of products in each category",
    "counts how many employees work in each department",
    "returns the three most recent blog posts with their authors",
    "finds users who have never logged in",
    "lists the ten best-selling products this year",
    "finds duplicate email addresses in a users table",
    "returns each student's highest exam score",
    "calculates total sales per month",
    "deletes sessions that are older than one week",
    "finds orders whose total is above the average order total",
    "lists books together with the name of their author",
]
L_SHELL_TASKS = [
    "finds all files larger than 100 MB in my home folder",
    "renames every .jpeg file in a folder to .jpg",
    "shows the ten largest folders in the current directory",
    "counts how many times each IP address appears in a log file",
    "deletes empty folders inside a directory",
    "backs up a folder into a dated .tar.gz archive",
    "prints the lines that two text files have in common",
    "replaces a word in all Markdown files of a project",
]
L_PASSAGES = [
    "A village in the hills has opened its first shared workshop. Residents can borrow tools such as drills, "
    "saws and sewing machines for a small yearly fee. Volunteers run short repair classes on Saturday mornings, "
    "and the organisers say fewer broken items are now thrown away.",
    "After a dry winter, farmers in the valley are switching some fields from maize to crops that need less "
    "water, such as sorghum and chickpeas. The change is risky, because buyers for the new crops are still "
    "scarce, but the farmers hope it will protect their income if dry years become common.",
    "A hospital has replaced its paper visitor cards with a simple text-message system. Families receive a "
    "message when a patient can receive visitors and when they return from tests. Staff say the phones at the "
    "front desk ring far less often than before.",
    "The city zoo has moved its two elderly elephants to a sanctuary with much more space. Keepers say the "
    "animals needed larger grounds and the company of a bigger herd. The zoo will use the old enclosure for a "
    "new exhibit about local wildlife.",
    "A secondary school has started a club where older students teach younger ones to code. The club meets "
    "twice a week after lessons and has built a small website for the school library. Teachers say the older "
    "students have become more confident too.",
    "Heavy rain closed the coastal road for three days last week. Engineers found that part of the cliff had "
    "moved, and the road will stay open only to cars until repairs are finished. Buses will take a longer "
    "inland route for at least two months.",
    "A supermarket chain has stopped selling fruit and vegetables in plastic packaging in ten of its stores. "
    "Customers bring their own bags or use paper ones at the counter. The company will decide in the autumn "
    "whether to extend the trial to all of its shops.",
    "Researchers asked two hundred office workers to take a ten-minute walk after lunch for one month. Most "
    "said they felt less tired in the afternoon, and many kept walking after the study ended. The researchers "
    "now want to test the effect over a whole year.",
    "An old cinema that had been closed for fifteen years reopened this weekend after a long fundraising "
    "campaign. Local people donated money for new seats and a modern projector. The first film sold out within "
    "an hour.",
    "A small island has replaced its diesel generator with wind turbines and a large battery. Electricity "
    "bills have fallen, and the island now keeps the diesel generator only as a backup. Other islands in the "
    "region have sent engineers to learn from the project.",
    "The national park has introduced a booking system for its most popular hiking trail. Walkers now reserve "
    "a time slot online, which the park says reduces crowding and damage to the path. Some regular visitors "
    "dislike having to plan ahead.",
    "A retired teacher has started a free homework café in the town hall. Children can come after school to "
    "get help with maths and reading, and parents can join them. The café now has twelve volunteer tutors.",
    "A start-up is testing drones to deliver medicines to farms far from the nearest pharmacy. Each flight "
    "takes about twenty minutes instead of a two-hour drive. Regulators will review the safety data before "
    "allowing more flights.",
    "The town's market moved from a car park to the main square this summer. Stall holders report more "
    "customers, especially in the evenings, while nearby cafés have added outdoor tables. The council plans "
    "to keep the market in the square permanently.",
    "A football club has made all its home matches free for children under twelve. The club hopes to build a "
    "new generation of fans and to fill empty seats. Attendance has risen by a fifth since the start of the "
    "season.",
    "A survey of cyclists found that most feel unsafe at three large roundabouts in the city. The council has "
    "promised to redesign the first roundabout next year with separate lanes for bicycles. Cycling groups "
    "welcomed the plan but want a faster timetable.",
    "A company that makes outdoor clothing now repairs its jackets for free for the first five years. "
    "Customers send the damaged item by post and receive it back within two weeks. The firm says repairs cost "
    "less than it expected.",
    "A group of students designed a cheap sensor that warns when a river is about to flood. The sensor sends "
    "a message to phones in nearby streets. Two villages have installed it and plan to share the results with "
    "emergency services.",
    "A library in a busy neighbourhood now lends more than books: musical instruments, board games and even "
    "gardening tools. Staff say young families use the new service most. The library is asking for donations "
    "of instruments that people no longer play.",
    "An airline has started weighing cabin bags at the gate, and passengers with heavy bags must pay extra. "
    "The airline says the rule speeds up boarding. Travellers' groups say the fees are unclear and should be "
    "shown when tickets are bought.",
    "A care home invited pupils from a nearby primary school to visit every Friday. The children read stories "
    "and play board games with the residents. Staff say residents look forward to the visits all week.",
    "A city has planted wildflowers along the edges of its main roads instead of mowing the grass. The "
    "flowers attract bees and butterflies and save money on maintenance. Some drivers say the verges look "
    "untidy in late summer.",
    "A theatre company has begun performing short plays in empty shops. Tickets are cheap and each show lasts "
    "about forty minutes. The company says it reaches people who have never been to a theatre before.",
    "Engineers have finished repairing a two-hundred-year-old stone bridge. They used lime mortar like the "
    "original builders instead of modern cement, so the stones can move slightly without cracking. The bridge "
    "reopened to walkers and cyclists on Monday.",
    "A mobile phone company will stop supporting its oldest network at the end of the year. Customers with "
    "very old phones will need new ones to make calls. The company is offering free replacement phones to "
    "older customers who ask for them.",
    "A bakery has started selling yesterday's bread at half price in the early morning. The owner says less "
    "bread is thrown away and new customers have discovered the shop. Other bakeries in the street are "
    "considering the same idea.",
    "The local swimming pool has added a quiet session every Sunday morning with softer lights, no music and "
    "fewer swimmers. The session was first planned for people who find noise difficult, but it has become "
    "popular with many other visitors.",
    "A farming cooperative has built a shared cold store so that its members can keep fruit fresh for longer. "
    "Before, many farmers had to sell their harvest at once at low prices. Now they can wait for better "
    "prices later in the season.",
]
L_PASSAGE_TEMPLATES = [
    "Summarise this in one sentence:\n\n{p}",
    "Give me three bullet points that capture the main ideas of this text:\n\n{p}",
    "Rewrite this for a young reader:\n\n{p}",
    "Write a catchy headline for this story:\n\n{p}",
    "Rewrite this passage in a more formal tone:\n\n{p}",
    "What is the main point of this text? Answer in one sentence.\n\n{p}",
    "Summarise this text in under twenty words:\n\n{p}",
    "Turn this news story into a short social media post:\n\n{p}",
    "Who is affected by the events in this text, and how?\n\n{p}",
    "Write two questions a reader might ask after reading this, and answer them from the text:\n\n{p}",
]
L_REWRITE_SENTENCES = [
    "hey can u send me the report by tmrw thx",
    "The meeting was cancelled due to the fact that the majority of the participants were unable to attend.",
    "me and him goes to the gym every days after work",
    "We regret to inform you that your application has not been successful at this time.",
    "The product is good and it is also cheap and it is also easy to use.",
    "I think that maybe we should perhaps consider possibly changing the plan.",
    "Due to unforeseen circumstances, the library will be closed until further notice.",
    "Their going to the park later but they dont know were it is.",
    "In my opinion I personally believe that the new policy is a bad idea.",
    "The new software update makes the app faster and fixes several bugs that users reported.",
    "Please be advised that the car park will be unavailable for the duration of the works.",
    "The dog, which was brown, ran quickly across the big green field that was near the house.",
    "Its important to drink water, it helps you concentrate, also it is good for your skin.",
    "Our team has achieved record sales this quarter thanks to everyone's hard work.",
    "The results of the experiment were not what had been expected by the researchers.",
    "Can you not leave your dishes in the sink every single day please.",
    "The train was late again so I missed the start of my exam.",
    "We are excited to announce the opening of our second shop in the city centre.",
    "Customers who have purchased tickets in advance may proceed directly to the entrance.",
    "I was wondering if it would be at all possible for you to call me back at some point.",
    "The weather was bad, we stayed inside, we played cards all afternoon.",
    "Thank you so much for the lovely flowers, they really made my week.",
    "The committee has made the decision to postpone the event.",
    "Our flat is small but it gets lots of light and the neighbours are friendly.",
    "Unfortunately, the item you ordered is currently out of stock.",
    "He don't like vegetables but he eat them anyway because his mum says.",
    "The instructions were confusing and I had to read them three times.",
    "We would appreciate it if you could respond at your earliest convenience.",
    "The festival brings together musicians, artists and food sellers from all over the region.",
    "i cant come to the party sorry, work is crazy this week",
    "The new bus timetable will come into effect from the first of next month.",
    "She ran fast. She won the race. She was very happy.",
]
L_REWRITE_TEMPLATES = [
    "Rewrite this sentence in a formal tone: {s}",
    "Make this sentence simpler and shorter: {s}",
    "Correct the grammar and spelling in this sentence: {s}",
    "Rewrite this sentence so it sounds friendlier: {s}",
    "Give me three different ways to say this: {s}",
]
L_TRANSLATE_SENTENCES = [
    "The museum opens at ten in the morning.", "My sister is learning to play the violin.",
    "Could you tell me how much this jacket costs?", "We missed the last bus and had to walk home.",
    "The soup is too hot to eat right now.", "I have lived here since I was a child.",
    "Do you know a good restaurant near the river?", "The children are building a snowman in the garden.",
    "Please turn off the lights when you leave.", "It has been raining all week.",
    "My phone battery is almost empty.", "He reads the newspaper every morning with his coffee.",
    "The doctor told me to rest for a few days.", "We are planning a picnic for Sunday afternoon.",
    "I forgot my umbrella at the office.", "The shop on the corner sells fresh bread.",
    "How long does it take to get to the airport?", "She speaks three languages fluently.",
    "Our train leaves in twenty minutes.", "This is the best cake I have ever eaten.",
    "Can I pay by card?", "The library is closed on public holidays.",
    "My grandparents live in a small village by the sea.", "Would you like to come to dinner on Friday?",
    "I need to buy a present for my friend's birthday.", "The film was longer than I expected.",
    "Turn left at the traffic lights and then go straight on.", "We stayed in a hotel with a view of the mountains.",
    "I am sorry, I did not hear what you said.", "The cat likes to sleep on the windowsill.",
    "Our teacher gave us a lot of homework today.", "The concert starts at half past seven.",
    "I would like to book a room for two nights.", "The river flooded after the storm.",
    "Please speak more slowly.", "My favourite season is autumn.",
    "Is there a pharmacy open at this time?", "They moved to a new flat last month.",
    "The garden is full of flowers in spring.", "I usually walk to work when the weather is good.",
    "What time does the next ferry leave?", "We celebrated my father's sixtieth birthday yesterday.",
    "The bakery sells out of croissants very early.", "I left my keys on the kitchen table.",
    "This road is closed because of repairs.", "Thank you for your help with the move.",
]
L_LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch"]
L_TRANSLATE_TEMPLATES = [
    "Translate into {lang}: {s}",
    "How would I say \"{s}\" in {lang}?",
    "Translate this sentence into {lang}:\n\n{s}",
    "Please translate into {lang} and explain any tricky words: {s}",
]
L_NAMES = ["Amira", "Ben", "Chloe", "Daniel", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Keiko", "Liam",
           "Maya", "Noah", "Olga", "Pedro", "Rosa", "Samir", "Tara", "Yusuf"]
L_SHOP_ITEMS = ["notebooks", "bottles of juice", "bags of rice", "pairs of socks", "plant pots", "packs of batteries",
                "cinema tickets", "tins of paint", "loaves of bread", "boxes of tea"]
L_INGREDIENTS = ["flour", "sugar", "butter", "rice", "oats", "cheese"]
L_DISHES = ["pancakes", "a vegetable curry", "a fruit crumble", "a risotto", "flapjacks", "a cheese pie"]
L_MATH_SUFFIXES = ["", " Explain step by step.", " Show your working.", " Explain your reasoning briefly."]


def large_math_prompts(rng: random.Random, count: int) -> list[str]:
    """Word problems of twelve kinds, numbers drawn from rng; distinct, in the order drawn."""
    seen: set[str] = set()
    prompts: list[str] = []
    while len(prompts) < count:
        kind, name = rng.randrange(12), rng.choice(L_NAMES)
        end = rng.choice(L_MATH_SUFFIXES)
        if kind == 0:
            n, price, off = rng.randint(3, 24), rng.randint(2, 15), rng.choice([10, 15, 20, 25, 30, 50])
            text = (f"{name} buys {n} {rng.choice(L_SHOP_ITEMS)} at ${price} each. The shop takes {off}% off "
                    f"the total. How much does {name} pay?")
        elif kind == 1:
            minutes = rng.choice([20, 30, 40, 45, 50, 75, 80, 90, 100, 120])
            speed = rng.choice([v for v in (12, 15, 18, 20, 24, 30, 36) if v * minutes % 60 == 0])
            text = (f"A cyclist rides {speed * minutes // 60} km at a steady {speed} km/h. How many minutes does "
                    f"the ride take?")
        elif kind == 2:
            friends, sweets = rng.randint(3, 9), rng.randint(20, 95)
            text = (f"{name} shares {sweets} sweets equally among {friends} friends. How many does each friend "
                    f"get, and how many are left over?")
        elif kind == 3:
            pct, base = rng.choice([5, 10, 12, 15, 20, 25, 30, 40, 60, 75]), rng.randint(4, 60) * 20
            text = f"What is {pct}% of {base}? Explain how you worked it out."
            end = ""
        elif kind == 4:
            length, width = rng.randint(6, 40), rng.randint(3, 25)
            text = (f"A garden is {length} m long and {width} m wide. How much fencing is needed to go all the "
                    f"way around it, and what is its area?")
        elif kind == 5:
            child, gap = rng.randint(4, 15), rng.randint(22, 40)
            text = (f"{name} is {child} years old and {name}'s mother is {gap} years older. In how many years "
                    f"will the mother be exactly twice as old as {name}?")
        elif kind == 6:
            principal, rate, years = rng.randint(5, 60) * 100, rng.choice([2, 3, 4, 5, 6]), rng.randint(2, 8)
            text = (f"{name} puts ${principal} into a savings account that pays {rate}% simple interest a year. "
                    f"How much interest is earned after {years} years?")
        elif kind == 7:
            serves, grams = rng.choice([2, 4, 6]), rng.choice([100, 150, 200, 240, 300, 360])
            people = rng.choice([x for x in (3, 5, 8, 9, 10, 12) if x != serves])
            text = (f"A recipe for {rng.choice(L_DISHES)} for {serves} people needs {grams} g of "
                    f"{rng.choice(L_INGREDIENTS)}. How much is needed for {people} people?")
        elif kind == 8:
            a, b = rng.choice([(2, 3), (3, 6), (4, 12), (6, 3), (5, 20), (10, 15), (4, 6), (12, 6)])
            job = rng.choice(["paint a fence", "fill a pool", "sort a pile of letters", "clear a garden"])
            text = (f"One person can {job} in {a} hours and another can do it in {b} hours. How long does it "
                    f"take if they work together?")
        elif kind == 9:
            a, x, b = rng.randint(2, 12), rng.randint(2, 20), rng.randint(1, 30)
            text = f"Solve for x: {a}x - {b} = {a * x - b}."
            end = rng.choice([" Show your working.", " Check your answer by substituting it back."])
        elif kind == 10:
            values = [rng.randint(8, 30) for _ in range(rng.randint(4, 7))]
            listed = ", ".join(f"{v}" for v in values[:-1]) + f" and {values[-1]}"
            text = (f"The midday temperatures over {len(values)} days were {listed} degrees Celsius. What was "
                    f"the average temperature?")
        else:
            hour, minute, length = rng.randint(13, 21), rng.choice([0, 5, 15, 20, 30, 40, 45, 50]), rng.randint(85, 170)
            text = (f"A film starts at {hour}:{minute:02d} and lasts {length} minutes. At what time does it end?")
        text += end
        if text not in seen:
            seen.add(text)
            prompts.append(text)
    return prompts


def _normalise(text: str) -> str:
    return " ".join(text.lower().split())


def eval_prompts(root: Path) -> list[str]:
    """Every prompt text of the eval suites, the calibration set and the benchmark scripts' PROMPTS."""
    import ast

    texts: list[str] = []
    data = root / "mars_cli" / "data"
    for path in sorted((data / "suites").glob("*.jsonl")) + [data / "calibration_prompts.jsonl"]:
        for line in filter(str.strip, path.read_text().splitlines()):
            record = json.loads(line)
            texts += record.get("turns") or [record["prompt"]]  # multi-turn suites: every turn
    for script in ("bench_decoding.py", "bench_gpu.py"):
        tree = ast.parse((root / "benchmarks" / script).read_text())
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "PROMPTS" for t in node.targets):
                texts += list(ast.literal_eval(node.value).values())
    return texts


def _camel(signature: str) -> str:
    name, _, rest = signature.partition("(")
    head, *tail = name.split("_")
    return head + "".join(w.capitalize() for w in tail) + "(" + rest


def large_rows(seed: int, skip_functions: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """Every generated (category, prompt) of the large set, before dedupe and exclusion; code tasks
    whose function name is in skip_functions are left out."""
    rng = random.Random(seed)
    rows: list[tuple[str, str]] = []
    for topics, templates in L_DOMAINS.values():
        for topic in topics:
            chosen = rng.sample(L_GENERIC_TEMPLATES, 4) + templates
            rows += [("chat", _fill_topic(t, topic)) for t in chosen]
    rows += [("chat", t.format(a=a)) for a in L_ACTIVITIES for t in L_ACTIVITY_TEMPLATES]
    rows += [("chat", t.format(x=x, y=y)) for x, y in L_COMPARE_PAIRS for t in L_COMPARE_TEMPLATES]
    rows += [("chat", q) for q in L_QUESTIONS]
    rows += [("chat", t.format(w=w)) for w in L_WORDS for t in L_WORD_TEMPLATES]

    rows += [("creative", t.format(s=s)) for s in L_STORY_SUBJECTS for t in L_STORY_TEMPLATES]
    rows += [("creative", t.format(s=s)) for s in L_POEM_SUBJECTS for t in L_POEM_TEMPLATES]
    rows += [("creative", t.format(p=p)) for p in L_DIALOGUE_PAIRS for t in L_DIALOGUE_TEMPLATES]
    rows += [("creative", t.format(p=p)) for p in L_PRODUCTS for t in L_PRODUCT_TEMPLATES]
    rows += [("creative", t.format(x=x)) for x in L_NAMING for t in L_NAMING_TEMPLATES]

    for who, subjects in L_EMAIL_PEOPLE.items():
        for what in subjects:
            tones = rng.sample(L_EMAIL_TONES, 3)
            for tone, template in zip(tones, rng.sample(L_EMAIL_TEMPLATES, 3)):
                rows.append(("email", template.format(tone=_article(tone), who=who, what=what)))

    rows += [("plan", t.format(d=d)) for d in L_DESTINATIONS for t in L_TRIP_TEMPLATES]
    rows += [("plan", t.format(x=x)) for x in L_SHOPPING for t in L_SHOPPING_TEMPLATES]
    rows += [("plan", t.format(x=x)) for x in L_ROUTINES for t in L_ROUTINE_TEMPLATES]
    rows += [("plan", f"Make a packing list for {x}.") for x in L_PACKING]

    for f, d in L_CODE_TASKS:
        if f.partition("(")[0] in skip_functions:
            continue
        for t in L_CODE_TEMPLATES:
            rows.append(("code", t.format(f=f, d=d, js=_camel(f), bug=rng.choice(L_CODE_BUGS))))
    for c in L_CODE_SNIPPETS:
        js = any(mark in c for mark in ("const ", "let ", "function", "console.", "=>"))
        lang, other = ("JavaScript", "Python") if js else ("Python", "JavaScript")
        rows += [("code", t.format(c=c, lang=lang, other=other)) for t in L_SNIPPET_TEMPLATES]
    rows += [("code", t.format(c=c)) for c in L_CODE_CONCEPTS for t in L_CONCEPT_TEMPLATES]
    rows += [("code", f"Write a SQL query that {x}.") for x in L_SQL_TASKS]
    rows += [("code", f"Write a SQL query that {x}, and explain each clause.") for x in L_SQL_TASKS]
    rows += [("code", f"Write a bash command that {x}.") for x in L_SHELL_TASKS]
    rows += [("code", f"Write a short shell script with comments that {x}.") for x in L_SHELL_TASKS]

    rows += [("summarize", t.format(p=p)) for p in L_PASSAGES for t in L_PASSAGE_TEMPLATES]
    rows += [("summarize", t.format(s=s)) for s in L_REWRITE_SENTENCES for t in L_REWRITE_TEMPLATES]
    for s in L_TRANSLATE_SENTENCES:
        for lang in L_LANGUAGES:
            rows.append(("translate", rng.choice(L_TRANSLATE_TEMPLATES).format(lang=lang, s=s)))
    rows += [("math", p) for p in large_math_prompts(rng, 900)]
    return rows


def build_large(seed: int = 2027) -> list[dict]:
    """The large set: distinct prompts, none equal to or containing an eval, calibration or benchmark
    prompt (or its passage), none equal to a prompt of the 638-prompt set; shuffled with seed."""
    root = Path(__file__).resolve().parents[2]
    banned: set[str] = set()
    for text in eval_prompts(root):
        banned.add(_normalise(text))
        for sep in ("\n\n", ": "):  # the passage or sentence inside "Summarize ...\n\n<text>", "Translate into X: <text>"
            _, found, body = text.partition(sep)
            if found and len(body) >= 20:
                banned.add(_normalise(body))
    old = {_normalise(row["prompt"]) for row in build()}
    # Code tasks named like a code-suite entry point (reused from CODE_TASKS) would be near-copies of
    # eval prompts, so the large set leaves them out entirely.
    suite = root / "mars_cli" / "data" / "suites" / "code.jsonl"
    entry_points = frozenset(json.loads(line)["entry_point"] for line in suite.read_text().splitlines() if line.strip())
    skipped = sorted(f for f, _ in L_CODE_TASKS if f.partition("(")[0] in entry_points)
    print(f"left out {len(skipped)} code tasks named like code-suite entry points: {', '.join(skipped)}")
    seen: set[str] = set()
    kept: list[tuple[str, str]] = []
    duplicates = eval_dropped = old_dropped = 0
    for category, text in large_rows(seed, entry_points):
        key = _normalise(text)
        if text in seen:
            duplicates += 1
        elif any(b in key for b in banned):
            eval_dropped += 1
        elif key in old:
            old_dropped += 1
        else:
            seen.add(text)
            kept.append((category, text))
    print(f"dropped {duplicates} duplicates, {eval_dropped} equal to or containing an eval/benchmark/calibration "
          f"prompt, {old_dropped} equal to a prompt of the old set")
    random.Random(seed).shuffle(kept)
    return [{"id": f"headL-{i:05d}", "category": c, "prompt": t} for i, (c, t) in enumerate(kept)]




# =================================================================================================
# `varied` (step 12): follow-ups over the target's own answers, role-play, word problems,
# everyday questions, Python standard-library questions
# =================================================================================================

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
    for record in answer_records(answers, "head_prompts_large.jsonl"):
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




# =================================================================================================
# `styles` (step 13): the suites' styles, never their content
# =================================================================================================

Row = tuple[str, object]  # (category, prompt text or messages list)

# --- chat: (fillers, templates) per intent; every filler reads well in every template of its intent.
WAYS = [
    "eat more vegetables", "get more exercise at a desk job", "sleep better on hot nights", "reduce stress after work",
    "cut down on sugar", "walk more every day", "look after my eyes when I use screens a lot", "save money on groceries",
    "spend less on takeaway food", "keep track of small expenses", "save up for a holiday", "lower my electricity bill",
    "avoid impulse shopping online", "keep my flat tidy", "make a small bedroom feel bigger", "reduce food waste at home",
    "keep my house warm in winter", "get rid of clutter", "stay focused when working from home",
    "take better notes in meetings", "stop putting things off", "get to know my new colleagues",
    "organise my email inbox", "remember new vocabulary", "make revision less boring", "help my child with homework",
    "get started with drawing", "find more time to read", "practise a new language every day", "get into running",
    "pack lighter for a trip", "stay comfortable on a long flight", "save money when travelling",
    "attract birds to my garden", "spend more time outdoors", "help bees in my garden",
    "make my phone battery last longer", "keep my passwords safe", "spend less time on my phone", "back up my photos",
    "make a salad more filling", "use up leftover rice", "cook healthy meals cheaply", "stay in touch with old friends",
    "make new friends in a new town", "spend more time with my family", "become a better listener",
]
WAYS_TEMPLATES = ["What are some easy ways to {x}?", "What are a few simple ways to {x}?",
                  "How can I {x}? Give me some easy ideas.", "I want to {x}. What are some easy ways to start?"]
HELPS = [
    "a warm-up before exercise", "a balanced diet", "a regular sleep schedule", "sunscreen", "a first-aid kit",
    "an emergency fund", "a savings account", "a shopping list", "a pension", "a smoke alarm", "double glazing",
    "a compost bin", "a to-do list", "a mentoring scheme at work", "a study timetable", "a mind map", "a flashcard",
    "a password manager", "two-factor authentication", "a software update", "a backup of your files",
    "a bird feeder", "a nature reserve", "a meal plan", "a slow cooker", "a food thermometer", "travel insurance",
    "a packing list", "active listening", "a weekly family meeting",
]
HELPS_TEMPLATES = ["Explain what {x} is and why it helps, in simple words.",
                   "What is {x}, and why is it useful? Answer in simple words.",
                   "In plain language, what is {x} and how does it help?", "Explain what {x} is and why people use it."]
RELATIONS = {"friend": None, "best friend": None, "colleague": None, "neighbour": None, "flatmate": None,
             "cousin": None, "brother": "he", "sister": "she", "aunt": "she", "uncle": "he"}  # relation: its pronoun
PRONOUNS = {None: {"they": "they", "them": "them", "their": "their"}, "he": {"they": "he", "them": "him", "their": "his"},
            "she": {"they": "she", "them": "her", "their": "her"}}
HARD_NEWS = [  # after "My <relation>"; only past-tense verbs follow {they}, so "they" and "she" agree alike
    "is nervous about a job interview tomorrow", "is sad because {their} dog is very ill", "is stressed about moving house",
    "is upset because {they} failed {their} driving test", "is worried about an exam next week",
    "has felt lonely since moving to a new city", "is disappointed that {their} holiday was cancelled",
    "is anxious about starting a new job", "is feeling down after a break-up",
    "is exhausted because {their} new baby does not sleep",
    "is frustrated that {their} team lost the final", "is worried about money this month",
    "is in hospital after a small operation", "has just lost {their} job",
]
HARD_TEMPLATES = ["My {p} {x}. What could I say to {them}?", "My {p} {x}. How can I support {them}?",
                  "My {p} {x}. What is a kind thing I could say?", "My {p} {x}. Should I say something, and if so, what?"]
GOOD_NEWS = [
    "has just passed {their} driving test", "is getting married next month", "has just finished {their} first marathon",
    "is about to retire after thirty years at work", "has just moved into {their} first home",
    "got into the university {they} wanted", "has just become a grandparent",
]
GOOD_TEMPLATES = ["My {p} {x}. What could I say to congratulate {them}?", "My {p} {x}. What could I write in a card for {them}?"]
ROUTINES = [
    "the last hour before bed", "a lazy Sunday morning", "studying after school", "keeping a small flat clean",
    "looking after a new puppy", "the first week at a new job", "a day of working from home",
    "staying active during a long winter", "looking after houseplants", "the evening before a big exam",
    "getting children ready for school", "caring for my skin in cold weather", "a weekly clean of the house",
    "checking my spending once a month", "practising the piano every day", "a short workout at home",
]
ROUTINE_TEMPLATES = ["What is a good routine for {x}?", "Suggest a simple routine for {x}.",
                     "Can you describe a good routine for {x}? Keep it short."]
MACHINES = [  # singular, so "{x} works" agrees
    "a fridge", "a microwave oven", "a thermostat", "a dishwasher", "a smoke alarm", "a vacuum cleaner",
    "a contactless card payment", "an electric kettle", "a solar panel", "a heat pump", "a compass", "a wind turbine",
    "a sewing machine", "a touchscreen", "Wi-Fi", "a GPS receiver", "a QR code", "a search engine", "a toaster",
    "a pressure cooker", "a hot-air balloon", "a lift", "a zip", "a traffic light", "a camera", "an espresso machine",
    "a step counter", "a washing machine", "a bank transfer", "a doorbell camera",
]
MACHINE_TEMPLATES = ["Describe how {x} works, briefly.", "How does {x} work? Keep it short.",
                     "In a few sentences, describe how {x} works.",
                     "Briefly explain how {x} works to someone who is not technical."]
IDEAS = [
    "a cheap birthday present for my dad", "a healthy lunch I can take to work", "a weekend hobby that costs little",
    "a fun family evening at home", "a small garden on a balcony", "a theme for a children's party",
    "a day trip by train", "a meal with leftover vegetables", "a team lunch at work", "a school science project",
    "decorating a small bedroom", "a relaxing evening at home", "keeping a teenager busy in the summer holidays",
    "a cosy winter evening", "a gift for a new neighbour", "a quick breakfast on busy mornings", "using old jam jars",
    "a reading challenge for the year", "a fundraising event at school", "a first camping trip",
    "a screen-free afternoon with my kids", "a short speech at a friend's wedding",
]
IDEA_TEMPLATES = ["Give me {n} ideas for {x}.", "Can you suggest {n} ideas for {x}?",
                  "I need {n} ideas for {x}. Keep each one to one sentence.", "List {n} ideas for {x}, with one line on each."]
WHYS = [  # "Why {q}?"
    "do cats sleep so much", "does bread rise in the oven", "do we dream", "is the sky blue",
    "do we feel sleepy after a big lunch", "does coffee taste bitter", "do dogs sniff everything", "do prices go up over time",
    "do banks pay interest on savings", "do people feel homesick", "does music help some people concentrate",
    "do phones get slower as they get older", "do birds migrate", "is it harder to sleep when it is hot",
    "do some people get car sick", "do we forget our dreams so quickly", "does food taste bland when we have a cold",
    "do cities feel warmer than the countryside", "do babies sleep so much", "is walking good for the heart",
    "do people get nervous before speaking in public", "does salt melt ice on roads", "do teenagers like to sleep late",
    "do flights cost more in the summer", "does bread go mouldy", "do we need vitamins", "do cats bring home mice",
    "do some plants close their flowers at night",
]
WHY_TEMPLATES = ["Why {x}?", "Why {x}? Explain briefly.", "Why {x}? Answer in a few sentences."]
TIPS = [
    "writing a good cover letter", "running a short meeting", "taking better photos with a phone", "keeping a plant alive",
    "speaking in public", "packing a suitcase", "starting a vegetable garden", "making friends at university",
    "cooking rice well", "staying calm in traffic", "sleeping on a plane", "saving for a first home",
    "writing a thank-you card", "learning to touch-type", "keeping a tidy desk", "choosing a good pair of walking shoes",
]
TIP_TEMPLATES = ["Give three tips for {x}.", "What are your best tips for {x}?", "Give me a few short tips for {x}."]
BENEFITS = [
    "walking to work", "learning a second language", "keeping a diary", "cooking at home", "having a pet", "volunteering",
    "getting up early", "spending time in nature", "taking short breaks at work", "playing board games with family",
    "learning to swim", "planning meals for the week", "doing puzzles", "growing your own herbs",
    "taking the train instead of flying", "saving a little every month",
]
BENEFIT_TEMPLATES = ["What are the benefits of {x}?", "Why is {x} good for you? Name a few benefits.",
                     "What are the main benefits of {x}, in short?"]
GOOD_THINGS = [
    "neighbour", "teacher", "flatmate", "friend", "doctor", "holiday", "cup of tea", "birthday party", "bedtime story",
    "presentation", "password", "salad", "study space", "manager", "first impression", "restaurant",
]
GOOD_THING_TEMPLATES = ["What makes a good {x}?", "In your view, what makes a good {x}? Give a few points."]
MISHAPS = [
    "my phone gets wet", "I lock myself out of my flat", "I miss my train", "I burn my hand while cooking",
    "I forget a friend's birthday", "my laptop will not turn on", "a colleague takes credit for my work",
    "I lose my wallet on holiday", "my dog eats chocolate", "I feel dizzy after standing up",
    "my neighbour plays loud music at night", "I get lost while hiking", "my houseplant is dying",
    "I spill coffee on my keyboard", "my child has a high temperature at night",
]
MISHAP_TEMPLATES = ["What should I do if {x}?", "What is the first thing to do if {x}?"]
ASKING = [
    "renting a flat", "choosing a school for my child", "meeting a new doctor", "adopting a cat", "hiring a plumber",
    "joining a gym", "buying a second-hand phone", "starting a new job", "booking a holiday cottage",
    "choosing a bank account",
]
ASKING_TEMPLATES = ["What questions should I ask when {x}?", "Which questions are worth asking when {x}?"]
SKILLS = [
    "swim", "bake bread", "draw portraits", "speak basic Spanish", "type faster", "juggle", "knit", "run five kilometres",
    "play chess", "code in Python", "sing in tune", "play the piano", "cook simple Indian dishes", "do a handstand",
]
SKILL_TEMPLATES = ["Suggest a simple weekly plan for learning to {x}.",
                   "How could I learn to {x} in a month? Give me a simple plan."]

# --- functions: (signature, what it does after "that", what not to use or None)
TASKS: list[tuple[str, str, str | None]] = [
    # strings
    ("reverse_words(s)", "returns the words of a sentence in reverse order", None),
    ("count_consonants(s)", "returns how many consonants are in s, ignoring case", None),
    ("is_anagram(a, b)", "returns True if the two strings use exactly the same letters, ignoring spaces and case", "sorted()"),
    ("word_frequencies(text)", "returns a dictionary mapping each lowercase word to how many times it appears",
     "collections.Counter"),
    ("remove_spaces(s)", "returns s with all spaces removed", "str.replace()"),
    ("count_uppercase(s)", "returns how many uppercase letters are in s", None),
    ("first_repeated_char(s)", "returns the first character that appears twice in s, or None if there is none", None),
    ("first_unique_char(s)", "returns the first character that appears only once in s, or None", None),
    ("compress_runs(s)",
     "turns runs of the same character into the character followed by the count, so 'aaab' gives 'a3b1'", None),
    ("is_pangram(s)", "returns True if s contains every letter of the English alphabet at least once", None),
    ("caesar_shift(s, k)", "shifts every lowercase letter in s by k places in the alphabet, wrapping around after 'z'", None),
    ("mask_email(email)", "replaces every character before the '@' except the first with '*'", None),
    ("shortest_word(s)", "returns the shortest word in a sentence (the first one if tied)", "min()"),
    ("count_lines(text)", "returns the number of non-empty lines in a multi-line string", None),
    ("snake_to_camel(name)", "turns a snake_case name such as 'max_value' into camelCase ('maxValue')", None),
    ("camel_to_snake(name)", "turns a camelCase name such as 'maxValue' into snake_case ('max_value')", "regular expressions"),
    ("strip_punctuation(s)", "returns s without any punctuation characters", "the string module"),
    ("acronym(phrase)", "returns the upper-case first letters of each word, so 'portable network graphics' gives 'PNG'", None),
    ("pad_left(s, width, fill)", "pads s on the left with the fill character until it is width characters long", "str.rjust()"),
    ("double_chars(s)", "returns a string where every character of s appears twice, so 'abc' gives 'aabbcc'", None),
    ("swap_case(s)", "turns upper-case letters into lower case and lower-case letters into upper case", "str.swapcase()"),
    ("count_substring(s, sub)", "returns how many times sub appears in s, counting overlapping matches", None),
    ("is_hex_colour(s)", "returns True if s is a colour like '#1a2B3c': a '#' followed by exactly six hexadecimal digits",
     "regular expressions"),
    ("truncate(s, n)", "returns s cut to at most n characters, ending with '...' when it was cut", None),
    ("vowel_positions(s)", "returns a list of the indexes of the vowels in s", None),
    ("longest_common_prefix(words)", "returns the longest prefix shared by all strings in a list", "os.path.commonprefix()"),
    ("char_histogram(s)", "returns a dictionary counting each character of s, ignoring spaces", None),
    ("middle_chars(s)", "returns the middle character of s, or the middle two if the length is even", None),
    ("alternate_caps(s)", "returns s with its letters alternating between upper and lower case, starting with upper", None),
    ("words_starting_with(text, letter)", "returns the words of text that start with the given letter, ignoring case", None),
    ("has_double_letter(word)", "returns True if a word has the same letter twice in a row", None),
    ("sentence_case(s)", "makes the first letter of s upper case and the rest lower case", "str.capitalize()"),
    ("remove_vowels(s)", "returns s with all vowels removed", None),
    ("count_digit_chars(s)", "returns how many digit characters appear in s", "str.isdigit()"),
    ("is_isogram(word)", "returns True if no letter appears more than once in word, ignoring case", "set()"),
    ("wrap_text(text, width)", "splits text into lines of at most width characters without breaking words",
     "the textwrap module"),
    ("reverse_each_word(s)", "reverses every word of a sentence but keeps the words in their order", None),
    ("join_with_and(items)", "joins a list of strings as in English, so ['a', 'b', 'c'] gives 'a, b and c'", None),
    ("count_sentences(text)", "returns how many sentences text has, counting '.', '!' and '?' as sentence ends", None),
    ("longest_run(s)", "returns the length of the longest run of the same character in s", None),
    ("is_subsequence(a, b)",
     "returns True if all characters of a appear in b in the same order, not necessarily next to each other",
     None),
    ("longest_palindromic_substring(s)", "returns the longest substring of s that reads the same backwards", None),
    ("word_lengths(s)", "returns a list with the length of each word in a sentence", None),
    ("balanced_brackets(s)", "returns True if every bracket in s ('()', '[]' and '{}') is closed in the right order", None),
    ("valid_password(password)", "returns True if a password has at least 8 characters, a digit, an upper-case letter "
     "and a lower-case letter", "regular expressions"),
    ("parse_key_values(text)", "turns a string like 'a=1;b=2' into the dictionary {'a': '1', 'b': '2'}", None),
    ("run_length_decode(s)", "turns a string like 'a3b2' back into 'aaabb'", None),
    ("char_codes(s)", "returns a list of the Unicode code points of the characters in s", None),
    # lists
    ("running_sums(numbers)", "returns a list where each element is the sum of all numbers up to that position",
     "itertools.accumulate()"),
    ("merge_sorted(a, b)", "merges two sorted lists into one sorted list", "sorted()"),
    ("chunk(items, size)", "splits a list into consecutive chunks of the given size; the last chunk may be shorter", None),
    ("flatten_once(nested)", "flattens one level of nesting, so [1, [2, 3], [4, [5]]] gives [1, 2, 3, 4, [5]]", None),
    ("second_largest(numbers)", "returns the second largest distinct value in a list", "sorted()"),
    ("rotate_right(items, k)", "rotates a list to the right by k positions", None),
    ("pairwise_differences(numbers)", "returns the differences between each number and the one before it", None),
    ("count_occurrences(items, value)", "returns how many times value appears in a list", "list.count()"),
    ("find_index(items, value)", "returns the index of the first occurrence of value in a list, or -1 if it is not there",
     "list.index()"),
    ("interleave(a, b)", "interleaves two lists, so [1, 2] and ['a', 'b'] give [1, 'a', 2, 'b']; leftover items go at the end",
     None),
    ("remove_value(items, value)", "returns a new list with every occurrence of value removed", None),
    ("split_even_odd(numbers)", "returns two lists: the even numbers and the odd numbers, in their original order", None),
    ("positives_only(numbers)", "returns only the positive numbers of a list, keeping their order", "filter()"),
    ("moving_average(numbers, window)", "returns the average of each run of `window` consecutive numbers", None),
    ("list_difference(a, b)", "returns the items of a that are not in b, keeping the order of a", None),
    ("common_elements(a, b)", "returns the items that appear in both lists, without duplicates", "set()"),
    ("zip_to_dict(keys, values)", "builds a dictionary from a list of keys and a list of values", "zip()"),
    ("max_gap(numbers)", "returns the largest difference between two neighbouring numbers in a list", None),
    ("all_unique(items)", "returns True if no item appears twice in a list", "set()"),
    ("most_frequent(items)", "returns the item that appears most often in a non-empty list", "collections.Counter"),
    ("running_products(numbers)", "returns a list where each element is the product of all numbers up to that position", None),
    ("every_nth(items, n)", "returns every n-th item of a list, starting with the first", "slicing"),
    ("count_greater(numbers, limit)", "returns how many numbers in a list are greater than limit", None),
    ("sum_of_squares(numbers)", "returns the sum of the squares of the numbers in a list", None),
    ("value_range(numbers)", "returns the difference between the largest and the smallest number in a non-empty list",
     "max() or min()"),
    ("replace_negatives(numbers)", "returns a copy of the list with every negative number replaced by 0", None),
    ("collapse_repeats(items)", "removes each item equal to the one just before it, so [1, 1, 2, 1] gives [1, 2, 1]", None),
    ("group_by_length(words)", "returns a dictionary mapping each word length to the list of words with that length", None),
    ("transpose(matrix)", "transposes a matrix given as a list of equal-length lists", "zip()"),
    ("matrix_total(matrix)", "returns the sum of all numbers in a list of lists of numbers", None),
    ("diagonal(matrix)", "returns the main diagonal of a square matrix as a list", None),
    ("pairs_with_sum(numbers, target)", "returns all pairs of numbers in the list that add up to target", None),
    ("missing_number(numbers)", "returns the one number missing from a list that should hold every number from 1 to n", None),
    ("binary_search(items, target)", "returns the index of target in a sorted list, or -1, using binary search",
     "the bisect module"),
    ("bubble_sort(numbers)", "sorts a list of numbers with bubble sort and returns it", "sort() or sorted()"),
    ("insertion_sort(numbers)", "sorts a list of numbers with insertion sort and returns it", "sort() or sorted()"),
    ("unique_sorted(items)", "returns the distinct items of a list in ascending order", None),
    ("split_at(items, value)", "splits a list into sublists wherever value appears, leaving value out", None),
    ("last_n(items, n)", "returns the last n items of a list, or the whole list if it is shorter", None),
    ("sum_even_positions(numbers)", "returns the sum of the items at even indexes (0, 2, 4, ...)", None),
    ("longest_increasing_run(numbers)", "returns the length of the longest run of strictly increasing neighbouring numbers",
     None),
    ("count_true(flags)", "returns how many values in a list of booleans are True", "sum()"),
    ("nth_smallest(numbers, n)", "returns the n-th smallest number in a list, counting from 1", "sorted()"),
    ("window_max(numbers, k)", "returns the largest value of each window of k consecutive numbers", None),
    ("count_in_ranges(numbers, width)", "returns a dictionary counting how many numbers fall into each range of the given "
     "width, keyed by the start of the range", None),
    # dictionaries
    ("invert_dict(d)", "swaps the keys and values of a dictionary whose values are unique", None),
    ("merge_counts(a, b)", "merges two dictionaries of counts, adding the values of shared keys", None),
    ("key_with_max_value(d)", "returns the key with the largest value in a non-empty dictionary", "max()"),
    ("filter_by_value(d, threshold)", "returns a new dictionary with only the items whose value is at least threshold", None),
    ("keys_by_value(d)", "returns the keys of a dictionary sorted by their values, largest first", None),
    ("group_by_first_letter(words)", "returns a dictionary mapping each first letter to the words that start with it", None),
    ("count_by_type(items)", "returns a dictionary counting how many items of each type name (such as 'int' or 'str') a list has",
     None),
    ("nested_get(d, keys)",
     "follows a list of keys through nested dictionaries and returns the value, or None if a key is missing",
     None),
    ("rename_keys(d, mapping)", "returns a copy of d with its keys renamed according to mapping; other keys stay the same", None),
    ("dict_from_pairs(pairs)", "builds a dictionary from a list of (key, value) pairs, keeping the last value of a repeated key",
     "dict()"),
    ("cart_total(cart, prices)", "returns the total cost of a shopping cart, given a dictionary of item to quantity and a "
     "dictionary of item to price", None),
    ("shared_keys(a, b)", "returns a sorted list of the keys two dictionaries have in common", None),
    ("member_to_group(groups)", "turns a dictionary of group name to list of members into a dictionary of member to group name",
     None),
    ("top_scores(scores, n)", "returns the names with the n highest scores from a dictionary of name to score", None),
    ("remove_empty_values(d)", "returns a copy of d without the keys whose value is None, an empty string or an empty list",
     None),
    ("average_marks(marks)", "takes a dictionary of student name to list of marks and returns a dictionary of student name "
     "to average mark", None),
    ("scale_recipe(ingredients, factor)", "multiplies every quantity in a dictionary of ingredient to quantity by factor", None),
    # numbers
    ("lcm(a, b)", "returns the least common multiple of two positive integers", "math.lcm()"),
    ("clamp(x, low, high)", "returns x limited to the range from low to high", "max() or min()"),
    ("fahrenheit_to_celsius(f)", "converts a temperature from Fahrenheit to Celsius", None),
    ("km_to_miles(km)", "converts a distance in kilometres to miles", None),
    ("is_leap_year(year)", "returns True if year is a leap year in the Gregorian calendar", "the calendar module"),
    ("sum_proper_divisors(n)", "returns the sum of all positive divisors of n that are smaller than n", None),
    ("is_perfect_number(n)", "returns True if n equals the sum of its positive divisors smaller than n", None),
    ("count_digits(n)", "returns how many digits a non-negative integer has", "str() or len()"),
    ("reverse_number(n)", "returns the digits of a non-negative integer reversed, so 1230 gives 321", "str()"),
    ("is_armstrong(n)", "returns True if n equals the sum of its digits, each raised to the power of the number of digits", None),
    ("to_binary(n)", "returns the binary representation of a non-negative integer as a string", "bin() or format()"),
    ("from_binary(bits)", "converts a string of 0s and 1s into an integer", "int() with a base"),
    ("power(base, exponent)", "returns base raised to a non-negative integer exponent", "** or pow()"),
    ("primes_up_to(n)", "returns a list of all primes up to and including n, using the sieve of Eratosthenes", None),
    ("prime_factors(n)", "returns the prime factors of n in ascending order, with repeats", None),
    ("collatz_steps(n)", "returns how many steps the Collatz sequence takes to reach 1 from n", None),
    ("round_to_multiple(x, step)", "rounds x to the nearest multiple of step", None),
    ("percentage(part, whole)", "returns part as a percentage of whole, rounded to one decimal place", None),
    ("apply_discount(price, percent)", "returns the price after a discount of percent per cent, rounded to two decimal places",
     None),
    ("compound_interest(principal, rate, years)", "returns the balance after a yearly interest rate (given as a percentage) "
     "is compounded for a number of years", None),
    ("bmi(weight_kg, height_m)", "returns the body mass index, rounded to one decimal place", None),
    ("sign(x)", "returns -1, 0 or 1 depending on whether x is negative, zero or positive", None),
    ("is_perfect_square(n)", "returns True if a non-negative integer is the square of an integer", "math.sqrt()"),
    ("triangle_number(n)", "returns the sum of the integers from 1 to n", "a loop"),
    ("hypotenuse(a, b)", "returns the length of the longest side of a right-angled triangle with legs a and b", "math.hypot()"),
    ("circle_area(radius)", "returns the area of a circle with the given radius", None),
    ("seconds_to_hms(seconds)", "turns a number of seconds into a string in the form 'H:MM:SS'", "the datetime module"),
    ("minutes_to_text(minutes)", "turns a number of minutes into a string such as '2 h 05 min'", None),
    ("digital_root(n)", "repeatedly sums the digits of n until a single digit remains, and returns it", None),
    ("is_power_of_two(n)", "returns True if n is a power of two", "math.log()"),
    ("count_bits(n)", "returns how many 1 bits the binary form of a non-negative integer has", "bin()"),
    ("roman_to_int(s)", "converts a Roman numeral such as 'XIV' into an integer", None),
    ("int_to_roman(n)", "converts an integer from 1 to 3999 into a Roman numeral", None),
    ("median(numbers)", "returns the median of a non-empty list of numbers", "the statistics module"),
    ("variance(numbers)", "returns the population variance of a non-empty list of numbers", "the statistics module"),
    ("rescale(numbers)", "scales a list of numbers so that the smallest becomes 0 and the largest becomes 1", None),
    ("lerp(a, b, t)", "returns the value a fraction t of the way from a to b", None),
    ("share_of_bill(bill, tip_percent, people)", "returns how much each person pays when a bill plus a tip of tip_percent "
     "per cent is split evenly, rounded to two decimal places", None),
    ("number_to_words(n)", "spells out an integer from 0 to 99 in English words", None),
    ("ordinal(n)", "returns n with its English ordinal suffix, such as '1st', '2nd', '3rd' or '11th'", None),
    ("format_thousands(n)", "formats an integer with commas between groups of three digits", "format() or f-strings"),
    ("is_harshad(n)", "returns True if n is divisible by the sum of its digits", None),
    ("sum_multiples(limit)", "returns the sum of all positive numbers below limit that are multiples of 3 or 5", None),
    ("fizzbuzz(n)", "returns a list of strings for 1 to n, with 'Fizz' for multiples of 3, 'Buzz' for multiples of 5 "
     "and 'FizzBuzz' for multiples of both", None),
    ("climb_stairs(n)", "returns how many ways there are to climb n steps, taking one or two steps at a time", None),
    ("pascal_row(n)", "returns the n-th row of Pascal's triangle as a list, with row 0 being [1]", None),
    ("safe_divide(a, b)", "returns a divided by b, or None when b is zero", "try and except"),
    ("letter_grade(score)", "turns a score from 0 to 100 into a letter: A for 90 and above, B for 80 and above, "
     "C for 70 and above, D for 60 and above and F otherwise", None),
    ("is_triangle(a, b, c)", "returns True if three lengths can be the sides of a triangle", None),
    ("distance(p, q)", "returns the Euclidean distance between two points given as (x, y) tuples", "math.dist()"),
    ("rectangles_overlap(a, b)", "returns True if two rectangles, each given as (x1, y1, x2, y2), overlap", None),
    ("min_coins(amount, coins)", "returns the smallest number of coins from a list of coin values that add up to amount, "
     "or -1 if it cannot be done", None),
    ("next_prime(n)", "returns the smallest prime number greater than n", None),
    ("multiply_matrices(a, b)", "multiplies two matrices given as lists of lists", None),
]
FUNCTION_OPENINGS = ["Write a Python function `{sig}` that {what}", "Write a Python function `{sig}` that {what}",
                     "Write a function `{sig}` in Python that {what}"]  # the suite's own wording twice as often
FUNCTION_ENDINGS = [".", ". Include a docstring.", ". Explain your solution briefly after the code.",
                    ". Add a short example call.", ". Keep it short and readable."]

# --- writing: (fillers, templates) per kind; a pair's two parts go to {p} and {x}.
NOTES = [
    ("a neighbour", "feed your cat while you are away for the weekend"),
    ("a neighbour", "keep the music down after ten at night"),
    ("your flatmate", "take the bins out on Thursday evenings"), ("your flatmate", "stop leaving dirty dishes in the sink"),
    ("your landlord", "fix the dripping shower"), ("a colleague", "cover your shift next Tuesday"),
    ("a colleague", "return the stapler they borrowed"), ("your child's teacher", "excuse your child from sports on Friday"),
    ("the family downstairs", "take in a parcel for you on Monday"), ("a neighbour", "move their car away from your driveway"),
    ("your flatmate", "buy milk on the way home"), ("a delivery driver", "leave parcels behind the side gate"),
    ("a neighbour", "lend you a ladder for the afternoon"), ("your manager", "let you leave an hour early on Friday"),
    ("the school office", "update your phone number"),
]
NOTE_TEMPLATES = ["Write a short note to {p} asking them to {x}.", "Write a polite note to {p} asking them to {x}.",
                  "Draft a friendly note to {p} asking them to {x}. Keep it under 60 words."]
EMAILS = [
    ("your manager", "ask for a day off next Friday"), ("a client", "move a meeting to next week"),
    ("your landlord", "report that the heating has stopped working"), ("a shop", "ask for a refund for a broken lamp"),
    ("your team", "share the date of the summer party"), ("your son's teacher", "explain why he missed school yesterday"),
    ("a former colleague", "ask for a job reference"), ("a gym", "cancel your membership"),
    ("a plumber", "ask for a quote to replace a kitchen tap"), ("a restaurant", "book a table for eight people on Saturday"),
    ("your bank", "ask why a payment was taken twice"), ("a new colleague", "welcome them to the team"),
    ("an online shop", "ask where your order is"), ("your neighbours", "warn them about building work next week"),
    ("a hotel", "ask whether they have a quiet room available in May"),
]
EMAIL_TEMPLATES = ["Write a short email to {p} to {x}.", "Write a brief, polite email to {p} to {x}.",
                   "Draft an email to {p} to {x}. Keep it to a few sentences."]
EVENTS = [
    "a small birthday dinner at your flat on Saturday", "a housewarming party next Friday evening",
    "a baby shower for your sister", "a board-game night at your place", "a retirement lunch for a colleague",
    "a school summer fair", "a street party for the whole road", "a charity bake sale", "the first meeting of a new book club",
    "a barbecue in your garden", "a surprise party for your best friend", "a neighbourhood clean-up morning",
    "a children's costume party", "a quiz night at the local pub", "a farewell coffee for a colleague who is leaving",
]
EVENT_TEMPLATES = ["Write an invitation to {x}.", "Write a short, warm invitation to {x}.",
                   "Write a text message inviting people to {x}."]
POEM_SUBJECTS = [
    "the first snow of winter", "an old oak tree", "a cup of morning coffee", "a busy train station", "the sea in a storm",
    "a cat asleep in the sun", "the moon over a city", "autumn rain", "a child's first day at school", "a forgotten umbrella",
    "a garden after rain", "a kite on a windy day", "an empty beach in winter", "a grandmother's kitchen",
    "fireflies on a summer night", "a mountain at dawn", "a river in spring", "a candle in the dark", "a lost glove",
    "the last day of summer",
]
POEM_TEMPLATES = ["Write {lines} poem about {x}.", "Write a short poem about {x}, {n} lines long.",
                  "Write {lines} rhyming poem about {x}.", "Write a haiku about {x}."]
PRODUCTS = [
    "a bamboo toothbrush", "a waterproof backpack", "a wooden chopping board", "a pair of noise-cancelling headphones",
    "a solar-powered garden light", "a handmade wool scarf", "a cast-iron frying pan", "a desk lamp with a dimmer",
    "a set of beeswax food wraps", "a travel pillow", "a plant pot that tells you when to water", "a lavender-scented candle",
    "an insulated lunch box", "a yoga mat made of cork", "a portable phone charger", "a pair of wool walking socks",
]
PRODUCT_TEMPLATES = ["Write a short product description for {x}.", "Draft a two-paragraph product description for {x}.",
                     "Write a three-sentence product description for {x} for an online shop.",
                     "Write a product description for {x} that would appeal to students."]
STORIES = [
    "a robot who learns to bake bread", "a lost dog finding its way home", "a girl who finds a key in the snow",
    "two friends stuck in a lift", "a shy dragon", "a town where it never stops raining", "a boy who can talk to birds",
    "a grandmother's secret recipe", "a letter delivered fifty years late", "an old man who plants a tree every year",
    "a cat who becomes the mayor of a village", "a fox and a crow who share a garden", "a mix-up at a birthday party",
    "a snowman who wants to see the summer", "a bus driver who takes the wrong turn on purpose",
]
STORY_TEMPLATES = ["Write a short story about {x}.", "Write a very short story, under 150 words, about {x}.",
                   "Tell a short bedtime story for a child about {x}.", "Write a short story with a happy ending about {x}."]
APOLOGIES = [
    ("a friend", "missing their birthday party"), ("your neighbour", "the noise from your party last night"),
    ("a colleague", "forgetting to send them the report"), ("a customer", "a late delivery"),
    ("your sister", "forgetting to call her on her birthday"), ("your team", "cancelling a meeting at the last minute"),
    ("a friend", "arriving an hour late to dinner"), ("your landlord", "paying the rent a few days late"),
    ("your teacher", "handing in your homework late"), ("a hotel guest", "a noisy room"),
    ("a client", "a mistake in their invoice"), ("your flatmate", "eating their leftovers"),
    ("a friend", "breaking the mug you borrowed"), ("a restaurant guest", "a long wait for their food"),
    ("your parents", "not visiting for so long"),
]
APOLOGY_TEMPLATES = ["Write a short apology to {p} for {x}.", "Write a sincere apology message to {p} for {x}.",
                     "Write a brief apology to {p} for {x}, and offer to make it right."]
ANNOUNCEMENTS = [
    ("the staff of a small office", "a new recycling system"), ("parents at a primary school", "a change to the pick-up time"),
    ("members of a gym", "new opening hours"), ("the residents of a building", "repairs to the lift next week"),
    ("the customers of a café", "a new vegan menu"), ("members of a book club", "a new meeting place"),
    ("passengers at a station", "a delayed train"), ("the people of a village", "a new farmers' market every Saturday"),
    ("the employees of a company", "a new flexible working policy"), ("library users", "free computer classes"),
    ("a youth football team", "the end-of-season dinner"), ("students", "the school library closing early on Friday"),
    ("the members of a choir", "a concert in December"), ("the tenants of a building", "a water cut on Wednesday morning"),
]
ANNOUNCEMENT_TEMPLATES = ["Write a short announcement for {p} about {x}.", "Write a brief, clear announcement to {p} about {x}.",
                          "Draft a notice for {p} about {x}."]
THANKS = [
    ("a neighbour", "looking after your dog"), ("a teacher", "helping your child this year"),
    ("a colleague", "covering your shifts while you were ill"), ("your grandmother", "a hand-knitted jumper"),
    ("a friend", "driving you to the airport"), ("a nurse", "caring for your father in hospital"),
    ("your team", "finishing a hard project on time"), ("your hosts", "a lovely weekend at their home"),
    ("a mentor", "their advice over the past year"), ("a stranger", "returning your lost wallet"),
    ("your aunt", "a birthday present"), ("the volunteers", "their help at a charity event"),
    ("a customer", "their first order"), ("a coach", "a great season"),
]
THANK_TEMPLATES = ["Write a thank-you message to {p} for {x}.", "Write a short thank-you note to {p} for {x}.",
                   "Write a warm thank-you card message to {p} for {x}."]
SLOGAN_SUBJECTS = [
    "a neighbourhood bakery", "a cycling club", "a dog-walking service", "a new recycling scheme", "a small bookshop",
    "a school science fair", "a healthy snack bar", "a local football team", "a community garden", "a language school",
    "a fitness app", "a tea shop", "a charity fun run", "a repair café", "a campaign to save water",
]
SLOGAN_TEMPLATES = ["Suggest three slogans for {x}.", "Write a catchy slogan for {x}.",
                    "Come up with five short slogans for {x}."]
REVIEW_SUBJECTS = [
    "a small Italian restaurant with slow service but great pasta", "a pair of running shoes you have worn for a month",
    "a hotel by the sea with a noisy bar", "a cheap pair of headphones", "a museum about the history of trains",
    "a new coffee machine", "a weekend cooking class", "a children's theme park", "a mystery novel with a surprising ending",
    "a low-cost flight that was two hours late", "a local hairdresser", "a tent that leaked in the rain",
    "a vegetarian cookbook", "a city walking tour", "an online language course", "a second-hand bookshop",
]
REVIEW_TEMPLATES = ["Write a short review of {x}.", "Write a three-sentence customer review of {x}.",
                    "Write a balanced review of {x}, with one good point and one bad point."]

# --- thirdturn: generic third requests besides `varied`'s FOLLOWUPS["any"]
THIRD_TURNS = [
    "Thanks. Can you put all of that into one short paragraph?", "Now give me a short checklist based on everything above.",
    "Great. What is one thing I could do today based on this?", "Can you say all of that again in three sentences?",
    "Please check your last answer for mistakes and correct any you find.",
    "Now write a short title and a one-line summary for all of this.", "Thank you. Can you end with one encouraging sentence?",
]

# --- explain: concepts (science, computing, everyday economics) and ways to explain them
CONCEPTS = [
    "gravity", "evaporation", "the water cycle", "atoms", "electricity", "magnetism", "friction", "sound waves",
    "the greenhouse effect", "DNA", "the immune system", "evolution", "plate tectonics", "the seasons", "tides",
    "black holes", "static electricity", "digestion", "erosion", "buoyancy", "density", "the speed of light", "volcanoes",
    "antibiotics", "the food chain", "chemical reactions", "the phases of the Moon", "nuclear energy", "cells",
    "the internet", "an algorithm", "a variable in programming", "recursion", "a database", "encryption", "cloud storage",
    "machine learning", "a web browser", "an operating system", "binary numbers", "a computer virus", "an IP address",
    "open-source software", "a loop in programming", "a bug in a program", "cookies on websites", "a compiler",
    "artificial intelligence", "a spreadsheet formula", "inflation", "interest rates", "compound interest", "a mortgage",
    "taxes", "supply and demand", "a credit score", "insurance", "the stock market", "exchange rates", "a minimum wage",
    "opportunity cost", "a recession", "unemployment", "shares in a company", "debt", "crowdfunding", "a trade deficit",
]
EXPLAIN_TEMPLATES = [
    "Explain {x} to a beginner.", "Explain {x} to a child.", "Explain {x} to a ten-year-old.", "Explain {x} in two sentences.",
    "Explain {x} with an analogy from everyday life.", "Explain {x} in simple words, with one example.",
    "Use a simple analogy to explain {x}.", "Explain {x} to someone who has never heard of it.",
    "Explain {x} to a beginner, in three short points.",
]


def _crossed(rng: random.Random, fillers: list, templates: list[str], per: int, **extra: list[str]) -> list[str]:
    """`per` different templates for each filler (a pair fills {p} and {x}); each of `extra`'s
    placeholders gets a random value of its list, so a set's wording varies beyond its templates."""
    made = []
    for filler in fillers:
        p, x = filler if isinstance(filler, tuple) else ("", filler)
        for template in rng.sample(templates, min(per, len(templates))):
            made.append(template.format(p=p, x=x, **{k: rng.choice(v) for k, v in extra.items()}))
    return made


def _news(rng: random.Random, news: list[str], templates: list[str]) -> list[str]:
    """Each piece of news twice, about a random relation (with a first name a third of the time
    where the relation has no gender), with the relation's pronouns."""
    made = []
    for item in news:
        for template in rng.sample(templates, 2):
            relation = rng.choice(sorted(RELATIONS))
            pronouns = PRONOUNS[RELATIONS[relation]]
            if RELATIONS[relation] is None and rng.random() < 1 / 3:
                relation = f"{relation} {rng.choice(NAMES)}"
            made.append(template.format(p=relation, x=item.format(**pronouns), **pronouns))
    return made


def chat(rng: random.Random, count: int) -> list[Row]:
    """Short everyday requests in the chat suite's phrasings."""
    made = (_crossed(rng, WAYS, WAYS_TEMPLATES, 2) + _crossed(rng, HELPS, HELPS_TEMPLATES, 2)
            + _news(rng, HARD_NEWS, HARD_TEMPLATES) + _news(rng, GOOD_NEWS, GOOD_TEMPLATES)
            + _crossed(rng, ROUTINES, ROUTINE_TEMPLATES, 2) + _crossed(rng, MACHINES, MACHINE_TEMPLATES, 2)
            + _crossed(rng, IDEAS, IDEA_TEMPLATES, 2, n=["two", "three", "four", "five"])
            + _crossed(rng, WHYS, WHY_TEMPLATES, 1) + _crossed(rng, TIPS, TIP_TEMPLATES, 2)
            + _crossed(rng, BENEFITS, BENEFIT_TEMPLATES, 2) + _crossed(rng, GOOD_THINGS, GOOD_THING_TEMPLATES, 1)
            + _crossed(rng, MISHAPS, MISHAP_TEMPLATES, 2) + _crossed(rng, ASKING, ASKING_TEMPLATES, 1)
            + _crossed(rng, SKILLS, SKILL_TEMPLATES, 1))
    return [("chat", text) for text in rng.sample(made, min(count, len(made)))]


def functions(rng: random.Random, count: int) -> list[Row]:
    """Function tasks in the code suite's phrasing, three variants each; none named as a suite function."""
    suite = ROOT / "mars_cli" / "data" / "suites" / "code.jsonl"
    taken = {json.loads(line)["entry_point"] for line in suite.read_text().splitlines() if line.strip()}
    made = []
    for signature, what, avoid in TASKS:
        if signature.partition("(")[0] in taken:
            continue
        for ending in rng.sample(FUNCTION_ENDINGS + ([None] if avoid else []), 3):
            opening = rng.choice(FUNCTION_OPENINGS).format(sig=signature, what=what)
            if ending is None:  # inline as in the suite where the task reads cleanly, else a sentence of its own
                plain = not any(w in what for w in (",", " if ", " or ", " without "))
                ending = f" without using {avoid}." if plain else f". Do not use {avoid}."
            made.append(opening + ending)
    return [("functions", text) for text in rng.sample(made, min(count, len(made)))]


def writing(rng: random.Random, count: int) -> list[Row]:
    """Single-turn writing tasks in the multi-turn suite's first-turn style."""
    made = (_crossed(rng, NOTES, NOTE_TEMPLATES, 3) + _crossed(rng, EMAILS, EMAIL_TEMPLATES, 3)
            + _crossed(rng, EVENTS, EVENT_TEMPLATES, 3)
            + _crossed(rng, POEM_SUBJECTS, POEM_TEMPLATES, 3, n=["four", "six", "eight"],
                        lines=["a four-line", "a six-line", "an eight-line"])
            + _crossed(rng, PRODUCTS, PRODUCT_TEMPLATES, 3) + _crossed(rng, STORIES, STORY_TEMPLATES, 3)
            + _crossed(rng, APOLOGIES, APOLOGY_TEMPLATES, 3) + _crossed(rng, ANNOUNCEMENTS, ANNOUNCEMENT_TEMPLATES, 3)
            + _crossed(rng, THANKS, THANK_TEMPLATES, 3) + _crossed(rng, SLOGAN_SUBJECTS, SLOGAN_TEMPLATES, 3)
            + _crossed(rng, REVIEW_SUBJECTS, REVIEW_TEMPLATES, 3))
    return [("writing", text) for text in rng.sample(made, min(count, len(made)))]


def third_turns(prompts: Path, answers: Path, rng: random.Random, count: int, target) -> list[Row]:
    """Three-turn conversations: a step-12 follow-up conversation, the target's greedy answer to it
    (finished answers only) and a generic third request."""
    from mars_cli.prompts import is_held_out

    rows = [json.loads(line) for line in prompts.read_text().splitlines() if line.strip()]
    found = []
    for record in answer_records(answers, prompts.name):
        index, output = record["index"], record["output_ids"]
        if (record.get("mode") != "greedy" or is_held_out(index, 10) or index >= len(rows)
                or rows[index]["category"] != "followup"
                or not 24 <= len(output) < 256 or output[-1] not in target.eos_token_ids):
            continue
        answer = target.tokenizer.decode(output, skip_special_tokens=True).strip()
        if answer:
            found.append((index, answer))
    found.sort()
    rng.shuffle(found)
    made = []
    for index, answer in found[:count]:
        messages = rows[index]["messages"]
        options = [t for t in FOLLOWUPS["any"] + THIRD_TURNS if t != messages[-1]["content"]]  # not the same request twice
        made.append(("thirdturn", messages + [{"role": "assistant", "content": answer},
                                              {"role": "user", "content": rng.choice(options)}]))
    return made


def explain(rng: random.Random, count: int) -> list[Row]:
    """A concept explained to a given audience or in a given form."""
    made = _crossed(rng, CONCEPTS, EXPLAIN_TEMPLATES, 4)
    return [("explain", text) for text in rng.sample(made, min(count, len(made)))]




# =================================================================================================
# `real-text` (step 14): tasks on real text (Python's docs, standard-library or package code)
# =================================================================================================

TEXT_PASSAGE_TEMPLATES = [
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
    taken = {text for _, text in chat(old, 450) + functions(old, 450) + writing(old, 450)}
    every = 99  # more than any list's templates: _crossed then takes each template once
    crossed = [(WAYS, WAYS_TEMPLATES), (HELPS, HELPS_TEMPLATES),
               (ROUTINES, ROUTINE_TEMPLATES), (MACHINES, MACHINE_TEMPLATES),
               (TIPS, TIP_TEMPLATES), (BENEFITS, BENEFIT_TEMPLATES),
               (MISHAPS, MISHAP_TEMPLATES), (NOTES, NOTE_TEMPLATES),
               (EMAILS, EMAIL_TEMPLATES), (EVENTS, EVENT_TEMPLATES),
               (PRODUCTS, PRODUCT_TEMPLATES), (STORIES, STORY_TEMPLATES),
               (APOLOGIES, APOLOGY_TEMPLATES), (THANKS, THANK_TEMPLATES)]
    made = [text for fillers, templates in crossed for text in _crossed(rng, fillers, templates, every)]
    fresh = sorted(set(made) - taken)
    return [("restyled", text) for text in rng.sample(fresh, min(count, len(fresh)))]




# =================================================================================================
# `functions` (step 16): function tasks in the code suite's phrasing, made from real functions
# =================================================================================================

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




# =================================================================================================
# `magpie` (step 17): requests the target writes itself
# =================================================================================================

DEFAULT_KINDS = "chat:1400:,code:400:Write a Python function `,writing:300:Write a "
WORDS = (4, 120)
MARKER = "<|im_"


def parse_kinds(text: str) -> list[tuple[str, int, str]]:
    """"chat:1400:,code:400:Write a Python function `" -> [(name, count, opening), ...]. The
    opening may hold colons (only the first two split); a comma ends a kind."""
    kinds = []
    for part in text.split(","):
        name, count, opening = part.split(":", 2)
        kinds.append((name, int(count), opening))
    return kinds


def user_prefix(tokenizer) -> str:
    """The chat template's text before a user turn's content (with its default system prompt)."""
    marker = "\x00MARK\x00"
    text = tokenizer.apply_chat_template([{"role": "user", "content": marker}], tokenize=False)
    return text[: text.index(marker)]


def sample_requests(model, tokenizer, prefix: str, opening: str, count: int, batch: int,
                    max_new_tokens: int, temperature: float, end_ids: set[int]) -> list[str]:
    """`count` sampled user turns that begin with `opening` and that the model closed itself."""
    import torch

    ids = tokenizer(prefix + opening, return_tensors="pt", add_special_tokens=False).input_ids
    kept: list[str] = []
    tries = 0
    while len(kept) < count and tries < 4 * count:
        rows = ids.repeat(batch, 1)
        out = model.generate(rows, attention_mask=torch.ones_like(rows), do_sample=True, temperature=temperature,
                             top_p=1.0, top_k=0, max_new_tokens=max_new_tokens, pad_token_id=min(end_ids))
        tries += batch
        for row in out[:, ids.shape[1]:].tolist():
            ends = [i for i, token in enumerate(row) if token in end_ids]
            if not ends:
                continue  # the request ran past the budget: not a finished turn
            text = (opening + tokenizer.decode(row[: ends[0]])).strip()
            if MARKER not in text and WORDS[0] <= len(text.split()) <= WORDS[1]:
                kept.append(text)
    return kept[:count]




# =================================================================================================
# The subcommands: each writes one set, as the scripts of its step did (same seeds, same bytes)
# =================================================================================================

def write_rows(rows: list[dict], out: Path) -> None:
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} prompts to {out}")


def make_small(args: argparse.Namespace) -> None:
    write_rows(build(args.seed), args.out)


def make_large(args: argparse.Namespace) -> None:
    rows = build_large(args.seed)
    write_rows(rows, args.out)
    print(dict(Counter(row["category"] for row in rows).most_common()))


def make_varied(args: argparse.Namespace) -> None:
    from mars_cli.models import load_model

    rng = random.Random(args.seed)
    large = [json.loads(line) for line in (ROOT / "mars_cli" / "data" / "head_prompts_large.jsonl").read_text().splitlines()]
    target = load_model("smollm2-135m", device="cpu", dtype="float32")  # its tokenizer and end-of-sequence ids
    rows = (followups(args.answers, large, rng, args.followups, target) + reasoning(rng, args.reasoning)
            + everyday(rng) + python_questions(rng, args.python))
    write_prompt_set(rows, rng, args.out, "headV")


def make_styles(args: argparse.Namespace) -> None:
    from mars_cli.models import load_model

    rng = random.Random(args.seed)
    target = load_model("smollm2-135m", device="cpu", dtype="float32")  # its tokenizer and end-of-sequence ids
    rows = (chat(rng, args.chat) + functions(rng, args.functions) + writing(rng, args.writing)
            + third_turns(args.prompts_varied, args.answers_varied, rng, args.thirdturn, target)
            + explain(rng, args.explain))
    write_prompt_set(rows, rng, args.out, "headS")


def make_real_text(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    if args.packages:
        found_passages, found_sources = package_texts([n for n in args.packages.split(",") if n])
    else:
        modules = _stdlib_modules()
        found_passages, found_sources = passages(modules), sources(modules)
    print(f"{len(found_passages)} passages, {len(found_sources)} functions found", file=sys.stderr)
    rows = (tasks(rng, found_passages, TEXT_PASSAGE_TEMPLATES, args.passage, "passage")
            + tasks(rng, found_sources, SOURCE_TEMPLATES, args.source, "source")
            + restyled(rng, args.restyled))
    write_prompt_set(rows, rng, args.out, "headF")


def make_functions(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    suite = ROOT / "mars_cli" / "data" / "suites" / "code.jsonl"
    skipped = {json.loads(line)["entry_point"] for line in suite.read_text().splitlines() if line.strip()}
    skipped |= {sig.partition("(")[0] for sig, _, _ in TASKS}
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    found = function_tasks([stdlib, *package_folders([n for n in args.packages.split(",") if n])], skipped)
    print(f"{len(found)} functions with an imperative summary found", file=sys.stderr)
    chosen = rng.sample(sorted(found), min(args.count, len(found)))
    rows = [("write", rng.choice(FUNCTION_OPENINGS).format(sig=sig, what=found[sig])
             + rng.choice(FUNCTION_ENDINGS)) for sig in chosen]
    write_prompt_set(rows, rng, args.out, "headG")


def make_magpie(args: argparse.Namespace) -> None:
    import torch

    from mars_cli.models import load_model

    target = load_model(args.target, device="cpu", dtype=args.dtype)
    torch.manual_seed(args.seed)
    prefix = user_prefix(target.tokenizer)
    rows = []
    for name, count, opening in parse_kinds(args.kinds):
        started = time.perf_counter()
        with torch.inference_mode():
            requests = sample_requests(target.model, target.tokenizer, prefix, opening, count, args.batch,
                                       args.max_new_tokens, args.temperature, target.eos_token_ids)
        print(f"{name}: {len(requests)} requests in {time.perf_counter() - started:.0f} s", file=sys.stderr)
        rows += [(name, text) for text in requests]
    write_prompt_set(rows, random.Random(args.seed), args.out, "headM")


# =================================================================================================
# `check`: every set of the manifest made again (or unpacked) and compared with its recorded hash
# =================================================================================================

def file_digest(path: Path) -> tuple[str, int]:
    """(sha256, size in bytes) of a file's content as stored (a .gz file: its compressed bytes)."""
    digest = hashlib.sha256(path.read_bytes())
    return digest.hexdigest(), path.stat().st_size


def check(args: argparse.Namespace) -> None:
    from mars_cli.paths import cache_dir

    manifest = json.loads(args.manifest.read_text())
    folder = (args.dir or cache_dir() / "head-data").resolve()
    folder.mkdir(parents=True, exist_ok=True)
    wanted = {name for name in (args.only or "").split(",") if name}
    known = {entry["id"] for entry in manifest["sets"]}
    if wanted - known:
        raise SystemExit(f"error: --only names no set of the manifest: {', '.join(sorted(wanted - known))} "
                         f"(known: {', '.join(sorted(known))})")
    failures = 0
    for entry in manifest["sets"]:
        if wanted and entry["id"] not in wanted:
            continue
        made = folder / entry["file"]
        started = time.time()
        if entry.get("offline"):
            argv = shlex.split(entry["command"].format(dir=shlex.quote(str(folder))))
            argv[0] = sys.executable if argv[0] in ("python", "python3") else argv[0]
            result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
            if result.returncode:
                failures += 1
                print(f"{'FAILED':<8}{entry['id']}: {entry['command']} exited {result.returncode}\n{result.stderr[-2000:]}")
                continue
            how = f"made again in {time.time() - started:.0f} s"
        elif entry.get("stored", "").endswith(".gz") and not entry["file"].endswith(".gz"):
            with gzip.open(ROOT / entry["stored"], "rb") as stream:
                made.write_bytes(stream.read())
            how = f"unpacked from {entry['stored']} (cannot be made again offline)"
        elif entry.get("stored"):
            made = ROOT / entry["stored"]
            how = "kept as stored (cannot be made again offline)"
        else:
            print(f"{'absent':<8}{entry['id']}: {entry['file']} is not kept and cannot be made again offline")
            continue
        digest, size = file_digest(made)
        same = digest == entry["sha256"] and size == entry["bytes"]
        kept = entry.get("kept")
        if same and kept and file_digest(ROOT / kept) != (digest, size):
            same, how = False, f"{how}; {kept} differs from it"
        failures += not same
        print(f"{'same' if same else 'DIFFERS':<8}{entry['id']}: {made} ({how}; sha256 {digest[:12]}..., {size:,} bytes)")
    print(f"{'all sets match' if not failures else f'{failures} set(s) differ from'} {args.manifest}")
    if failures:
        raise SystemExit(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, metavar="SET")

    def command(name: str, run, summary: str, seed: int | None) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=summary, description=summary)
        sub.set_defaults(run=run)
        if seed is not None:
            sub.add_argument("--seed", type=int, default=seed, help=f"the seed of every draw (default {seed})")
            sub.add_argument("--out", type=Path, required=True, help="the JSONL file to write")
        return sub

    command("small", make_small, "the 638-prompt set mars_cli/data/head_prompts.jsonl", 2026)
    command("large", make_large, "the 6,726-prompt set mars_cli/data/head_prompts_large.jsonl", 2027)
    sub = command("varied", make_varied, "follow-ups over the target's answers, role-play, word problems, "
                  "everyday and Python questions (step 12's set)", 2028)
    sub.add_argument("--answers", type=Path, required=True,
                     help="the target's answers to head_prompts_large.jsonl (a generations file or gpu_train_head.py's "
                          "gen.jsonl.gz; records naming another prompt file are left out)")
    sub.add_argument("--followups", type=int, default=900)
    sub.add_argument("--reasoning", type=int, default=300)
    sub.add_argument("--python", type=int, default=400)
    sub = command("styles", make_styles, "the eval suites' styles: everyday requests, function and writing tasks, "
                  "three-turn conversations, explanations (step 13's set)", 2029)
    sub.add_argument("--prompts-varied", type=Path, required=True, help="a `varied` set")
    sub.add_argument("--answers-varied", type=Path, required=True,
                     help="the target's answers to it (generations file or gen.jsonl.gz)")
    for name, count in (("chat", 450), ("functions", 450), ("writing", 450), ("thirdturn", 400), ("explain", 250)):
        sub.add_argument(f"--{name}", type=int, default=count, help=f"prompts of that kind (default {count})")
    sub = command("real-text", make_real_text, "tasks on prose and short functions of Python's docs and standard "
                  "library, or of installed packages (step 14's set)", 2030)
    sub.add_argument("--passage", type=int, default=700)
    sub.add_argument("--source", type=int, default=450)
    sub.add_argument("--restyled", type=int, default=400)
    sub.add_argument("--packages", default="",
                     help="comma-separated installed packages to read (with ast) instead of the standard library")
    sub = command("functions", make_functions, "function tasks in the code suite's phrasing made from real "
                  "functions' docstrings (step 16's set)", 2032)
    sub.add_argument("--packages", default="", help="comma-separated installed packages read besides the stdlib")
    sub.add_argument("--count", type=int, default=900, help="functions drawn (one prompt each)")
    sub = command("magpie", make_magpie, "user requests the target writes itself (step 17's set; samples the model)", 2033)
    sub.add_argument("--target", default="smollm2-135m")
    sub.add_argument("--kinds", default=DEFAULT_KINDS, help="name:count:opening, comma-separated")
    sub.add_argument("--temperature", type=float, default=1.0)
    sub.add_argument("--max-new-tokens", type=int, default=96)
    sub.add_argument("--batch", type=int, default=128)
    sub.add_argument("--dtype", default="bfloat16")
    sub = command("check", check, "make every set the manifest can have made again offline, unpack the kept ones, "
                  "and compare each with its recorded sha256 and size (exit 1 on a difference)", None)
    sub.add_argument("--dir", type=Path, help="where the sets are written (default $MARS_CACHE/head-data, "
                                              "~/.cache/mars-cli/head-data)")
    sub.add_argument("--only", help="comma-separated set ids of the manifest (default: every set)")
    sub.add_argument("--manifest", type=Path, default=MANIFEST, help="default benchmarks/data-manifest.json")
    args = parser.parse_args()
    args.run(args)


if __name__ == "__main__":
    main()
