"""The reward-model trainer: BT / DIR / ODIN step gradients against plain re-statements of the equations, the DIR
estimator's inner loop and its state in TrainState.aux (checkpoint + resume), evaluation metrics against NumPy,
config errors, and the issue's must-show: DIR lowers the score-length correlation on a length-biased task."""

import functools
import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import jaxpt
from jaxpt.config import ConfigError, from_section
from jaxpt.models.config import ModelConfig
from jaxpt.models.reward import RewardModel
from jaxpt.data.synthetic_preferences import make_tagged_preferences
from jaxpt.trainers import rm, rm_eval
from jaxpt.engine.checkpoint import load_run_params
from jaxpt.engine.loop import LoopConfig, train_loop
from jaxpt.engine.state import TrainState

CFG = ModelConfig(vocab_size=64, d_model=16, num_layers=1, num_heads=2, num_kv_heads=2, mlp_dim=32, max_seq_len=8)
B, S, HIDDEN, K = 6, 8, 24, 3


def random_batch(seed: int, batch: int = B) -> dict:
  """A preference batch of the data layer's form: right-padded tokens, last indices, counts, bias, weights."""
  rng = np.random.default_rng(seed)
  out = {}
  for side in ("chosen", "rejected"):
    last = rng.integers(1, S, batch).astype(np.int32)
    tokens = rng.integers(1, CFG.vocab_size, (batch, S)).astype(np.int32)
    tokens[np.arange(S)[None, :] > last[:, None]] = 0
    out.update({f"{side}_tokens": tokens, f"{side}_last": last, f"{side}_response_len": last - 1 + rng.integers(0, 2)})
  out["bias"] = {"length": (out["chosen_response_len"] > out["rejected_response_len"]).astype(np.int32),
                 "other": rng.integers(0, 2, batch).astype(np.int32)}
  out["weights"] = np.ones(batch, np.float32)
  out["weights"][-1] = 0.0  # a padding pair
  return out


def settings_for(loss: str, **overrides) -> rm.RMConfig:
  values = dict(loss=loss, margin=0.3, label_smoothing=0.1, center_coef=0.05, mi_weight=0.7, inner_steps=K,
                estimator_hidden=HIDDEN, estimator_lr=3e-3, odin_corr_coef=0.8, odin_ortho_coef=0.6,
                odin_length_sign="shorter")
  return rm.RMConfig(**{**values, **overrides})


@functools.lru_cache(maxsize=None)
def _init(num_scores: int):
  model = RewardModel(CFG, num_scores)
  init = jax.jit(lambda key: nn.meta.unbox(model.init(key, jnp.zeros((1, S), jnp.int32),
                                                      jnp.zeros((1,), jnp.int32))["params"]))
  return model, init(jax.random.PRNGKey(0))


def model_params(settings: rm.RMConfig):
  """(RewardModel, params) for the loss's number of heads, initialised once per test session."""
  return _init(settings.objective.num_scores)


# ----------------------------------------------------------------------------------------------------------------
# Plain re-statements (two separate forwards, explicit sums), differentiated with one jax.grad of the whole loss.


def wmean(v, w):
  return jnp.sum(w * v) / jnp.sum(w)


def plain_forward(model, params, batch):
  rc, hc = model.apply({"params": params}, batch["chosen_tokens"], batch["chosen_last"])
  rr, hr = model.apply({"params": params}, batch["rejected_tokens"], batch["rejected_last"])
  return rc, rr, hc, hr


def plain_bt(rc, rr, w, s):
  z = rc - rr - s.margin
  per_pair = -(1 - s.label_smoothing) * jnp.log(jax.nn.sigmoid(z)) - s.label_smoothing * jnp.log(jax.nn.sigmoid(-z))
  return wmean(per_pair, w) + s.center_coef * wmean((rc + rr) ** 2, w)


def plain_log_q(q, x):
  return jax.nn.log_softmax(jnp.maximum(x @ q["w1"] + q["b1"], 0.0) @ q["w2"] + q["b2"])


def plain_club(q, x, a, w):
  """(1/N) sum_i log q(a_i|X_i) - (1/N^2) sum_i sum_j log q(a_j|X_i), w-weighted, as an explicit N x N sum."""
  logq = plain_log_q(q, x)
  pairs = logq[:, a]  # [i, j] = log q(a_j | X_i)
  positive = wmean(jnp.diagonal(pairs), w)
  negative = jnp.sum(w[:, None] * w[None, :] * pairs) / jnp.sum(w) ** 2
  return positive - negative


def plain_corr(x, y, w):
  xc, yc = x - wmean(x, w), y - wmean(y, w)
  return wmean(xc * yc, w) / jnp.sqrt(wmean(xc * xc, w) * wmean(yc * yc, w))


def plain_loss(model, settings, params, batch, q=None):
  w = jnp.asarray(batch["weights"])
  rc, rr, hc, hr = plain_forward(model, params, batch)
  if settings.loss == "bt":
    return plain_bt(rc, rr, w, settings)
  if settings.loss == "dir":
    x = hc - hr if settings.club_mode == "difference" else jnp.concatenate([hc, hr], -1)
    return plain_bt(rc, rr, w, settings) + settings.mi_weight * plain_club(q, x, batch["bias"][settings.bias], w)
  lengths = jnp.concatenate([batch["chosen_response_len"], batch["rejected_response_len"]]).astype(jnp.float32)
  w2 = jnp.concatenate([w, w])
  quality, length = jnp.concatenate([rc[:, 0], rr[:, 0]]), jnp.concatenate([rc[:, 1], rr[:, 1]])
  kernel = params["head"]["kernel"]
  return (plain_bt(rc[:, 0] + rc[:, 1], rr[:, 0] + rr[:, 1], w, settings)
          + settings.odin_corr_coef * (jnp.abs(plain_corr(quality, lengths, w2))
                                       - {"longer": 1.0, "shorter": -1.0}[settings.odin_length_sign]
                                       * plain_corr(length, lengths, w2))
          + settings.odin_ortho_coef * jnp.abs(jnp.sum(kernel[:, 0] * kernel[:, 1])))


def plain_estimator_update(settings, q, x, a, w):
  """K AdamW steps of -mean_w log q(a | X) on a fixed X, one Python loop iteration per step."""
  optimizer = optax.adamw(settings.estimator_lr, weight_decay=settings.estimator_weight_decay)
  state = optimizer.init(q)
  nll = lambda q: -wmean(jnp.take_along_axis(plain_log_q(q, x), a[:, None], 1)[:, 0], w)

  @jax.jit
  def step(q, state):
    updates, state = optimizer.update(jax.grad(nll)(q), state, q)
    return optax.apply_updates(q, updates), state

  for _ in range(settings.inner_steps):
    q, state = step(q, state)
  return q, state


def trees_allclose(a, b) -> bool:
  return all(np.allclose(x, y, rtol=1e-3, atol=1e-6) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def assert_trees_close(got, want, rtol=2e-4, atol=1e-6):
  jax.tree.map(lambda g, e: np.testing.assert_allclose(np.asarray(g), np.asarray(e), rtol=rtol, atol=atol), got, want)


# ----------------------------------------------------------------------------------------------------------------
# Step gradients


@pytest.mark.parametrize("loss", ["bt", "odin"])
def test_step_gradient_matches_plain_equations(loss):
  settings = settings_for(loss)
  model, params = model_params(settings)
  batch = random_batch(1)
  grads, aux, metrics = jax.jit(rm.make_rm_grad_fn(model, settings))(
      params, None, rm.flatten_batch(batch), jax.random.PRNGKey(0))
  want_loss, want = jax.jit(jax.value_and_grad(lambda p: plain_loss(model, settings, p, batch)))(params)
  assert aux is None
  np.testing.assert_allclose(metrics["loss"], want_loss, rtol=1e-5)
  assert float(metrics["num_pairs"]) == B - 1
  assert_trees_close(grads, want)


@pytest.mark.parametrize("mode", ["difference", "concat"])
def test_dir_step_matches_plain_equations_after_the_same_estimator_update(mode):
  settings = settings_for("dir", club_mode=mode, bias="other")
  model, params = model_params(settings)
  batch = random_batch(2)
  aux = rm.init_estimator(settings, CFG.d_model, jax.random.PRNGKey(5))
  grads, new_aux, metrics = jax.jit(rm.make_rm_grad_fn(model, settings))(
      params, aux, rm.flatten_batch(batch), jax.random.PRNGKey(0))

  w, a = jnp.asarray(batch["weights"]), jnp.asarray(batch["bias"]["other"])
  _, _, hc, hr = plain_forward(model, params, batch)
  x = hc - hr if mode == "difference" else jnp.concatenate([hc, hr], -1)
  q, q_state = plain_estimator_update(settings, aux["q_params"], x, a, w)
  assert_trees_close(new_aux["q_params"], q, rtol=1e-5)
  assert_trees_close(new_aux["q_opt_state"], q_state, rtol=1e-5)
  assert not np.allclose(new_aux["q_params"]["w1"], aux["q_params"]["w1"])  # the estimator moved

  want_loss, want = jax.jit(jax.value_and_grad(lambda p: plain_loss(model, settings, p, batch, q)))(params)
  np.testing.assert_allclose(metrics["loss"], want_loss, rtol=1e-5)
  assert_trees_close(grads, want)
  bt_only = jax.jit(jax.grad(lambda p: plain_loss(model, settings_for("bt"), p, batch)))(params)
  assert not trees_allclose(grads["backbone"], bt_only["backbone"])  # the CLUB term contributes


def test_rm_gradient_never_reaches_the_estimator_and_the_inner_loop_ignores_the_rm_loss():
  settings = settings_for("dir")
  model, params = model_params(settings)
  batch = rm.flatten_batch(random_batch(2))  # real pairs with both labels (one label only: I_club = 0 exactly)
  aux = rm.init_estimator(settings, CFG.d_model, jax.random.PRNGKey(1))
  tokens, last = rm.pair_tokens(batch)
  scores, hidden = model.apply({"params": params}, tokens, last)
  q_grad = jax.grad(lambda q: rm.rm_objective(settings, scores, hidden, params["head"]["kernel"], batch, q)[0])(
      aux["q_params"])
  assert all(np.all(np.asarray(g) == 0) for g in jax.tree.leaves(q_grad))

  results = {}
  for mi_weight in (0.0, 0.1, 5.0):
    fn = jax.jit(rm.make_rm_grad_fn(model, settings_for("dir", mi_weight=mi_weight)))
    results[mi_weight] = fn(params, aux, batch, jax.random.PRNGKey(0))
  for mi_weight in (0.1, 5.0):  # the estimator update sees only X: identical whatever the RM loss weight
    jax.tree.map(np.testing.assert_array_equal, results[mi_weight][1], results[0.0][1])
  bt_grads, _, _ = jax.jit(rm.make_rm_grad_fn(model, settings_for("bt")))(params, None, batch, jax.random.PRNGKey(0))
  assert_trees_close(results[0.0][0], bt_grads, rtol=1e-6)  # lambda = 0: DIR is BT
  assert not trees_allclose(results[5.0][0]["backbone"], bt_grads["backbone"])


def test_gradient_accumulation_carries_the_estimator_across_micro_batches():
  settings = settings_for("dir")
  model, params = model_params(settings)
  optimizer = optax.sgd(1.0)
  batch = rm.flatten_batch(random_batch(4, batch=8))
  aux = rm.init_estimator(settings, CFG.d_model, jax.random.PRNGKey(2))
  state = TrainState.create(params, optimizer, jax.random.PRNGKey(0), aux=aux)
  step = jax.jit(rm.make_rm_train_step(model, settings, optimizer, optax.constant_schedule(1.0), grad_accum_steps=2))
  new_state, metrics = step(state, batch)

  grad_fn = jax.jit(rm.make_rm_grad_fn(model, settings))
  rng = state.step_rng()
  halves = [jax.tree.map(lambda v: v[i * 4:(i + 1) * 4], batch) for i in range(2)]
  g0, aux0, m0 = grad_fn(params, aux, halves[0], jax.random.fold_in(rng, 0))
  g1, aux1, m1 = grad_fn(params, aux0, halves[1], jax.random.fold_in(rng, 1))
  n0, n1 = float(m0["num_pairs"]), float(m1["num_pairs"])
  assert (n0, n1) == (4.0, 3.0)
  expected = jax.tree.map(lambda a, b, p: p - (n0 * a + n1 * b) / (n0 + n1), g0, g1, params)
  assert_trees_close(new_state.params, expected, rtol=1e-5)
  assert_trees_close(new_state.aux, aux1, rtol=1e-5)
  np.testing.assert_allclose(metrics["loss"], (n0 * m0["loss"] + n1 * m1["loss"]) / (n0 + n1), rtol=1e-6)


@pytest.mark.slow  # the train loop alone; test_train_rm_with_dir_resumes_bitwise runs the same through train_rm
def test_estimator_state_is_checkpointed_and_a_resumed_run_is_bitwise_identical(tmp_path):
  settings = settings_for("dir")
  model, params = model_params(settings)
  optimizer = optax.adamw(1e-2)
  step = jax.jit(rm.make_rm_train_step(model, settings, optimizer, optax.constant_schedule(1e-2)))
  fresh = lambda: TrainState.create(params, optimizer, jax.random.PRNGKey(0),
                                    aux=rm.init_estimator(settings, CFG.d_model, jax.random.PRNGKey(1)))

  def batches(start):
    index = start
    while True:
      yield rm.flatten_batch(random_batch(100 + index))
      index += 1

  config = LoopConfig(steps=6, log_every=3, progress=False)
  whole = train_loop(fresh(), step, batches, config, str(tmp_path / "whole")).state
  first = train_loop(fresh(), step, batches, config, str(tmp_path / "resumed"), stop_at=3).state
  assert int(first.step) == 3
  resumed = train_loop(fresh(), step, batches, config, str(tmp_path / "resumed")).state  # restores step 3
  assert int(resumed.step) == 6
  jax.tree.map(np.testing.assert_array_equal, resumed.params, whole.params)
  jax.tree.map(np.testing.assert_array_equal, resumed.aux, whole.aux)
  assert not np.array_equal(whole.aux["q_params"]["w1"], fresh().aux["q_params"]["w1"])


# ----------------------------------------------------------------------------------------------------------------
# Evaluation metrics


def test_rankdata_and_spearman_with_ties():
  x = [3.0, 1.0, 4.0, 1.0, 5.0, 9.0, 2.0, 6.0, 5.0, 3.0]
  np.testing.assert_array_equal(rm_eval.rankdata(x), [4.5, 1.5, 6, 1.5, 7.5, 10, 3, 9, 7.5, 4.5])
  y = [2.0, 7.0, 1.0, 8.0, 2.0, 8.0, 1.0, 8.0, 2.0, 8.0]
  ry = np.array([4, 6, 1.5, 8.5, 4, 8.5, 1.5, 8.5, 4, 8.5])  # by hand: 1,1 -> 1.5; 2,2,2 -> 4; 7 -> 6; 8 x4 -> 8.5
  np.testing.assert_array_equal(rm_eval.rankdata(y), ry)
  rx = rm_eval.rankdata(x)
  expected = np.corrcoef(rx, ry)[0, 1]
  np.testing.assert_allclose(rm_eval.spearman(x, y), expected, rtol=1e-12)
  np.testing.assert_allclose(rm_eval.pearson(x, y), np.corrcoef(x, y)[0, 1], rtol=1e-12)
  assert rm_eval.spearman([1, 2, 3], [5, 6, 70]) == pytest.approx(1.0)
  assert rm_eval.pearson([1, 2, 3], [4, 4, 4]) == 0.0


def test_evaluate_pairs_by_hand():
  rc = [2.0, 0.5, 1.0, -1.0, 3.0, 0.0]
  rr = [1.0, 1.5, 1.0, -2.0, 2.0, 1.0]  # correct: T F F(tie) T T F
  lc = [10, 3, 5, 8, 4, 6]
  lr = [5, 6, 5, 2, 9, 1]  # chosen longer: 0, 3, 5; shorter: 1, 4; equal: 2
  syc = ["natural", "adversarial", "natural", "natural", "adversarial", "natural"]
  res = rm_eval.evaluate_pairs(rc, rr, lc, lr, {"length": [1, 0, 0, 1, 0, 1]}, {"sycophancy": syc})
  assert res["accuracy"] == pytest.approx(3 / 6) and res["num_pairs"] == 6
  assert res["chosen_longer"] == {"accuracy": pytest.approx(2 / 3), "num_pairs": 3}
  assert res["chosen_shorter"] == {"accuracy": pytest.approx(1 / 2), "num_pairs": 2}
  assert res["bias"]["length"]["a0"] == {"accuracy": pytest.approx(1 / 3), "num_pairs": 3}
  assert res["groups"]["sycophancy"]["natural"]["accuracy"] == pytest.approx(2 / 4)
  assert res["groups"]["sycophancy"]["adversarial"]["accuracy"] == pytest.approx(1 / 2)
  scores, lengths = np.array(rc + rr), np.array(lc + lr, float)
  assert res["pearson_score_length"] == pytest.approx(np.corrcoef(scores, lengths)[0, 1])
  margin_vs_length = np.corrcoef(np.subtract(rc, rr), np.subtract(lc, lr))[0, 1]
  assert res["pearson_margin_length"] == pytest.approx(margin_vs_length)
  scalars = rm_eval.scalar_metrics(res)
  assert scalars["eval_accuracy_sycophancy_natural"] == pytest.approx(0.5)
  assert scalars["eval_accuracy_length_a1"] == pytest.approx(2 / 3)


def test_write_report(tmp_path):
  res = rm_eval.evaluate_pairs([1.0, 2.0], [0.0, 3.0], [4, 5], [6, 2], {"length": [0, 1]})
  paths = rm_eval.write_report(str(tmp_path), res, [1.0, 2.0], [0.0, 3.0], [4, 5], [6, 2], "t")
  assert json.load(open(paths["json"]))["accuracy"] == 0.5
  table = open(paths["markdown"]).read()
  assert "| pairwise accuracy | 0.500 | 2 |" in table and "Spearman" in table
  assert os.path.getsize(paths["plot"]) > 1000


# ----------------------------------------------------------------------------------------------------------------
# Config


def tiny_config(**overrides):
  from experiments.configs import rm_tiny

  config = rm_tiny.get_config()
  for key, value in overrides.items():
    node = config
    *parents, leaf = key.split(".")
    for part in parents:
      node = node[part]
    node[leaf] = value
  return config


@pytest.mark.parametrize("overrides, message", [
    ({"rm.loss": "hinge"}, "config.rm.loss='hinge': must be one of bt, dir, odin"),
    ({"rm.loss": "dir", "rm.bias": "sycophancy"}, "config.rm.bias='sycophancy': not among"),
    ({"rm.loss": "dir", "rm.bias_classes": 3}, "config.rm.bias_classes=3: the bias label 'length' takes 2 values"),
    ({"rm.club_mode": "sum"}, "config.rm.club_mode='sum'"),
    ({"rm.odin_length_sign": "up"}, "config.rm.odin_length_sign='up': must be one of auto, longer, shorter"),
    ({"rm.inner_steps": 0}, "config.rm.inner_steps=0: must be >= 1"),
    ({"rm.label_smoothing": 0.7}, "config.rm.label_smoothing=0.7"),
    ({"data.length_bias": 1.5}, "config.data.length_bias=1.5: must be in [0.0, 1.0]"),
    ({"data.synthetic_task": "trivia"}, "config.data.synthetic_task='trivia': must be one of arithmetic, tagged"),
    ({"data.label_noise": 0.1}, "config.data.label_noise=0.1: only the tagged synthetic task has label noise"),
    ({"data.synthetic_task": "tagged", "data.label_noise": 0.5}, "config.data.label_noise=0.5: must be in"),
    ({"data.seq_len": 200}, "config.data.seq_len=200: longer than config.model.max_seq_len=128"),
    ({"optim.grad_accum_steps": 5}, "config.optim.grad_accum_steps=5: must divide"),
    ({"init_from": "/nonexistent/run"}, "config.init_from='/nonexistent/run'"),
])
def test_config_errors_name_the_field(overrides, message):
  with pytest.raises(ConfigError, match=None) as error:
    from_section(rm.RMRunConfig, tiny_config(**overrides), "config")
  assert message in str(error.value), str(error.value)


def test_train_rm_with_dir_resumes_bitwise(tmp_path):
  """build_rm -> train_rm (shared builder and step, estimator in aux, 2 micro-batches): stop at 3 and resume
  equals the uninterrupted run, params and estimator state (which trained: it is checkpointed, not rebuilt)."""
  config = tiny_config(**{
      "steps": 6, "log_every": 3, "eval_every": 0, "checkpoint_every": 0, "progress": False, "model.d_model": 32,
      "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 2, "model.mlp_dim": 64,
      "data.synthetic_train_pairs": 256, "data.synthetic_test_pairs": 64, "data.batch_size": 16, "rm.loss": "dir",
      "rm.estimator_hidden": 32, "optim.grad_accum_steps": 2})
  setup = jaxpt.build("rm", config, str(tmp_path / "data"))
  whole = jaxpt.train("rm", config, str(tmp_path / "whole"), built=setup).state
  assert int(jaxpt.train("rm", config, str(tmp_path / "split"), built=setup, stop_at=3).state.step) == 3
  resumed = jaxpt.train("rm", config, str(tmp_path / "split"), built=setup).state
  assert int(resumed.step) == 6
  for got, want in zip(jax.tree.leaves((resumed.params, resumed.aux)), jax.tree.leaves((whole.params, whole.aux))):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
  start = setup.init_state().aux
  assert not np.array_equal(np.asarray(whole.aux["q_params"]["w1"]), np.asarray(start["q_params"]["w1"]))


def test_tiny_config_is_valid():
  run = from_section(rm.RMRunConfig, tiny_config(), "config")
  assert run.rm.loss == "bt" and run.model.d_model == 64


# ----------------------------------------------------------------------------------------------------------------
# The must-show, end to end through build_rm / train_rm on the learnable synthetic task ('tagged': the
# preference is the quality tag ending each response, 20% of training labels disagree with the tag, and the chosen
# response is the longer one in 90% of training pairs, so length predicts the training label better than the tag).

MUST_SHOW = {
    "steps": 150, "log_every": 50, "eval_every": 0, "checkpoint_every": 0, "progress": False,
    "model.d_model": 32, "model.num_layers": 2, "model.num_heads": 2, "model.num_kv_heads": 2, "model.mlp_dim": 64,
    "data.synthetic_task": "tagged", "data.length_bias": 0.9, "data.label_noise": 0.2,
    "data.synthetic_train_pairs": 2048, "data.synthetic_test_pairs": 256,
    "rm.estimator_hidden": 64, "rm.estimator_lr": 1e-3, "rm.mi_weight": 1.0,
}


@pytest.fixture(scope="module")
def bt_and_dir_runs(tmp_path_factory):
  """{loss: (workdir, LoopResult)}: BT and DIR (lambda 1) on the same data, init and seed."""
  runs = {}
  for loss in ("bt", "dir"):
    workdir = str(tmp_path_factory.mktemp(f"must_show_{loss}"))
    config = tiny_config(**MUST_SHOW, **{"rm.loss": loss})
    runs[loss] = workdir, jaxpt.train("rm", config, workdir)
  return runs


def balanced_accuracy(report: dict) -> float:
  """Mean of the accuracies on the pairs whose chosen response is longer and on those where it is shorter."""
  return (report["chosen_longer"]["accuracy"] + report["chosen_shorter"]["accuracy"]) / 2


def must_show_failures(bt: dict, dir_: dict, bt_adversarial: dict, dir_adversarial: dict) -> list[str]:
  """The conditions of the must-show that the reports break ([] = shown). Reports: rm_eval.json dicts of the
  de-biased 'test' split (P(chosen longer) = 0.5) and of the 'adversarial' split (chosen always shorter)."""
  checks = {
      "BT leans on length: balanced accuracy < 0.7": balanced_accuracy(bt) < 0.7,
      "BT leans on length: adversarial accuracy < 0.4": bt_adversarial["accuracy"] < 0.4,
      "DIR learns the preference: balanced accuracy >= 0.75": balanced_accuracy(dir_) >= 0.75,
      "DIR beats BT's balanced accuracy by >= 0.15": balanced_accuracy(dir_) >= balanced_accuracy(bt) + 0.15,
      "DIR beats BT's adversarial accuracy by >= 0.3": dir_adversarial["accuracy"] >= bt_adversarial["accuracy"] + 0.3,
      "DIR's |Pearson(score, length)| is lower than BT's by >= 0.1":
          abs(dir_["pearson_score_length"]) <= abs(bt["pearson_score_length"]) - 0.1,
  }
  return [claim for claim, holds in checks.items() if not holds]


def reports(workdir: str) -> tuple[dict, dict]:
  return (json.load(open(os.path.join(workdir, rm_eval.REPORT_JSON))),
          json.load(open(os.path.join(workdir, "eval_adversarial", rm_eval.REPORT_JSON))))


def test_dir_removes_the_length_shortcut_that_bt_learns(bt_and_dir_runs):
  (bt, bt_adv), (dir_, dir_adv) = (reports(bt_and_dir_runs[loss][0]) for loss in ("bt", "dir"))
  print({name: (balanced_accuracy(r), adv["accuracy"], r["pearson_score_length"])
         for name, r, adv in (("bt", bt, bt_adv), ("dir", dir_, dir_adv))})
  assert bt["split"] == "test" and bt["num_pairs"] == 256 and bt_adv["num_pairs"] == 256
  assert must_show_failures(bt, dir_, bt_adv, dir_adv) == []


def test_the_must_show_fails_for_a_reward_model_at_chance(bt_and_dir_runs):
  """A scorer that flips a coin (random scores on the same test pairs), or one that is BT itself, fails it."""
  (bt, bt_adv), _ = (reports(bt_and_dir_runs[loss][0]) for loss in ("bt", "dir"))
  pairs = {split: make_tagged_preferences(256, 0, split) for split in ("test", "adversarial")}
  rng = np.random.default_rng(0)
  coin = {split: rm_eval.evaluate_pairs(rng.normal(size=256), rng.normal(size=256),
                                        [len(p.chosen) for p in pairs[split]], [len(p.rejected) for p in pairs[split]])
          for split in pairs}
  assert abs(balanced_accuracy(coin["test"]) - 0.5) < 0.1
  assert "DIR learns the preference: balanced accuracy >= 0.75" in must_show_failures(
      bt, coin["test"], bt_adv, coin["adversarial"])
  assert must_show_failures(bt, bt, bt_adv, bt_adv)


def test_rm_run_writes_metrics_report_and_checkpoint(bt_and_dir_runs):
  workdir, result = bt_and_dir_runs["dir"]
  assert int(result.state.step) == MUST_SHOW["steps"] and not result.preempted
  for name in (rm_eval.REPORT_JSON, rm_eval.REPORT_MD, rm_eval.REPORT_PNG, "metrics.jsonl", "config.json"):
    assert os.path.exists(os.path.join(workdir, name)), name
  assert os.path.exists(os.path.join(workdir, "eval_adversarial", rm_eval.REPORT_JSON))
  last = result.last_row
  for key in ("loss", "club", "estimator_loss", "eval_accuracy", "eval_pearson_score_length",
              "eval_adversarial_accuracy", "eval_accuracy_chosen_longer"):
    assert np.isfinite(last[key]), key
  assert set(result.state.aux) == {"q_params", "q_opt_state"}


def test_backbone_initialised_from_a_language_model_checkpoint(tmp_path):
  from jaxpt.models.transformer import TransformerLM
  from jaxpt.engine.checkpoint import Checkpointer

  lm_init = jax.jit(lambda key: nn.meta.unbox(TransformerLM(CFG).init(key, jnp.zeros((1, S), jnp.int32))["params"]))
  lm_params = lm_init(jax.random.PRNGKey(7))
  checkpointer = Checkpointer(str(tmp_path / "lm"))
  checkpointer.save(TrainState.create(lm_params, optax.adam(1e-3), jax.random.PRNGKey(0)))
  checkpointer.close()
  _, params = model_params(settings_for("bt"))
  loaded = load_run_params(str(tmp_path / "lm"), params["backbone"])
  jax.tree.map(np.testing.assert_array_equal, loaded, lm_params)

  with pytest.raises(ConfigError, match="config.init_from=.*no checkpoint"):
    load_run_params(str(tmp_path), params["backbone"])
  wider = ModelConfig(**{**CFG.__dict__, "mlp_dim": 48})
  wider_params = jax.eval_shape(lambda: nn.meta.unbox(RewardModel(wider).init(
      jax.random.PRNGKey(0), jnp.zeros((1, S), jnp.int32), jnp.zeros((1,), jnp.int32))["params"]))
  with pytest.raises(ConfigError, match="config.init_from="):
    load_run_params(str(tmp_path / "lm"), wider_params["backbone"])


def test_evaluator_drops_padding_pairs_and_uses_the_meta_columns():
  settings = settings_for("odin")  # two heads: the evaluator scores with the quality head r_Q
  model, params = model_params(settings)
  batches = [rm.flatten_batch(random_batch(seed)) for seed in (10, 11)]  # each with one weight-0 padding pair
  real = [{k: v[:-1] for k, v in b.items()} for b in batches]
  meta = {"bias/length": np.concatenate([b["bias/length"] for b in real]),
          "sycophancy": np.array(["natural", "adversarial"] * (B - 1)), "line": np.arange(2 * (B - 1))}
  evaluator = rm.RMEvaluator(model, {"test": (batches, meta)})
  results, scored = evaluator.results(TrainState.create(params, optax.sgd(0.1), jax.random.PRNGKey(0)), "test")
  rc = np.concatenate([model.apply({"params": params}, b["chosen_tokens"], b["chosen_last"])[0][:, 0] for b in real])
  rr = np.concatenate([model.apply({"params": params}, b["rejected_tokens"], b["rejected_last"])[0][:, 0]
                       for b in real])
  np.testing.assert_allclose(scored["chosen_scores"], rc, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(scored["rejected_scores"], rr, rtol=1e-5, atol=1e-6)
  lc = np.concatenate([b["chosen_response_len"] for b in real])
  lr = np.concatenate([b["rejected_response_len"] for b in real])
  expected = rm_eval.evaluate_pairs(rc, rr, lc, lr, {"length": meta["bias/length"]}, {"sycophancy": meta["sycophancy"]})
  assert results["num_pairs"] == 2 * (B - 1) and results["accuracy"] == pytest.approx(expected["accuracy"])
  for group in ("natural", "adversarial"):
    assert results["groups"]["sycophancy"][group]["num_pairs"] == B - 1
    assert results["groups"]["sycophancy"][group]["accuracy"] == pytest.approx(
        expected["groups"]["sycophancy"][group]["accuracy"])
  assert results["pearson_score_length"] == pytest.approx(expected["pearson_score_length"], rel=1e-4)
  assert evaluator(TrainState.create(params, optax.sgd(0.1), jax.random.PRNGKey(0)))["eval_accuracy"] == \
      pytest.approx(expected["accuracy"])
