"""The tuning layer: every measurement of this machine, in one place.

`--dtype auto`, `--packed-weights auto`, `--int8-head auto`, the cost curve behind `--num-draft
auto` and the drift check each measure how this machine runs a model and cache the answer. They
share one protocol (choice.py): a key, a cached entry under a lock, a budget, a plausibility
check, provisional entries on a busy machine, forgetting on drift, and a one-line note (one for
all of a session's choices: summary.py). The
decoding core and the model loading never import this package (tests/test_layers.py); the
session asks it for a plan before it builds its scorer (plan.py), and `mars tune` measures
everything at once (tune.py).
"""
