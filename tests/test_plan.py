"""`jaxpt plan` (`jaxpt.trainers.plan`): the analytic per-device memory against XLA's compiled analysis and the
measured state of tiny SFT runs, LoRA's arithmetic, and the CLI (one JSON line, nothing written).

Tolerances: the arguments of the compiled step (train state + batch) are the analytic params + AdamW state to 3%
(the batch and the step / rng scalars are the rest), and the allocated state of a real init to 1%; the compiled
(donated) step's temporaries are the analytic backward phase (grads + the layer scan's block gradient + activations
+ logits; the optimizer update after it holds only the gradient), and its peak the analytic total: to 10% for a
pre-norm full fine-tune (activations and logits at the peak) and a params-heavy d512 model (the gradients at the
peak), to 25% where the tiny model's attention intermediates dominate (the account counts a block's intermediates by
hand: XLA's CPU schedule keeps a few more or fewer of them at these sizes). Measured ratios analytic / compiled
peak (CPU, this suite's XLA flags) at `sft_tiny`'s sizes (32 rows of 96 tokens): pre, remat full 0.97 (LoRA rank
8: 0.88); siamese_post_pre, remat none, 0.87 (LoRA 8: 0.98); the params-heavy d512 model on 4 rows of 16 tokens
1.01 (accumulating 4 micro-batches: 1.00); at d256 and d512 (2048 tokens) SFT / DPO / GRPO, full and LoRA, against
the measured peak: `benchmarks/plan_tables.py`.
"""

import functools
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from experiments.configs import sft_tiny
from jaxpt.config import ConfigError
from jaxpt.trainers import plan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QWEN_1_5B = os.path.join(ROOT, "tests", "assets", "qwen2_5_1_5b_shape")  # its config.json alone, no weights
QWEN_1_5B_PARAMS = 1_543_714_304  # Qwen2.5-1.5B's published parameter count (tied embeddings)


def tiny(remat="full", rank=0, scheme="pre", accum=1, params_heavy=False):
  config = sft_tiny.get_config()
  config.model.update(remat=remat, norm_scheme=scheme)  # data: 32 rows of 96 tokens
  if params_heavy:
    config.model.update(d_model=512, mlp_dim=2048, num_heads=8, num_kv_heads=8)
    config.data.update(batch_size=4, seq_len=16)
  config.optim.grad_accum_steps = accum
  config.lora.rank = rank
  return config


@functools.lru_cache(maxsize=None)
def compiled(remat, rank, scheme, params_heavy=False, accum=1):
  """XLA's analysis of the tiny SFT step (compiled once per configuration for the whole module)."""
  config = tiny(remat, rank, scheme, accum=accum, params_heavy=params_heavy)
  return plan.compiled_account("sft", plan.run_config("sft", config), 1)


@pytest.mark.parametrize("remat,rank,scheme,params_heavy,accum,tolerance", [
    ("full", 0, "pre", False, 1, 0.10), ("full", 8, "pre", False, 1, 0.25),
    ("none", 8, "siamese_post_pre", False, 1, 0.25), ("none", 0, "siamese_post_pre", False, 1, 0.25),
    ("full", 0, "pre", True, 1, 0.10),
    ("full", 0, "pre", True, 4, 0.10)])
def test_analytic_matches_compiled_step(remat, rank, scheme, params_heavy, accum, tolerance):
  """The last case accumulates 4 micro-batches on the params-heavy model (2 layers): its peak is the last backward,
  the float32 sum beside the micro-batch's gradient and one block's gradient of the layer scan; the update phase
  reads the averaged gradient, the sum freed (plan / compiled 1.00; 1.2 while the account added the sum to the
  update phase too and left out the block's gradient). The params-heavy cases have the gradient, not the
  activations, at the peak: AdamW's update needs nothing beside it (1.01; before
  `jaxpt.engine.optim.clip_by_global_norm`, optax's clip wrote a clipped float32 copy of the whole gradient there,
  which the account counted as AdamW's update tree)."""
  run = plan.run_config("sft", tiny(remat, rank, scheme, accum=accum, params_heavy=params_heavy))
  parts = plan.account("sft", run, 1)
  compiled_step = compiled(remat, rank, scheme, params_heavy, accum)
  assert compiled_step["alias"] == pytest.approx(compiled_step["output"], rel=0.01)  # donated: the new state (all
  # but the metrics) overwrites the old
  assert compiled_step["peak"] == pytest.approx(parts["total"], rel=tolerance)
  state = parts["params"] + parts["optimizer"]
  assert compiled_step["argument"] == pytest.approx(state, rel=0.03)
  assert compiled_step["temp"] == pytest.approx(plan.step_transient(parts), rel=tolerance), (compiled_step, parts)


def test_measured_state_is_the_analytic_state():
  """A real tiny SFT state (init on this machine's device): its arrays' bytes are the plan's params + AdamW state,
  and one step runs in the compiled program whose memory the plan reads."""
  from jaxpt.engine.builder import build_training
  from jaxpt.models.transformer import TransformerLM
  from jaxpt.parallel.mesh import make_mesh
  from jaxpt.trainers.lm import make_lm_loss_fn

  run = plan.run_config("sft", tiny("full", 8))
  model = TransformerLM(run.model, lora=run.lora.spec())
  shape = (32, 96)
  shapes = {k: jax.ShapeDtypeStruct(shape, jnp.int32) for k in ("inputs", "targets", "segment_ids", "positions")}
  shapes["weights"] = jax.ShapeDtypeStruct(shape, jnp.float32)
  training = build_training(run, make_mesh(run.mesh, jax.devices()[:1]), model, (jnp.zeros((1, 96), jnp.int32),),
                            shapes, loss_fn=make_lm_loss_fn(model))
  state = training.init_state()
  measured = sum(leaf.addressable_shards[0].data.nbytes for leaf in jax.tree.leaves((state.params, state.opt_state)))
  parts = plan.account("sft", run, 1)
  assert measured == pytest.approx(parts["params"] + parts["optimizer"], rel=0.01)
  batch = {k: jnp.ones(s.shape, s.dtype) for k, s in shapes.items()}
  _, metrics = training.train_step(state, batch)
  assert jnp.isfinite(metrics["loss"])


def test_lora_lowers_grads_and_optimizer_as_the_arithmetic_says():
  full = plan.account("sft", plan.run_config("sft", tiny()), 1)
  lora = plan.account("sft", plan.run_config("sft", tiny(rank=8)), 1)
  model = plan.run_config("sft", tiny()).model
  adapters = 4 * model.num_layers * sum(8 * (k + n) for name, (k, n) in model.projection_dims().items()
                                        if name != "mlp_in") + 4 * model.num_layers * 2 * 8 * (model.d_model +
                                                                                                 model.mlp_dim)
  # mlp_in is SwiGLU's two kernels (gate, up), each with its adapters
  assert lora["optimizer"] == 2 * adapters
  assert lora["grads"] == adapters  # float32 adapters
  assert full["grads"] == full["params"]
  layers = model.num_layers  # the layer scan's one block's gradient
  assert (lora["block_grads"], full["block_grads"]) == (adapters / layers, full["params"] / layers)
  assert full["optimizer"] == 2 * full["params"]
  assert lora["params"] == full["params"] + adapters
  # and XLA agrees: the compiled step's arguments shrink by the AdamW state the frozen base no longer has
  saved = compiled("full", 0, "pre", False)["argument"] - compiled("full", 8, "pre", False)["argument"]
  assert saved == pytest.approx((full["params"] + full["optimizer"]) - (lora["params"] + lora["optimizer"]), rel=0.01)


def test_qwen_1_5b_shape_is_read_from_config_json_alone():
  config = __import__("experiments.configs.sft_hf", fromlist=["get_config"]).get_config()
  config.init_from = f"hf:{QWEN_1_5B}"
  run = plan.run_config("sft", config)
  assert (run.model.d_model, run.model.num_layers, run.model.vocab_size) == (1536, 28, 151936)
  assert plan.account("sft", run, 1)["params"] == 4 * QWEN_1_5B_PARAMS  # float32 params, tied embeddings
  eight = plan.account("sft", plan.run_config("sft", dict(config, mesh=dict(fsdp=8, data=1))), 8)
  assert eight["params"] < plan.account("sft", run, 1)["params"] / 7  # fsdp splits embed; a few small leaves stay


@pytest.mark.parametrize("name,params,shape", [
    ("qwen2_5_0_5b_shape", 494_032_768, (896, 24, 151936)), ("qwen2_5_7b_shape", 7_615_616_512, (3584, 28, 152064))])
def test_qwen_shapes_of_the_plan_tables(name, params, shape):
  """The 0.5B and 7B config.json files `benchmarks/plan_tables.py` reads: their parameter counts are the published
  ones (0.49B tied, 7.61B untied)."""
  config = __import__("experiments.configs.sft_hf", fromlist=["get_config"]).get_config()
  config.init_from = f"hf:{os.path.join(ROOT, 'tests', 'assets', name)}"
  run = plan.run_config("sft", config)
  assert (run.model.d_model, run.model.num_layers, run.model.vocab_size) == shape
  assert plan.account("sft", run, 1)["params"] == 4 * params


@pytest.mark.slow
@pytest.mark.parametrize("trainer", ["dpo", "grpo"])
def test_dpo_and_grpo_steps_compile_from_the_config(trainer):
  """`jaxpt plan --compile` for DPO and GRPO: their real steps, built without data (`plan.step_training`), take the
  analytic state as arguments and peak near the analytic total (LoRA rank 8 at the tiny configs: 0.92 / 0.88)."""
  config = __import__(f"experiments.configs.{trainer}_tiny", fromlist=["get_config"]).get_config()
  config.lora.rank = 8
  run = plan.run_config(trainer, config)
  parts = plan.account(trainer, run, 1)
  compiled_step = plan.compiled_account(trainer, run, 1)
  assert compiled_step["argument"] == pytest.approx(parts["params"] + parts["optimizer"], rel=0.03)
  assert compiled_step["peak"] == pytest.approx(parts["total"], rel=0.15), (compiled_step, parts)


@pytest.mark.parametrize("trainer,rank,tolerance", [("kto", 8, 0.25), ("rm", 0, 0.25), ("ppo", 0, 0.15),
                                                   pytest.param("ppo", 8, 0.10, marks=pytest.mark.slow)])
def test_kto_rm_and_ppo_steps_compile_from_the_config(trainer, rank, tolerance):
  """`jaxpt plan --compile` for KTO, the reward model and PPO (the policy + critic update, two models' params and
  AdamW state): the compiled figure is there, its arguments are the analytic state, and its peak + the reference
  (computed outside the step) is the account's step phase. Measured plan / compiled at the tiny configs (remat
  full, pre-norm): KTO (LoRA rank 8) 0.91, RM 0.88 (LoRA rank 8: 0.79; the tiny model's attention intermediates
  dominate, as for SFT), PPO 1.11 (1.2 while the account counted both models' activations at once; the account
  adds both models' gradients, one block's gradient and the policy's activations as if all were alive at once, and
  at 2 layers the block's gradient is half a model's; LoRA rank 8 on policy and critic, the reference their base:
  0.96)."""
  config = __import__(f"experiments.configs.{trainer}_tiny", fromlist=["get_config"]).get_config()
  config.update_from_flattened_dict({"lora.rank": rank, "model.remat": "full", "model.norm_scheme": "pre"})
  run = plan.run_config(trainer, config)
  parts = plan.account(trainer, run, 1)
  compiled_step = plan.compiled_account(trainer, run, 1)
  assert "skipped" not in compiled_step and compiled_step["peak"] > 0, compiled_step
  assert compiled_step["argument"] == pytest.approx(parts["params"] + parts["optimizer"], rel=0.03)
  assert compiled_step["peak"] + parts["reference"] == pytest.approx(plan.step_total(parts), rel=tolerance), (
      compiled_step, parts)


def _plan_cli(tmp_path, *args):
  env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
  return subprocess.run([sys.executable, "-m", "jaxpt.cli", "plan", *args], cwd=tmp_path, env=env,
                        capture_output=True, text=True, timeout=300)


def test_cli_prints_one_json_line_and_writes_nothing(tmp_path):
  before = sorted(os.listdir(QWEN_1_5B)), sorted(os.listdir(os.path.join(ROOT, "experiments", "configs")))
  done = _plan_cli(tmp_path, "sft", "--config", os.path.join(ROOT, "experiments", "configs", "sft_hf.py"),
                   f"--config.init_from=hf:{QWEN_1_5B}", "--config.lora.rank=8", "--devices", "1",
                   "--device-gib", "16")
  assert done.returncode == 0, done.stderr
  lines = done.stdout.strip().splitlines()
  assert len(lines) == 1
  result = json.loads(lines[0])
  assert set(result["per_device_gib"]) >= {"params", "grads", "optimizer", "activations", "logits", "total"}
  assert isinstance(result["fits"], bool) and isinstance(result["advice"], list)
  assert result["fits"] or all("--config." in tip for tip in result["advice"])
  assert os.listdir(tmp_path) == []
  assert (sorted(os.listdir(QWEN_1_5B)), sorted(os.listdir(os.path.join(ROOT, "experiments", "configs")))) == before


@pytest.mark.parametrize("args,field", [
    (("--config.model.d_model=-3", "--devices", "1", "--device-gib", "16"), "config.model.d_model"),
    (("--devices", "0", "--device-gib", "16"), "--devices"),
    (("--devices", "1"), "--device-gib"),
    (("--devices", "3", "--device-gib", "16"), "config.data.batch_size"),
])
def test_cli_bad_input_is_one_line_naming_the_field(tmp_path, args, field):
  done = _plan_cli(tmp_path, "sft", "--config", os.path.join(ROOT, "experiments", "configs", "sft_tiny.py"), *args)
  assert done.returncode == 2
  assert len(done.stderr.strip().splitlines()) == 1 and field in done.stderr, done.stderr
  assert done.stdout == "" and os.listdir(tmp_path) == []


def test_plan_refuses_what_it_cannot_read():
  with pytest.raises(ConfigError, match="trainer"):
    plan.run_config("vit", sft_tiny.get_config())


def test_reference_copy_and_sampler_kv_cache():
  """DPO keeps a copy of the policy as its reference unless LoRA makes the base the reference; GRPO's KV cache is
  the sampler's own cache (`init_cache`) for every rollout, and with LoRA the sampler reads a merged copy."""
  from experiments.configs import dpo_tiny, grpo_tiny
  from jaxpt.models.transformer import init_cache

  dpo = plan.account("dpo", plan.run_config("dpo", dpo_tiny.get_config()), 1)
  assert dpo["reference"] == dpo["params"]
  config = dpo_tiny.get_config()
  config.lora.rank = 4
  assert plan.account("dpo", plan.run_config("dpo", config), 1)["reference"] == 0
  run = plan.run_config("grpo", grpo_tiny.get_config())
  load = plan.workload("grpo", run)
  cache = jax.eval_shape(lambda: init_cache(run.model, load.sampler_rows, load.sampler_len))
  kv = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree.leaves(cache) if leaf.ndim > 1)
  parts = plan.account("grpo", run, 1)
  assert parts["kv_cache"] == pytest.approx(kv, rel=0.01)
  assert parts["total"] >= parts["params"] + parts["optimizer"] + parts["kv_cache"]


def test_rollout_capacity_of_a_qwen_1_5b_shape_from_its_config_json():
  """`rollout_capacity` against its plain statement: 16 GiB less headroom less the bf16 weights, over each rollout's
  K/V (2 L kv_heads head_dim 2 bytes a token) and float32 logits row."""
  config = __import__("experiments.configs.sft_hf", fromlist=["get_config"]).get_config()
  config.init_from = f"hf:{QWEN_1_5B}"
  model = plan.run_config("sft", config).model
  got = plan.rollout_capacity(model, 512, 2048, 16, group_size=8, page_size=16, held_new_tokens=600)
  kv = 2 * 28 * 2 * 128 * 2
  budget = 16 * 2 ** 30 * (1 - plan.HEADROOM) - 2 * QWEN_1_5B_PARAMS
  # the worst prompt length for the pages is 511: 32 prompt pages, and its row's copy of the partly filled 32nd
  want = {"preallocated": kv * (512 / 8 + 2047), "paged_reserved": kv * 16 * (32 / 8 + -(-(15 + 2047) // 16)),
          "paged_held": kv * 16 * (32 / 8 + (15 + 600) / 16 + 1)}
  assert got["kv_bytes_per_token"] == kv and got["params_gib"] == round(2 * QWEN_1_5B_PARAMS / 2 ** 30, 4)
  assert got["rollouts"] == {k: int(budget // (v + 151936 * 4)) for k, v in want.items()}
  assert got["rollouts"]["paged_held"] > 2 * got["rollouts"]["preallocated"]


def test_grpo_sampler_reads_a_merged_copy_unless_its_rollouts_read_the_codes():
  """LoRA on a float base: the sampler's merged copy W + s A B, the base's size; QLoRA (lora.rollouts auto ->
  unmerged): none, the rollouts read the codes and adapters the params already hold; lora.rollouts=merged: back."""
  from experiments.configs import grpo_tiny

  def sampler_params(**lora):
    config = grpo_tiny.get_config()
    config.update_from_flattened_dict({"lora.rank": 4, "lora.base_quant_block": 16, **lora})
    run = plan.run_config("grpo", config)
    return plan.account("grpo", run, 1)["sampler_params"], run

  merged, run = sampler_params()
  assert merged > 0 and not run.lora.samples_unmerged
  codes, run = sampler_params(**{"lora.base_quant": "nf4"})
  assert codes == 0 and run.lora.samples_unmerged
  assert sampler_params(**{"lora.base_quant": "nf4", "lora.rollouts": "merged"})[0] == merged
