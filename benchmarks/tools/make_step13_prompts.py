"""Writes a third prompt set for draft-head self-distillation (issue 27, step 13).

The step-12 head accepts more on held-out training prompts than on the eval suites: the suites'
styles (short everyday requests, "Write a Python function `f(x)` that ...", first-turn writing
tasks, longer conversations) are under-represented in the first two sets. This set brings those
styles, never the suites' content, each kind from its own source:

- `chat`: short everyday requests in the chat suite's phrasings, templates crossed with topics
  (health, money, home, work, school, hobbies, travel, nature, technology, cooking, relationships).
- `functions`: small pure Python function tasks in the code suite's phrasing, a few variants
  each (a docstring, an explanation, a "without using X"); no suite function name is reused.
- `writing`: single-turn writing tasks in the multi-turn suite's first-turn style (notes, emails,
  invitations, poems, product descriptions, stories, apologies, announcements, thanks, slogans,
  reviews).
- `thirdturn`: three-turn conversations: a two-turn `followup` conversation of the step-12 set,
  the target's own greedy answer to it (from a generations file), then a third, generic request.
  Held-out rows of that set are never used.
- `explain`: a science, computing or everyday-economics concept explained to a given audience or
  in a given form.

None equals or contains an eval-suite, calibration or benchmark prompt (make_head_prompts's check,
on every user turn of a conversation). Reproducible from the seed and the two input files.

    python benchmarks/tools/make_step13_prompts.py --prompts-varied prompts-varied.jsonl \\
        --answers-varied gen-varied.jsonl --out prompts-step13.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_varied_prompts import FOLLOWUPS, NAMES, write_prompt_set  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]

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

# --- thirdturn: generic third requests besides make_varied_prompts's FOLLOWUPS["any"]
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
    for line in answers.read_text().splitlines():
        record = json.loads(line)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts-varied", type=Path, required=True, help="the step-12 prompt set (make_varied_prompts.py)")
    parser.add_argument("--answers-varied", type=Path, required=True, help="generations of --prompts-varied")
    parser.add_argument("--chat", type=int, default=450)
    parser.add_argument("--functions", type=int, default=450)
    parser.add_argument("--writing", type=int, default=450)
    parser.add_argument("--thirdturn", type=int, default=400)
    parser.add_argument("--explain", type=int, default=250)
    parser.add_argument("--seed", type=int, default=2029)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from mars_cli.models import load_model

    rng = random.Random(args.seed)
    target = load_model("smollm2-135m", device="cpu", dtype="float32")  # its tokenizer and end-of-sequence ids
    rows = (chat(rng, args.chat) + functions(rng, args.functions) + writing(rng, args.writing)
            + third_turns(args.prompts_varied, args.answers_varied, rng, args.thirdturn, target)
            + explain(rng, args.explain))
    write_prompt_set(rows, rng, args.out, "headS")

if __name__ == "__main__":
    main()
