"""GRPO (and GRPO + CLIPO, DAPO, a reward model) on 8 simulated CPU devices equals the single-device run (run by
tests/test_parallel_sharded.py in its own process; directly: python -m pytest tests/multidevice/sharded_grpo.py).
The rollout engine (`jaxpt.rl.engine`, one engine per data-parallel group) on the mesh equals one engine on one
device and the static sampler with per-rollout keys, and its generation rounds (`Engine.rounds`, compiled as the
collector compiles them) each round's call on one device; a GRPO step through it on the mesh equals one through the
static sampler (per-rollout keys) on the same mesh, and DAPO through it (its rounds streamed) the one-device run.

The single-device reference is the same trainer on a mesh of the first device; the run is `tests.micro_grpo`'s.
"""

import os

from tests.xla_flags import suite_xla_flags

os.environ["XLA_FLAGS"] = suite_xla_flags(os.environ.get("XLA_FLAGS", ""), 8)

import dataclasses  # noqa: E402
import functools  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import jaxpt  # noqa: E402
from jaxpt.trainers.grpo import replace_hooks  # noqa: E402
from jaxpt import parallel  # noqa: E402
from jaxpt.rl.engine import Engine, EngineConfig  # noqa: E402
from jaxpt.rl.rollouts import repeat_prompts  # noqa: E402
from jaxpt.rl.sampler import make_sampler  # noqa: E402
from jaxpt.engine.metrics import read_metrics  # noqa: E402
from tests.micro_grpo import DAPO, B, G, T, even_length, micro_config, scratch_workdir  # noqa: E402

MESHES = {"dp": dict(data=8), "fsdp": dict(data=1, fsdp=8), "fsdp_tp": dict(data=2, fsdp=2, tensor=2)}
KEYS = ("reward_mean", "accuracy", "loss", "pg_loss", "ppo_kl", "grad_norm", "eval_accuracy_test", "bias_format_share")
VARIANT_KEYS = {"grpo": (), "clipo": ("clipo_loss", "clipo_reward_mean"),
                "dapo": ("dapo_rounds", "dapo_groups_informative", "truncated_frac", "overlong_penalty_mean"),
                "engine": (), "row_keys": ()}
VARIANT_KEYS["dapo_engine"] = VARIANT_KEYS["dapo"]
VARIANT_KEYS["clipo_dapo"] = VARIANT_KEYS["clipo"] + VARIANT_KEYS["dapo"]
VARIANT_KEYS["clipo_rm"] = VARIANT_KEYS["clipo"] + ("rm_score", "gold_score")
# CLIPO's in-loss term reads the loss mask that overlong filtering empties, so the two are not combined (config.py)
CLIPO_DAPO = {**DAPO, "dapo.overlong_filtering": False}
# the static sampler with the engine's per-rollout keys; one step
ROW_KEYS = {"sampling.row_keys": True, "steps": 1}
ENGINE = {**ROW_KEYS, "engine.enabled": True, "engine.num_slots": 2, "engine.page_size": 4}  # slots refilled
CASES = [(v, p) for v in ("grpo", "clipo") for p in MESHES] + [("dapo", "fsdp"), ("dapo", "fsdp_tp"),
                                                                ("dapo_engine", "fsdp_tp"), ("clipo_dapo", "fsdp"),
                                                                ("clipo_rm", "fsdp_tp")]


@functools.cache
def reward_model_run() -> str:
  """A 1-step micro reward-model run (its own tokenizer: GRPO re-tokenizes the rollouts' text for it)."""
  from experiments.configs import rm_tiny

  workdir = scratch_workdir("rm-")
  config = rm_tiny.get_config()
  config.update_from_flattened_dict({
      "steps": 1, "log_every": 1, "eval_every": 0, "checkpoint_every": 1, "progress": False, "model.d_model": 32,
      "model.num_layers": 1, "model.num_heads": 2, "model.num_kv_heads": 2, "model.mlp_dim": 64, "data.batch_size": 8,
      "data.synthetic_train_pairs": 16, "data.synthetic_test_pairs": 8, "rm.estimator_hidden": 16,
      "optim.warmup_steps": 0})
  jaxpt.train("rm", config, workdir)
  return workdir


def variant_config(variant, **overrides):
  """micro_config of the variant: grpo, clipo (CLIPO on), dapo (dynamic sampling, overlong filtering and penalty),
  clipo_dapo (both, without overlong filtering), dapo_engine (dapo through the rollout engine, its rounds streamed)
  or clipo_rm (CLIPO on, and the verifier plus a reward model, running normalisation and clipping)."""
  if variant == "clipo_rm":
    overrides = {"reward.model": reward_model_run(), "reward.model_weight": 0.5, "reward.normalize": "running",
                 "reward.clip": 2.0, "reward.eos_missing_penalty": 0.25, **overrides}
  extra = {"dapo": DAPO, "clipo_dapo": CLIPO_DAPO, "engine": ENGINE, "row_keys": ROW_KEYS,
           "dapo_engine": {**DAPO, "engine.enabled": True, "engine.num_slots": 2, "engine.page_size": 4}
           }.get(variant, {})
  return micro_config(variant in ("clipo", "clipo_dapo", "clipo_rm"), **extra, **overrides)


@functools.cache
def run(variant, preset):
  """Two GRPO steps: (metrics rows, final state as numpy, the trainer, the final state)."""
  workdir = scratch_workdir(f"{variant}-{preset.replace(' ', '_')}-")
  if preset == "one device":
    real = parallel.make_mesh
    with pytest.MonkeyPatch.context() as patch:
      patch.setattr(parallel, "make_mesh", lambda mesh_config: real(mesh_config, jax.devices()[:1]))
      trainer = jaxpt.build("grpo", variant_config(variant, **{"mesh.data": 1}), workdir)
  else:
    mesh = {f"mesh.{axis}": size for axis, size in dict(MESHES[preset], rules=preset).items()}
    trainer = jaxpt.build("grpo", variant_config(variant, **mesh), workdir)
  trainer = replace_hooks(trainer, reward_fn=even_length)
  result = jaxpt.train("grpo", trainer.config, workdir, built=trainer)
  return read_metrics(workdir), jax.tree.map(np.asarray, result.state), trainer, result.state


# the default suite's case: CLIPO with a reward model on data x fsdp x tensor (every mesh axis); DAPO on the mesh is
# in the `slow` cases (its dynamic sampling and refills are host-side, tested on one device in test_train_dapo.py;
# its engine rounds on 8 devices below), and so are the other meshes (tests/test_parallel_sharded)
DEFAULT_CASES = {("clipo_rm", "fsdp_tp")}


@pytest.mark.parametrize("variant,preset", [c if c in DEFAULT_CASES else pytest.param(*c, marks=pytest.mark.slow)
                                            for c in CASES])
def test_two_steps_on_8_devices_equal_one_device(variant, preset):
  want_rows, want, _, _ = run(variant, "one device")
  rows, got, trainer, state = run(variant, preset)
  assert 0 < want_rows[0]["accuracy"] < 1  # mixed groups: non-zero advantages
  if variant == "clipo_rm":  # the reward model's params sharded by the run's rules, like the policy's
    rm_params = trainer.hooks.reward_model.params
    assert not trainer.hooks.reward_model.shared
    assert jax.tree.leaves(rm_params)[0].sharding.mesh.devices.size == 8
  for key in KEYS + VARIANT_KEYS[variant]:
    np.testing.assert_allclose([r[key] for r in rows if key in r], [r[key] for r in want_rows if key in r],
                               rtol=2e-5, atol=1e-6, err_msg=key)
  # AdamW normalises each gradient entry, so one at rounding level (an embedding row seen once) can step by a
  # sizeable part of lr (1e-3) in either run: atol 1e-5; with the reward model's scores (summed over a sharded
  # d_model) whitened by the running statistics, the rewards themselves differ at rounding level: atol 1e-4
  atol = 1e-4 if variant == "clipo_rm" else 1e-5
  for path, g, w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=atol, err_msg=jax.tree_util.keystr(path[0]))
  # really sharded: the parameters as the rules say, the sampler's rollouts split over data x fsdp
  kernel = state.params["decoder"]["layers"]["attn"]["query"]["kernel"]  # [layers, embed, heads, kv]
  split = {"dp": (2, 32, 2, 16), "fsdp": (2, 4, 2, 16), "fsdp_tp": (2, 16, 1, 16)}[preset]
  assert {s.data.shape for s in kernel.addressable_shards} == {split}
  assert trainer.hooks.collector.sampler_memory["peak_mib"] > 0
  assert (trainer.hooks.collector.engine is not None) == (variant == "dapo_engine")


def test_rollouts_are_split_over_the_data_parallel_devices():
  _, _, trainer, state = run("clipo_rm", "fsdp_tp")
  ro = trainer.hooks.collector.rollouts(state.params, trainer.hooks.collector.prompts.batch(0), jax.random.PRNGKey(0))
  assert {s.data.shape for s in ro["tokens"].addressable_shards} == {(B * G // 4, T)}  # data 2 x fsdp 2
  assert ro["scores"].shape == (B * G,) and isinstance(ro["scores"], np.ndarray)


def test_bf16_rollouts_on_the_mesh_train_on_the_fp32_policys_old_logprobs():
  """The bf16 sampler compiled for the mesh; the trained rows' old_logp are the fp32 policy's (teacher forcing)."""
  _, _, trainer, state = run("clipo_rm", "fsdp_tp")
  bf16 = dataclasses.replace(trainer.config.sampling, rollout_dtype="bfloat16", eos_id=trainer.tokenizer.eos_id,
                             pad_id=trainer.tokenizer.pad_id)
  sample = make_sampler(trainer.config.model, bf16, trainer.config.data.max_prompt_len, trainer.training.layout)
  t = replace_hooks(trainer, sample=sample, config=dataclasses.replace(trainer.config, sampling=bf16))
  rng = jax.random.PRNGKey(0)
  ro, _ = t.hooks.collector.step_rollouts(state.params, t.hooks.collector.prompts.batch(0), 0, rng)
  out = sample(state.params, ro["prompt_tokens"], ro["prompt_mask"], rng)
  np.testing.assert_array_equal(ro["tokens"], out.tokens)
  want = trainer.hooks.collector.logprobs(state.params, *(ro[k] for k in ("prompt_tokens", "prompt_mask", "tokens",
                                                                          "mask")))
  np.testing.assert_array_equal(ro["old_logp"], want)
  assert not np.array_equal(ro["old_logp"], out.logprobs)
  assert {s.data.shape for s in ro["old_logp"].addressable_shards} == {(B * G // 4, T)}


def test_the_engine_on_8_devices_equals_one_engine_and_the_static_sampler():
  """Each data x fsdp group (4 of them; its 2 devices along tensor run the same engine, the params gathered whole)
  runs its own engine (2 slots) on its prompt's G rows, rows cut short at different budgets: the same rollouts as
  one engine on one device and as the static sampler with per-rollout keys, the tokens split over the groups."""
  trainer, state, settings, batch_rows = engine_case()
  (tokens, mask), = batch_rows(trainer.hooks.collector.prompts.batch(0))
  layout, config, sampling = trainer.training.layout, trainer.config, settings[1]
  prompts = parallel.global_batch({"tokens": tokens, "mask": mask}, layout.batch, B * G)
  got, stats = Engine(*settings, layout).run(state.params, prompts["tokens"], prompts["mask"], ENGINE_KEY,
                                             BUDGETS)
  params = jax.tree.map(np.asarray, state.params)
  one, _ = Engine(*settings).run(params, tokens, mask, ENGINE_KEY, BUDGETS)
  static = make_sampler(config.model, sampling, config.data.max_prompt_len, group_size=G, row_keys=True)(
      params, tokens, mask, ENGINE_KEY, BUDGETS)
  np.testing.assert_array_equal(np.asarray(got.lengths), np.minimum(BUDGETS, np.asarray(static.lengths)))
  for want in (one, static):
    assert_same_rollouts(got, want)
  assert int(stats.useful) == int(np.sum(static.lengths)) - B * G and not bool(stats.stuck)


def test_the_engines_rounds_on_8_devices_equal_a_call_per_round_on_one_device():
  """`Engine.rounds` (DAPO's refill rounds) on the mesh: each group streams its rows of both rounds through its
  engine, its state a block of the groups' axis; each round's rollouts are one device's call for that round."""
  trainer, state, settings, batch_rows = engine_case()
  collector, layout = trainer.hooks.collector, trainer.training.layout
  rounds = batch_rows(collector.prompts.batch(0), collector.prompts.refill_batch(0))
  prompts = [parallel.global_batch({"tokens": t, "mask": m}, layout.batch, B * G) for t, m in rounds]
  keys, budgets = [ENGINE_KEY, jax.random.fold_in(ENGINE_KEY, 1)], [BUDGETS, BUDGETS[::-1]]
  engine = Engine(*settings, layout)
  abstract = lambda x, sharding: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding)
  engine.compile_rounds(jax.tree.map(lambda x: abstract(x, x.sharding), state.params),  # as the collector does
                        abstract(prompts[0]["tokens"], layout.batch), abstract(ENGINE_KEY, layout.replicated), 2)
  streamed = engine.rounds(state.params, [p["tokens"] for p in prompts], [p["mask"] for p in prompts], keys, budgets)
  params, one = jax.tree.map(np.asarray, state.params), Engine(*settings)
  for (got, _), (tokens, mask), key, b in zip(streamed, rounds, keys, budgets):
    assert_same_rollouts(got, one.run(params, tokens, mask, key, b)[0])


BUDGETS, ENGINE_KEY = np.array([8, 2, 5, 8, 1, 8, 3, 7, 8, 8, 4, 6, 2, 8, 8, 5]), jax.random.PRNGKey(4)


def engine_case():
  """(trainer, state, Engine settings, batch_rows) for the engine tests: the clipo_rm fsdp_tp run; sampled with EOS and
  hidden states, 2 slots a group, pages of 4; batch_rows(*batches) -> each batch's (tokens, mask) [B G, P]."""
  _, _, trainer, state = run("clipo_rm", "fsdp_tp")
  config, tokenizer = trainer.config, trainer.tokenizer
  sampling = dataclasses.replace(config.sampling, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id,
                                 return_hidden=True, temperature=0.9, top_k=50)
  settings = (config.model, sampling, config.data.max_prompt_len, EngineConfig(num_slots=2, page_size=4), G)
  batch_rows = lambda *batches: [repeat_prompts(b["prompt_tokens"], b["prompt_mask"], G)[:2] for b in batches]
  return trainer, state, settings, batch_rows


def assert_same_rollouts(got, want):
  """Equal tokens, masks and lengths, log-probs and hidden states to 1e-5; `got`'s tokens split over the 4 groups."""
  assert {s.data.shape for s in got.tokens.addressable_shards} == {(B * G // 4, T)}
  for key in ("tokens", "mask", "lengths"):
    np.testing.assert_array_equal(np.asarray(getattr(got, key)), np.asarray(getattr(want, key)), err_msg=key)
  for key in ("logprobs", "hidden"):
    np.testing.assert_allclose(np.asarray(getattr(got, key)), np.asarray(getattr(want, key)), rtol=1e-5,
                               atol=1e-5, err_msg=key)


@pytest.mark.slow  # two GRPO runs on the mesh; the engine on the mesh is checked above, GRPO through it on one device
def test_grpo_through_the_engine_on_8_devices_equals_the_static_sampler():
  want_rows, want, _, _ = run("row_keys", "fsdp_tp")
  rows, got, trainer, _ = run("engine", "fsdp_tp")
  assert isinstance(trainer.hooks.collector.sample, Engine) and trainer.hooks.collector.sampler_memory["peak_mib"] > 0
  assert 0 < want_rows[0]["accuracy"] < 1 and len(rows) == len(want_rows) == 1
  for key in KEYS:
    np.testing.assert_allclose([r[key] for r in rows if key in r], [r[key] for r in want_rows if key in r],
                               rtol=2e-5, atol=1e-6, err_msg=key)
  for path, g, w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(got), jax.tree.leaves(want)):
    np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5, err_msg=jax.tree_util.keystr(path[0]))
