"""The DPO trainer: its objective against a float64 NumPy statement of the DPO equation (response-only sequence
log-probs, frozen reference), the DIR term's warm-up gate (off at step <= warm-up, on after, estimator included),
config errors, and through build_dpo / train_dpo: the loss falls on the synthetic task, the reference stays frozen,
a killed run resumes bit for bit, `init_from` starts policy and reference, `jaxpt eval` gives the run's numbers."""

import functools
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxpt
from jaxpt.config import ConfigError, from_section
from jaxpt.losses import club
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM
from jaxpt.trainers import dir_estimator, dpo
from jaxpt.engine.evaluate import evaluate_run

CFG = ModelConfig(vocab_size=64, d_model=16, num_layers=1, num_heads=2, num_kv_heads=2, mlp_dim=32, max_seq_len=12)
B, S = 5, 12


def random_batch(seed: int) -> dict:
  """A flattened preference batch of the data layer's form: prompt + response + EOS right-padded, `last` = the
  EOS index, response token counts (one response cut by left truncation: its count exceeds what is left)."""
  rng = np.random.default_rng(seed)
  out = {}
  for side in ("chosen", "rejected"):
    prompt = rng.integers(1, 5, B)
    response = rng.integers(1, 6, B)
    last = np.minimum(prompt + response, S - 1).astype(np.int32)
    tokens = rng.integers(1, CFG.vocab_size, (B, S)).astype(np.int32)
    tokens[np.arange(S)[None, :] > last[:, None]] = 0
    out.update({f"{side}_tokens": tokens, f"{side}_last": last, f"{side}_response_len": response.astype(np.int32)})
  out["rejected_response_len"][0] = S + 3  # truncated from the left: the whole row but position 0 is response
  out["rejected_last"][0] = S - 1
  out["rejected_tokens"][0] = rng.integers(1, CFG.vocab_size, S)
  out["bias/length"] = (out["chosen_response_len"] > out["rejected_response_len"]).astype(np.int32)
  out["weights"] = np.ones(B, np.float32)
  out["weights"][-1] = 0.0  # a padding pair
  return out


def init_params(seed: int):
  return jax.jit(lambda key: nn.meta.unbox(TransformerLM(CFG).init(key, jnp.zeros((1, S), jnp.int32))["params"]))(
      jax.random.PRNGKey(seed))


MODEL = TransformerLM(CFG)


@pytest.fixture(scope="module")
def models():
  """(model, policy params, reference params): two different inits."""
  return MODEL, init_params(0), init_params(1)


@functools.lru_cache(maxsize=None)
def grad_fn_for(settings: dpo.DPOConfig):
  """The jitted grad_fn of `settings`, compiled once per test session."""
  return jax.jit(dpo.make_dpo_grad_fn(MODEL, settings))


apply_fn = jax.jit(lambda params, tokens: MODEL.apply({"params": params}, tokens, return_hidden=True))
reference_fn = jax.jit(lambda params, batch: dpo.reference_logps(MODEL, params, batch))


# ----------------------------------------------------------------------------------------------------------------
# float64 NumPy statements


def numpy_log_softmax(x):
  x = np.asarray(x, np.float64)
  m = x.max(-1, keepdims=True)
  return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


def numpy_sequence_logps(model, params, tokens, last, response_len):
  """sum over the response tokens and the EOS (t = max(last - len, 1) .. last) of log p(token_t | tokens_<t), from
  the model's logits in float64, one explicit loop per row."""
  logp = numpy_log_softmax(apply_fn(params, jnp.asarray(tokens))[0])
  out = []
  for r in range(len(tokens)):
    first = max(int(last[r]) - int(response_len[r]), 1)
    out.append(sum(logp[r, t - 1, tokens[r, t]] for t in range(first, int(last[r]) + 1)))
  return np.array(out)


def numpy_logps(model, params, batch):
  return [numpy_sequence_logps(model, params, batch[f"{side}_tokens"], batch[f"{side}_last"],
                               batch[f"{side}_response_len"]) for side in ("chosen", "rejected")]


def numpy_dpo(pi_c, pi_r, ref_c, ref_r, beta, eps, w):
  """(loss, z): z = beta [(pi_c - ref_c) - (pi_r - ref_r)], loss = w-mean of -(1-eps) log s(z) - eps log s(-z)."""
  z = beta * ((pi_c - ref_c) - (pi_r - ref_r))
  per_pair = (1 - eps) * np.logaddexp(0.0, -z) + eps * np.logaddexp(0.0, z)
  return (w * per_pair).sum() / w.sum(), z


def numpy_club(q, x, a, w):
  """(1/N) sum_i log q(a_i|X_i) - (1/N^2) sum_i sum_j log q(a_j|X_i), w-weighted, an explicit N x N sum."""
  q = {k: np.asarray(v, np.float64) for k, v in q.items()}
  logq = numpy_log_softmax(np.maximum(x @ q["w1"] + q["b1"], 0.0) @ q["w2"] + q["b2"])
  pairs = logq[:, a]  # [i, j] = log q(a_j | X_i)
  return (w * np.diagonal(pairs)).sum() / w.sum() - (w[:, None] * w[None, :] * pairs).sum() / w.sum() ** 2


def numpy_last_hidden(model, params, batch, side):
  _, hidden = apply_fn(params, jnp.asarray(batch[f"{side}_tokens"]))
  return np.asarray(hidden, np.float64)[np.arange(B), batch[f"{side}_last"]]


def with_reference(ref_params, batch, step=0):
  return dict(batch, step=np.full(B, step, np.int32), **reference_fn(ref_params, batch))


# ----------------------------------------------------------------------------------------------------------------
# The objective


def test_response_mask_covers_the_response_and_the_eos_only():
  mask = np.asarray(dpo.response_mask((3, 8), jnp.array([5, 7, 7]), jnp.array([2, 9, 0])))
  np.testing.assert_array_equal(mask, [[0, 0, 0, 1, 1, 1, 0, 0],    # prompt 0..2, response 3..4, EOS 5
                                       [0, 1, 1, 1, 1, 1, 1, 1],    # cut from the left: all but position 0
                                       [0, 0, 0, 0, 0, 0, 0, 1]])   # empty response: the EOS


def test_objective_matches_the_dpo_equation_in_float64(models):
  model, params, ref_params = models
  batch = random_batch(1)
  beta, eps = 0.5, 0.2
  settings = dpo.DPOConfig(beta=beta, label_smoothing=eps)
  full = with_reference(ref_params, batch)
  grads, aux, metrics = grad_fn_for(settings)(params, None, full, jax.random.PRNGKey(0))

  pi_c, pi_r = numpy_logps(model, params, batch)
  ref_c, ref_r = numpy_logps(model, ref_params, batch)
  np.testing.assert_allclose(full["ref_chosen_logps"], ref_c, rtol=1e-5)
  np.testing.assert_allclose(full["ref_rejected_logps"], ref_r, rtol=1e-5)
  w = batch["weights"].astype(np.float64)
  want, z = numpy_dpo(pi_c, pi_r, ref_c, ref_r, beta, eps, w)
  assert aux is None and float(metrics["num_pairs"]) == B - 1
  np.testing.assert_allclose(metrics["loss"], want, rtol=1e-5)
  # z is beta times a difference of differences of float32 sequence log-probs: their rounding (~1e-6 each) is
  # absolute, so a margin near 0 (here -4.7e-3) is compared with an absolute tolerance too
  np.testing.assert_allclose(metrics["reward_margin"], (w * z).sum() / w.sum(), rtol=1e-4, atol=5e-6)
  np.testing.assert_allclose(metrics["accuracy"], (w * (z > 0)).sum() / w.sum())

  def plain(p):  # two separate forwards, the reference as constants
    logp = lambda side: dpo.sequence_logps(model, p, jnp.asarray(batch[f"{side}_tokens"]), batch[f"{side}_last"],
                                           batch[f"{side}_response_len"])[0]
    zz = beta * ((logp("chosen") - ref_c) - (logp("rejected") - ref_r))
    per_pair = -(1 - eps) * jax.nn.log_sigmoid(zz) - eps * jax.nn.log_sigmoid(-zz)
    return jnp.sum(w * per_pair) / jnp.sum(w)

  want_grads = jax.jit(jax.grad(plain))(params)
  jax.tree.map(lambda g, e: np.testing.assert_allclose(g, e, rtol=2e-4, atol=1e-7), grads, want_grads)


def test_policy_equal_to_the_reference_gives_log_2(models):
  model, params, _ = models
  full = with_reference(params, random_batch(2))
  _, _, metrics = grad_fn_for(dpo.DPOConfig())(params, None, full, jax.random.PRNGKey(0))
  np.testing.assert_allclose(metrics["loss"], np.log(2.0), rtol=1e-6)


def test_dir_term_is_off_until_the_step_after_warmup(models):
  """Step t <= warm-up: the DPO gradient and an untouched estimator; t = warm-up + 1: the estimator moves K steps
  and the loss adds lambda I_club of the moved estimator (float64 statement), with its gradient."""
  model, params, ref_params = models
  batch = random_batch(3)
  warm, lam = 4, 0.7
  settings = dpo.DPOConfig(dir=True, mi_warmup_steps=warm, mi_weight=lam, inner_steps=3, estimator_hidden=24,
                           estimator_lr=3e-3)
  aux = dir_estimator.init_estimator(settings, CFG.d_model, jax.random.PRNGKey(5))
  grad_fn = grad_fn_for(settings)
  plain_grads, _, plain_metrics = grad_fn_for(dpo.DPOConfig())(params, None, with_reference(ref_params, batch),
                                                               jax.random.PRNGKey(0))

  grads_off, aux_off, m_off = grad_fn(params, aux, with_reference(ref_params, batch, warm),
                                      jax.random.PRNGKey(0))
  assert float(m_off["mi_gate"]) == 0.0
  jax.tree.map(np.testing.assert_array_equal, aux_off, aux)
  np.testing.assert_allclose(m_off["loss"], plain_metrics["loss"], rtol=1e-6)
  jax.tree.map(lambda g, e: np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-8), grads_off, plain_grads)

  grads_on, aux_on, m_on = grad_fn(params, aux, with_reference(ref_params, batch, warm + 1),
                                   jax.random.PRNGKey(0))
  assert float(m_on["mi_gate"]) == 1.0
  w = batch["weights"].astype(np.float64)
  x = numpy_last_hidden(model, params, batch, "chosen") - numpy_last_hidden(model, params, batch, "rejected")
  moved, _, _ = club.inner_update(aux["q_params"], aux["q_opt_state"], jnp.asarray(x, jnp.float32),
                                  jnp.asarray(batch["bias/length"]), settings.estimator_optimizer(), 3,
                                  jnp.asarray(w, jnp.float32))
  jax.tree.map(lambda g, e: np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-7), aux_on["q_params"], moved)
  mi = numpy_club(jax.device_get(aux_on["q_params"]), x, batch["bias/length"], w)
  np.testing.assert_allclose(m_on["club"], mi, rtol=1e-4, atol=1e-6)
  np.testing.assert_allclose(m_on["loss"], float(plain_metrics["loss"]) + lam * mi, rtol=1e-5, atol=1e-6)
  assert not all(np.allclose(g, e, rtol=1e-4, atol=1e-7)
                 for g, e in zip(jax.tree.leaves(grads_on), jax.tree.leaves(plain_grads)))  # the term contributes


# ----------------------------------------------------------------------------------------------------------------
# Config


def tiny_config(**overrides):
  from experiments.configs import dpo_tiny

  config = dpo_tiny.get_config()
  config.update_from_flattened_dict(overrides)
  return config


@pytest.mark.parametrize("overrides, message", [
    ({"dpo.beta": 0.0}, "config.dpo.beta=0.0: must be in (0.0, inf]"),
    ({"dpo.label_smoothing": 0.7}, "config.dpo.label_smoothing=0.7: must be in [0.0, 0.5]"),
    ({"dpo.mi_warmup_steps": -1}, "config.dpo.mi_warmup_steps=-1: must be >= 0"),
    ({"dpo.club_mode": "sum"}, "config.dpo.club_mode='sum': must be one of difference, concat"),
    ({"dpo.inner_steps": 0}, "config.dpo.inner_steps=0: must be >= 1"),
    ({"dpo.dir": True, "dpo.bias": "sycophancy"}, "config.dpo.bias='sycophancy': not among the data's bias labels"),
    ({"dpo.dir": True, "dpo.bias_classes": 4}, "config.dpo.bias_classes=4: the bias label 'length' takes 2 values"),
    ({"data.seq_len": 100}, "config.data.seq_len=100: longer than config.model.max_seq_len=64"),
    ({"optim.grad_accum_steps": 5}, "config.optim.grad_accum_steps=5: must divide config.data.batch_size=32"),
    ({"init_from": "/nonexistent/run"}, "config.init_from='/nonexistent/run': no checkpoints/ folder"),
])
def test_config_errors_name_the_field(overrides, message):
  with pytest.raises(ConfigError) as error:
    from_section(dpo.DPORunConfig, tiny_config(**overrides), "config")
  assert message in str(error.value) and "\n" not in str(error.value), str(error.value)


def test_init_from_without_a_tokenizer_names_the_field(tmp_path):
  (tmp_path / "lm" / "checkpoints").mkdir(parents=True)
  with pytest.raises(ConfigError, match=r"config.init_from=.*/lm/tokenizer: no tokenizer \(tokenizer.json or "
                                        r"spm.model"):
    jaxpt.build("dpo", tiny_config(init_from=str(tmp_path / "lm")), str(tmp_path / "run"))


def test_tiny_config_is_valid():
  run = from_section(dpo.DPORunConfig, tiny_config(), "config")
  assert run.dpo.beta == 0.1 and not run.dpo.dir and run.init_from == ""


# ----------------------------------------------------------------------------------------------------------------
# build_dpo / train_dpo on the synthetic task (one compiled trainer for the module)

RUN = {"steps": 8, "log_every": 1, "eval_every": 0, "checkpoint_every": 0, "progress": False, "model.d_model": 32,
       "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 2, "model.mlp_dim": 64,
       "data.synthetic_train_pairs": 256, "data.synthetic_test_pairs": 32, "data.batch_size": 16,
       "optim.learning_rate": 3e-3, "optim.warmup_steps": 1, "optim.grad_accum_steps": 2, "dpo.dir": True,
       "dpo.mi_warmup_steps": 3, "dpo.estimator_hidden": 32, "dpo.inner_steps": 2}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """One build, then the whole 8-step DPO+DIR run and the same run killed at step 3 and resumed."""
  root = tmp_path_factory.mktemp("dpo")
  config = tiny_config(**RUN)
  setup = jaxpt.build("dpo", config, str(root / "whole"))  # the tokenizer is cached in the build's workdir
  whole = jaxpt.train("dpo", config, str(root / "whole"), built=setup)
  initial = jax.device_get(setup.training.init_state().params)
  reference_after = jax.device_get(setup.hooks.ref_params)
  first = jaxpt.train("dpo", config, str(root / "split"), built=setup, stop_at=3)
  resumed = jaxpt.train("dpo", config, str(root / "split"), built=setup)
  return {"root": root, "config": config, "setup": setup, "whole": whole, "first": first, "resumed": resumed,
          "initial": initial, "reference_after": reference_after}


def metrics_rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def test_loss_falls_on_the_synthetic_task(runs):
  rows = metrics_rows(runs["root"] / "whole")
  losses = [row["dpo_loss"] for row in rows]
  print(losses)
  assert losses[0] == pytest.approx(np.log(2.0), abs=1e-6)  # the policy starts as the reference
  assert losses[-1] < losses[0] - 0.1 and np.mean(losses[-3:]) < np.mean(losses[:3])
  assert rows[-1]["accuracy"] > 0.6 and np.isfinite(rows[-1]["eval_accuracy"])


def test_dir_gate_in_the_run_and_the_reference_stays_frozen(runs):
  rows = metrics_rows(runs["root"] / "whole")
  warm = RUN["dpo.mi_warmup_steps"]
  # row "step" s is the state after the update of 0-based step s - 1: on from step index warm + 1
  assert [row["mi_gate"] for row in rows] == [float(row["step"] - 1 > warm) for row in rows]
  whole = runs["whole"].state
  assert set(whole.aux) == {"q_params", "q_opt_state"}
  jax.tree.map(np.testing.assert_array_equal, runs["reference_after"], runs["initial"])  # trained: not the ref
  assert not np.array_equal(jax.device_get(whole.params["embedding"]), runs["initial"]["embedding"])
  assert jax.tree.structure(whole.opt_state) == jax.tree.structure(
      runs["setup"].training.optimizer.init(runs["initial"]))  # the optimizer holds the policy only


def test_a_killed_run_resumes_bitwise(runs):
  assert int(runs["first"].state.step) == 3 and int(runs["resumed"].state.step) == RUN["steps"]
  got, want = runs["resumed"].state, runs["whole"].state
  for a, b in zip(jax.tree.leaves((got.params, got.aux, got.opt_state)),
                  jax.tree.leaves((want.params, want.aux, want.opt_state))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@pytest.mark.slow
def test_run_writes_report_checkpoint_and_eval_gives_its_numbers(runs, capsys):
  workdir = str(runs["root"] / "whole")
  for name in ("rm_eval.json", "rm_eval.md", "score_vs_length.png", "config.json", "tokenizer/spm.model"):
    assert os.path.exists(os.path.join(workdir, name)), name
  last = runs["whole"].last_row
  report = json.load(open(os.path.join(workdir, "rm_eval.json")))
  assert report["accuracy"] == pytest.approx(last["eval_accuracy"])
  assert report["pearson_margin_length"] == pytest.approx(last["eval_pearson_margin_length"])
  row = evaluate_run(workdir)
  assert row["run"] == "dpo" and row["step"] == RUN["steps"]
  for key in ("eval_accuracy", "eval_pearson_score_length", "eval_adversarial_accuracy"):
    assert row[key] == pytest.approx(last[key], rel=1e-6, abs=1e-9), key


@pytest.mark.slow
def test_init_from_a_dpo_run_starts_policy_and_reference(runs, tmp_path):
  """A run with init_from = the whole run: its tokenizer, and its final params as both the start and reference."""
  source = str(runs["root"] / "whole")
  config = tiny_config(**{**RUN, "steps": 1, "dpo.dir": False, "init_from": source})
  setup = jaxpt.build("dpo", config, str(tmp_path / "next"))
  proto = open(os.path.join(source, "tokenizer", "spm.model"), "rb").read()
  assert setup.data.tokenizer.model_proto == proto
  assert open(tmp_path / "next" / "tokenizer" / "spm.model", "rb").read() == proto  # a later run's init_from
  state = setup.init_state()
  want = runs["whole"].state.params
  for a, b in zip(jax.tree.leaves((state.params, setup.hooks.ref_params)), jax.tree.leaves((want, want))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
