"""Writes the prompt sets for draft-head self-distillation.

Hand-written topics and instructions, crossed with a fixed seed, so each set is reproducible and
owes nothing to hub data sets. None of these prompts is a benchmark or eval-suite prompt.

    python benchmarks/tools/make_head_prompts.py           # mars_cli/data/head_prompts.jsonl (638, build())
    python benchmarks/tools/make_head_prompts.py --large   # mars_cli/data/head_prompts_large.jsonl (build_large())

The large set (categories chat, code, math, summarize, translate, creative, email, plan) is checked
programmatically: a prompt equal to or containing an eval-suite, calibration or benchmark prompt
(case- and whitespace-insensitive), or equal to a prompt of the small set, is dropped.
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


# ---------------------------------------------------------------------------------------------
# The large set (--large): mars_cli/data/head_prompts_large.jsonl. Everything below is written
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


if __name__ == "__main__":
    import argparse
    from collections import Counter

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--large", action="store_true", help="write head_prompts_large.jsonl (build_large) instead")
    args = parser.parse_args()
    data = Path(__file__).resolve().parents[2] / "mars_cli" / "data"
    out = data / ("head_prompts_large.jsonl" if args.large else "head_prompts.jsonl")
    rows = build_large() if args.large else build()
    out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"wrote {len(rows)} prompts to {out}")
    if args.large:
        print(dict(Counter(row["category"] for row in rows).most_common()))
