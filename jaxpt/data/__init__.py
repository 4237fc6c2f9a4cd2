"""Data layer: corpora, SentencePiece and Hugging Face tokenizers, TFDS text builder/readers, packing and the LM
batch pipeline.

`from jaxpt.data import LMData` imports the pipeline (and tensorflow_datasets) lazily.
"""

_LAZY = {"LMData": "jaxpt.data.pipeline", "Tokenizer": "jaxpt.data.tokenizer", "load_tokenizer": "jaxpt.data.tokenizer",
         "HFTokenizer": "jaxpt.data.hf_tokenizer"}


def __getattr__(name):
  if name in _LAZY:
    import importlib
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'jaxpt.data' has no attribute {name!r}")
