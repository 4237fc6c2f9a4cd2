"""benchmarks/sampler.py's realistic point without timing anything: every system's answers end exactly at the
pre-drawn lengths (the peers' forced-EOS rule against a plain statement of it, HF's logits processor where torch is
installed, tunix's wrapper on tunix's positions with a stand-in model, tunix not being installed here), the peers
read the very rows and lengths the benchmark drew, a static batch's useful slot-steps; the benchmark readies its
peers one at a time before jaxpt compiles, times the engine beside the static sampler at a fixed point (tiny, no
peers), and refuses --rounds / --model it would not apply; and (slow) the whole
point at a tiny size with the three peers where /tmp/peers-venv exists. The engine's and the static sampler's
token budgets are checked against their run without budgets in tests/test_rl_engine.py."""

import json
import os
import subprocess
import sys
import types

import numpy as np
import pytest

from benchmarks import common, realistic, sampler
from jaxpt.models.config import ModelConfig

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
PEER_PYTHON = "/tmp/peers-venv/bin/python"
ARGS = types.SimpleNamespace(prompts=2, group=3, min_prompt=4, max_prompt=9, median=4, max_new=12, spread=0.9)


@pytest.fixture
def peers(monkeypatch):
  """benchmarks/sampler_peers.py imported as its peer processes run it (beside tunix_model.py)."""
  monkeypatch.syspath_prepend(BENCHMARKS)
  import sampler_peers
  return sampler_peers


def forced_statement(logits, generated, lengths, eos):
  """force_lengths row by row in float64: EOS alone (logit 0) at the row's last token, EOS barred before it."""
  out = np.array(logits, np.float64)
  for r, (t, length) in enumerate(zip(generated, lengths)):
    if t + 1 >= length:
      out[r] = -np.inf
      out[r, eos] = 0.0
    else:
      out[r, eos] = -np.inf
  return out


def test_the_forced_eos_rule_is_its_statement_and_ends_each_row_at_its_length(peers):
  rng = np.random.default_rng(0)
  lengths, eos, vocab = np.array([1, 2, 5, 9, 12]), 3, 16
  generated = np.zeros(len(lengths), np.int64)
  answers = np.full((len(lengths), 12), -1)
  for t in range(12):
    logits = rng.standard_normal((len(lengths), vocab))
    logits[:, eos] = 30.0  # EOS would win every draw unless barred
    got = peers.force_lengths(np, logits, generated, lengths, eos)
    np.testing.assert_array_equal(got, forced_statement(logits, generated, lengths, eos))
    answers[:, t] = np.argmax(got + rng.gumbel(size=got.shape), axis=1)  # a draw at temperature 1
    generated += 1
  np.testing.assert_array_equal(np.argmax(answers == eos, axis=1) + 1, lengths)
  with pytest.raises(AssertionError, match=r"^hf: answer lengths \[1, 3\] are not the forced \[1, 2\]"):
    peers.check_lengths("hf", [1, 3], np.array([1, 2]))


def test_hf_generate_stops_each_row_at_its_forced_length(peers, tmp_path):
  pytest.importorskip("torch")
  pytest.importorskip("transformers")
  cfg = ModelConfig(**dict(realistic.MODELS["tiny"], num_layers=1))
  tokens, mask, lengths = realistic.realistic_rows(ARGS, cfg.vocab_size)
  sampler.write_rows(str(tmp_path / "rows.npz"), cfg, ARGS, tokens, mask, lengths)
  _, call, warm_up = peers.hf_rows_peer(peers.read_rows(str(tmp_path / "rows.npz")))
  call(0)  # raises unless generate ended every row at its length and stopped at the longest one
  warm_up(0)  # the same rows, every one ended after 2 tokens (checked the same way)


def test_the_peers_read_the_rows_and_lengths_the_benchmark_drew(peers, tmp_path):
  cfg = ModelConfig(**realistic.MODELS["tiny"])
  tokens, mask, lengths = realistic.realistic_rows(ARGS, cfg.vocab_size)
  assert tokens.shape == (6, 9) and np.all(tokens[mask == 1] > realistic.EOS) and np.all(tokens[mask == 0] == 0)
  assert np.all(mask[:, -1] == 1) and 1 <= lengths.min() and lengths.max() <= ARGS.max_new  # left-padded
  np.testing.assert_array_equal(tokens[::3], tokens[1::3])  # G = 3 rollouts of each prompt
  sampler.write_rows(str(tmp_path / "rows.npz"), cfg, ARGS, tokens, mask, lengths)
  rows = peers.read_rows(str(tmp_path / "rows.npz"))
  for name, want in (("tokens", tokens), ("mask", mask), ("lengths", lengths)):
    np.testing.assert_array_equal(rows[name], want)
  assert (int(rows["eos"]), int(rows["max_new"]), rows["model"].tolist()) == (0, 12, [64, 2, 2, 1, 8192])
  sampler.write_rows(str(tmp_path / "other.npz"), ModelConfig(**dict(realistic.MODELS["tiny"], vocab_size=64)), ARGS,
                     tokens, mask, lengths)
  with pytest.raises(SystemExit, match="other.npz: model vocab 64, the peers build 8192"):
    peers.read_rows(str(tmp_path / "other.npz"))


def test_a_static_batch_steps_every_row_until_its_longest_one_ends():
  # decode slot-steps (prefill's first token excluded): rows of 1, 3, 5 tokens step 4 times each, 0 + 2 + 4 useful
  assert realistic.static_useful_fraction(np.array([1, 3, 5])) == 0.5
  assert realistic.static_useful_fraction(np.array([1, 1])) == 1.0


def test_an_unknown_point_is_refused_before_anything_runs(capsys):
  with pytest.raises(SystemExit):
    sampler.main(["--points", "realistic,big"])
  assert "--points: unknown point 'big' (small, kv, realistic)" in capsys.readouterr().err


def test_the_tunix_wrapper_counts_answer_tokens_from_tunix_positions(peers):
  """forced_lengths_model in a decode loop fed as tunix 0.1.7's Sampler feeds its model (tunix/generate/sampler.py,
  read there): positions = build_positions_from_mask over the left-padded prompt and the answer buffer
  (cumsum(mask) - (cumsum >= 1)), a prefill of the P prompt columns, then decode step d = P - 1 + t feeding column
  d at positions[:, d], the model split and merged under jit. A fixed logits table stands in for Llama3 (tunix is
  not installed here; the slow test runs the real one)."""
  import jax
  import jax.numpy as jnp
  nnx = pytest.importorskip("flax.nnx")
  vocab, eos = 16, realistic.EOS
  tokens, mask, lengths = realistic.realistic_rows(ARGS, vocab)
  (rows, prompt), steps = tokens.shape, ARGS.max_new
  table = np.random.default_rng(1).standard_normal((vocab, vocab)).astype(np.float32)
  table[:, eos] = 30.0  # EOS would win every draw unless barred

  class FixedLogits(nnx.Module):
    """tunix's model call (tokens, positions, cache, attention_mask) -> (logits [R, T, vocab] = table[tokens],
    cache)."""

    def __init__(self):
      self.table, self.num_embed = nnx.Param(jnp.asarray(table)), vocab

    def __call__(self, input_tokens, positions, cache, attention_mask):
      return self.table[...][input_tokens], cache

  model = peers.forced_lengths_model(FixedLogits(), mask.sum(axis=1), lengths, eos)
  assert model.num_embed == vocab and len(jax.tree.leaves(nnx.state(model))) == 1  # only the model's table
  graphdef, state = nnx.split(model)
  call = jax.jit(lambda state, toks, pos: nnx.merge(graphdef, state)(toks, pos, None, None)[0])
  buffer = np.concatenate([tokens, np.full((rows, steps), -1)], axis=1)
  counts = np.cumsum(np.concatenate([mask, np.ones((rows, steps), np.int32)], axis=1), axis=1)
  positions = counts - (counts >= 1)
  assert np.all(positions[:, prompt - 1] == mask.sum(axis=1) - 1)  # a left-padded row's last prompt token
  gumbel = np.random.default_rng(2).gumbel(size=(steps, rows, vocab))
  for t in range(steps):
    cols = slice(0, prompt) if t == 0 else slice(prompt - 1 + t, prompt + t)
    logits = np.asarray(call(state, jnp.asarray(buffer[:, cols]), jnp.asarray(positions[:, cols])))
    np.testing.assert_array_equal(logits[:, :-1], table[buffer[:, cols][:, :-1]])  # the prompt's logits untouched
    want = forced_statement(table[buffer[:, cols][:, -1]], np.full(rows, t), lengths, eos)
    np.testing.assert_array_equal(logits[:, -1], want)
    buffer[:, prompt + t] = np.argmax(logits[:, -1] + gumbel[t], axis=1)  # a draw at temperature 1
  np.testing.assert_array_equal(np.argmax(buffer[:, prompt:] == eos, axis=1) + 1, lengths)


class RecordedPeer:
  """`Peer`'s interface recording when each peer starts and is ready (a real peer needs the peer venv; the slow
  test runs them)."""
  log: list = []
  argvs: dict = {}

  def __init__(self, name, argv, **kwargs):
    self.name = name
    self.log.append(f"start {name}")
    self.argvs[name] = argv

  def wait_ready(self):
    self.log.append(f"ready {self.name}")


@pytest.mark.parametrize("point", ["small", "realistic"])
def test_the_peers_are_ready_one_at_a_time_before_jaxpt_compiles(point, monkeypatch):
  log, argvs = [], {}
  monkeypatch.setattr(RecordedPeer, "log", log)
  monkeypatch.setattr(RecordedPeer, "argvs", argvs)
  monkeypatch.setattr(common, "Peer", RecordedPeer)

  def jaxpt_starts(*args):
    log.append("jaxpt")
    raise StopIteration  # nothing of jaxpt's is built in this test

  monkeypatch.setattr(sampler, "init_params", jaxpt_starts)
  pythons = sampler.peer_pythons(types.SimpleNamespace(hf_python="hf-python", tunix_python="", peer_python="both"))
  with pytest.raises(StopIteration):
    if point == "realistic":
      sampler.run_realistic(types.SimpleNamespace(**vars(ARGS), model="tiny"), 1, pythons, hf_threads=2)
    else:
      sampler.run_point(point, ["pre"], ["float32"], 1, pythons, hf_threads=2)
  assert log == [f"{event} {peer}" for peer in sampler.PEERS for event in ("start", "ready")] + ["jaxpt"]
  # each peer under its own venv's python (--peer-python where its own is not given)
  assert {p: argv[0] for p, argv in argvs.items()} == {"hf": "hf-python", "tunix_untied": "both", "tunix_tied": "both"}
  # --hf-threads reaches the HF peer alone, as its trailing --torch-threads (no trial calls)
  assert {p: argv[-2:] == ["--torch-threads", "2"] for p, argv in argvs.items()} == {
      p: p == "hf" for p in sampler.PEERS}


def test_a_peer_without_a_python_does_not_run():
  args = types.SimpleNamespace(hf_python="", tunix_python="tunix-python", peer_python="")
  assert sampler.peer_pythons(args) == {"tunix_untied": "tunix-python", "tunix_tied": "tunix-python"}
  report = {"peers": {"tunix_untied": {"rate": 2.0}, "tunix_tied": {"rate": 3.0}}}
  assert sampler.fastest_tunix(report, "rate") == "tunix_tied" == report["fastest_tunix"]
  assert sampler.fastest_tunix({"peers": {"hf": {"rate": 1.0}}}, "rate") is None


def test_a_fixed_point_times_the_engine_beside_the_static_sampler(monkeypatch):
  """A tiny model at a tiny fixed point, no peers: both dtypes of the first scheme carry the engine's call, its
  tokens/s and its speed-up over the static sampler; a second scheme has no engine entry."""
  monkeypatch.setattr(sampler, "MODEL", dict(realistic.MODELS["tiny"], num_layers=1))
  monkeypatch.setattr(sampler, "POINTS", {"tiny": (2, 4, 6)})
  report = sampler.run_point("tiny", ["pre", "siamese_post_pre"], ["float32", "bfloat16"], 1, {})
  for dtype in ("float32", "bfloat16"):
    engine = report["jaxpt"][f"pre_{dtype}"]["engine"]
    assert set(engine) == {"call_ms", "new_tokens_per_sec", "speedup_vs_static"}
    assert engine["call_ms"] > 0 and engine["speedup_vs_static"] > 0
    assert engine["new_tokens_per_sec"] == pytest.approx(2 * 6 / engine["call_ms"] * 1e3, rel=0.01)
  assert "engine" not in report["jaxpt"]["siamese_post_pre_float32"]


def test_every_point_gets_its_rounds_and_a_mismatch_is_refused(monkeypatch, capsys, tmp_path):
  ran = []
  monkeypatch.setattr(sampler, "run_point",
                      lambda point, schemes, dtypes, n, python, threads: ran.append((point, n)) or {})
  monkeypatch.setattr(sampler, "run_realistic", lambda args, n, python, threads: ran.append(("realistic", n)) or {})
  sampler.main(["--points", "small,kv,realistic", "--out", str(tmp_path / "out.json")])
  assert ran == [("small", 5), ("kv", 2), ("realistic", 3)]
  for rounds in ("5,2", "5,2,0", "5,2,x"):
    with pytest.raises(SystemExit):
      sampler.main(["--points", "small,kv,realistic", "--rounds", rounds])
    assert (f"--rounds: {rounds!r} is not one positive count per --points entry (small, kv, realistic)"
            in capsys.readouterr().err)
  assert len(ran) == 3


def test_a_model_the_fixed_points_would_ignore_is_refused(capsys):
  with pytest.raises(SystemExit):
    sampler.main(["--points", "small,realistic", "--model", "tiny"])
  err = capsys.readouterr().err
  assert "--model: 'tiny' applies only to the realistic point, not to small (the issue's model)" in err


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(PEER_PYTHON), reason=f"no peer venv at {PEER_PYTHON}")
def test_the_realistic_point_runs_end_to_end_with_the_three_peers(tmp_path):
  """A tiny run (about 1.5 min on a busy 2-core CPU): every peer call checks its answer lengths, jaxpt's are in
  the report."""
  out = tmp_path / "realistic.json"
  argv = ["--points", "realistic", "--rounds", "1", "--peer-python", PEER_PYTHON, "--model", "tiny", "--prompts", "2",
          "--group", "2", "--min-prompt", "8", "--max-prompt", "32", "--median", "6", "--max-new", "16", "--slots",
          "2", "--page-size", "4", "--out", str(out)]
  subprocess.run([sys.executable, "-m", "benchmarks.sampler", *argv], check=True, timeout=900,
                 cwd=os.path.dirname(BENCHMARKS))
  point = json.loads(out.read_text())["realistic"]
  assert point["same_lengths_as_forced"]["engine"] and point["same_lengths_as_forced"]["static"]
  assert point["point"]["rows"] == 4 and point["point"]["rollout_tokens"] == 28
  for system in (point["jaxpt"]["pre_float32"], point["jaxpt_static"]["pre_float32"]):
    assert all(system[f"speedup_vs_{peer}"] > 0 for peer in ("hf", "tunix_untied", "tunix_tied"))
    assert 0 < system["useful_fraction"] <= 1 and system["peak_mib"] > 0
  assert point["jaxpt"]["pre_float32"]["speedup_vs_static"] > 0 and point["jaxpt"]["pre_float32"]["peak_vs_static"] > 0
  assert set(point["peers"]) == {"hf", "tunix_untied", "tunix_tied"}
  assert "prefill all 4 rows" in point["note"] and "each of the 2 distinct prompts once" in point["note"]
