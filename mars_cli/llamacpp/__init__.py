"""MARS on llama.cpp (`--engine llama.cpp`): the target's forward and cache on llama.cpp through
llama-cpp-python, our drafters and verification rules unchanged. engine.py drives llama.cpp,
target.py is the target as the loop reads it, scorer.py scores drafts (chains and trees)."""
