"""Model specs -> loaded (model, tokenizer), one module a job:

- embedded.py: the embedded models' names and files (light: no torch; the CLI's flags list them)
- device.py: `--device` and `--dtype` -> torch devices and dtypes
- gguf_cache.py: GGUF files converted once into cached Hugging Face directories
- gguf_codes.py: a GGUF linear's integer codes read from the file's own blocks (`--dtype q4`)
- identity.py: values computed from files (hashes, fingerprints) remembered by the files' identity
- facts.py, loaded.py: what the rest of mars reads of a model (`LoadedModel`)
- fingerprint.py: the identity of weights and tokenizer that profiles and tuning entries are keyed by
- loading.py: `load_model`, and the dtype conversion the tuning layer applies

Names are re-exported here and imported on first use, so `from mars_cli.models import EMBEDDED`
does not import torch.
"""

from __future__ import annotations

from ..lazy import exports
from .embedded import DEFAULT_TARGET, EMBEDDED, EmbeddedModel

_HOMES = {
    "device": ("resolve_device", "DTYPES", "cpu_computes_bfloat16", "resolve_dtype", "unmeasured_auto_dtype"),
    "gguf_cache": ("CACHE_FORMAT", "file_sha256", "cache_entry_is_valid", "gguf_cache_entry"),
    "facts": ("text_config", "hidden_size", "num_layers", "rope_theta", "vocab_size"),
    "loaded": ("LoadedModel",),
    "fingerprint": ("model_fingerprint", "file_fingerprint", "loaded_fingerprint"),
    "loading": ("resolve_spec", "PICKLE_SUFFIXES", "check_weight_format", "load_model", "kept_in_float32",
                "cast_parameters", "convert_weights"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}

__all__ = ["DEFAULT_TARGET", "EMBEDDED", "EmbeddedModel", *_HOME_OF]
__getattr__ = exports(__name__, {**_HOME_OF, "identity": "identity"}, globals())
