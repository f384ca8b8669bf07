"""MARS where people serve at scale: a vLLM plugin (plugin.py) that decides vLLM's speculative
drafts with our rules (rejection.py), switched on and set by one additional_config key
(settings.py), and the engine glue `mars serve` and `mars eval --engine vllm` use (engine.py)."""
