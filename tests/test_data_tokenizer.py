"""SentencePiece tokenizer: ids, exact round trip, and the workdir cache."""

import os

import pytest
from hypothesis import given, settings, strategies as st

from jaxpt.data import corpus, tokenizer as tokenizer_lib

VOCAB = 1024


@pytest.fixture(scope="module")
def docs():
  return corpus.embedded_documents(400_000)


@pytest.fixture(scope="module")
def tok(docs):
  return tokenizer_lib.train(docs, VOCAB)


def test_special_ids_and_vocab(tok):
  assert (tok.pad_id, tok.eos_id, tok.bos_id) == (0, 1, 2)
  assert tok.vocab_size == VOCAB
  ids = tok.encode("def main():\n    return 0\n")
  assert ids and all(4 <= i < VOCAB for i in ids)
  # Trained on Python source: common code fragments are single pieces, not bytes.
  assert len(ids) < len("def main():\n    return 0\n") / 2


@pytest.mark.parametrize("text", [
    "",
    "def f(x):\n\tif x:\n        return {'a': [1, 2]}  # comment\n",
    "  leading and trailing spaces  \n\n\n",
    "Ünïcödé — 日本語のテキスト, emoji 😀👍🏽, RTL עברית, combining e\u0301",
    "null\x00byte and \r\n windows line ends \x7f",
    "1234567890 3.14159e-10",
])
def test_round_trip(tok, text):
  assert tok.decode(tok.encode(text)) == text


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_round_trip_any_text(tok, text):
  assert tok.decode(tok.encode(text)) == text


def test_training_is_deterministic(docs):
  # More chunks than the trainer's sample limit, so sampling is exercised too.
  many = [line for doc in docs for line in doc.splitlines() if line.strip()]
  assert len(many) > tokenizer_lib._MAX_SENTENCES
  assert tokenizer_lib.train(many, 700).model_proto == tokenizer_lib.train(many, 700).model_proto


def test_decode_drops_control_ids(tok):
  ids = tok.encode("abc")
  assert tok.decode([tok.bos_id] + ids + [tok.eos_id, tok.pad_id]) == "abc"


def test_small_corpus_with_large_vocab_does_not_fail():
  small = tokenizer_lib.train(["hello world\nhello there", "x = 1\n"], 4096)
  assert 260 < small.vocab_size <= 4096
  assert small.decode(small.encode("hello, wörld")) == "hello, wörld"


def test_too_small_vocab_names_field():
  with pytest.raises(ValueError, match="model.vocab_size=64"):
    tokenizer_lib.train(["some text"], 64)


def test_cache_reused_with_same_settings_and_retrained_otherwise(tmp_path, docs):
  small_docs = docs[:3]
  calls = []

  def documents():
    calls.append(1)
    return small_docs

  first = tokenizer_lib.load_or_train(str(tmp_path), 512, "corpus-a", documents)
  assert os.path.exists(tmp_path / "spm.model") and os.path.exists(tmp_path / "spm.json")
  again = tokenizer_lib.load_or_train(str(tmp_path), 512, "corpus-a", documents)
  assert len(calls) == 1 and again.model_proto == first.model_proto
  tokenizer_lib.load_or_train(str(tmp_path), 600, "corpus-a", documents)
  assert len(calls) == 2
  tokenizer_lib.load_or_train(str(tmp_path), 600, "corpus-b", documents)
  assert len(calls) == 3
  assert tokenizer_lib.Tokenizer.load(str(tmp_path / "spm.model")).vocab_size == 600
