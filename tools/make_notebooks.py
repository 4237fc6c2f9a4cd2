"""Writes the Colab notebooks under colab/ from the cell sources in this file (nbformat v4, no outputs).

  python3 tools/make_notebooks.py            # rewrite colab/*.ipynb
  python3 tools/make_notebooks.py --check    # exit 1 when a committed notebook differs from what this file writes

Each notebook opens with the same install cell (INSTALL): a no-op where jaxpt is already importable (CI, a local
checkout), else a pip install of the jaxpt repository with the jax extra of the runtime (Colab CPU, GPU or TPU).
Every notebook runs top to bottom on two CPU cores in well under two minutes (tiny models, a few steps, no
download); its last markdown cell says what to change for a real run. tests/test_notebooks.py executes them.
"""

from __future__ import annotations

import argparse
import os
import sys

import nbformat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLAB = os.path.join(ROOT, "colab")

INSTALL = '''\
# Installs jaxpt unless it is already importable (then this cell does nothing: CI, a local checkout).
import glob
import importlib.util
import os
import shutil
import subprocess
import sys

# Where jaxpt comes from on a fresh runtime: a git URL of the jaxpt repository, or the path of a checkout
# (e.g. one uploaded to /content/jaxpt). Cloned to ./jaxpt, so the notebooks also find its test fixtures.
JAXPT_SOURCE = ""  # @param {type:"string"}


def jax_extra() -> str:
  """The jax extra this runtime needs: tpu (Colab TPU v5e-1 / v6e-1, or an older TPU node), cuda12 (GPU), or none."""
  if os.environ.get("COLAB_TPU_ADDR") or os.environ.get("TPU_ACCELERATOR_TYPE") or glob.glob("/dev/accel*") \\
      or glob.glob("/dev/vfio/[0-9]*"):
    return "tpu"
  if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0:
    return "cuda12"
  return ""


if importlib.util.find_spec("jaxpt") is None:
  if not JAXPT_SOURCE:
    raise RuntimeError("jaxpt is not installed: set JAXPT_SOURCE above to the jaxpt repository's git URL (or a "
                       "checkout's path) and run this cell again")
  source = JAXPT_SOURCE
  if not os.path.isdir(source):
    if not os.path.isdir("jaxpt"):
      subprocess.run(["git", "clone", "--depth=1", source, "jaxpt"], check=True)
    source = "jaxpt"
  extra = jax_extra()
  packages = [f"{os.path.abspath(source)}[notebooks]"] + ([f"jax[{extra}]"] if extra else [])
  print("pip install", *packages)
  subprocess.run([sys.executable, "-m", "pip", "install", "-q", *packages], check=True)
  importlib.invalidate_caches()

import jax
import jaxpt

print(f"jaxpt {jaxpt.__version__}, jax {jax.__version__} on {jax.devices()}")'''


# The last cell of every notebook with a workdir: it removes the temporary folder it made (shutil: INSTALL imports it).
CLEANUP = '''\
shutil.rmtree(MADE_DIR)  # the temporary folder this notebook made; a WORKDIR of your own is kept'''


def md(text: str) -> nbformat.NotebookNode:
  return nbformat.v4.new_markdown_cell(text.strip("\n"))


def code(text: str) -> nbformat.NotebookNode:
  return nbformat.v4.new_code_cell(text.strip("\n"))


# ---------------------------------------------------------------------------------------------------------------
# quickstart.ipynb
# ---------------------------------------------------------------------------------------------------------------

QUICKSTART = [
    md("""
# jaxpt quickstart: a SiameseNorm LM beside a Pre-Norm one

This notebook pretrains two tiny language models from Python (no CLI) on jaxpt's embedded corpus (the Python
standard library's own source, so nothing is downloaded): one with the two-stream SiameseNorm residual scheme
(`siamese_post_pre`), one with Pre-Norm (`pre`). It plots both loss curves, loads a run with `jaxpt.load`,
generates text, and looks inside the two-stream architecture. The models are tiny so that it runs on a 2-core CPU
in about a minute; the last cell says what to change for a real run.
"""),
    code(INSTALL),
    md("""
## Two tiny runs

A run config is data: `jaxpt.config_dict(RunConfig, **changes)` starts from the dataclasses' defaults, and the
trainer checks it once (errors name the dotted field). Each run leaves `metrics.jsonl`, TensorBoard events,
`loss.png` and checkpoints in its workdir.
"""),
    code('''
import tempfile

from tqdm.auto import tqdm

MADE_DIR = tempfile.mkdtemp(prefix="jaxpt-quickstart-")  # the last cell removes it
WORKDIR = MADE_DIR  # or a folder of your own (e.g. on Drive), which is kept


def tiny_pretrain_config(norm_scheme: str):
  return jaxpt.config_dict(
      jaxpt.PretrainRunConfig, steps=100, log_every=10, eval_every=25, checkpoint_every=0, seed=0,
      model=dict(vocab_size=512, d_model=32, num_layers=2, num_heads=2, num_kv_heads=2, mlp_dim=64, max_seq_len=64,
                 norm_scheme=norm_scheme),
      data=dict(seq_len=64, batch_size=8, eval_batches=2, max_corpus_bytes=200_000),
      optim=dict(learning_rate=1e-2, warmup_steps=5))


SCHEMES = ["siamese_post_pre", "pre"]
runs = {}
for scheme in tqdm(SCHEMES, desc="runs"):
  runs[scheme] = os.path.join(WORKDIR, scheme)
  result = jaxpt.train("pretrain", tiny_pretrain_config(scheme), runs[scheme])
  print(f"{scheme}: step {int(result.state.step)}, last train loss {result.last_row['loss']:.3f}")
'''),
    code('''
import matplotlib.pyplot as plt

from jaxpt.engine.metrics import read_metrics

fig, ax = plt.subplots(figsize=(7, 4))
for scheme, workdir in runs.items():
  rows = [r for r in read_metrics(workdir) if "loss" in r]
  line, = ax.plot([r["step"] for r in rows], [r["loss"] for r in rows], label=f"{scheme} (train)")
  evals = [r for r in read_metrics(workdir) if "eval_loss" in r]
  ax.plot([r["step"] for r in evals], [r["eval_loss"] for r in evals], "o--", color=line.get_color(),
          label=f"{scheme} (eval)")
ax.set_xlabel("step")
ax.set_ylabel("cross-entropy (nats / token)")
ax.legend()
plt.show()
'''),
    md("""
## Load the run and generate

`jaxpt.load(workdir)` restores the latest checkpoint with the run's tokenizer; `generate` runs the jitted KV-cache
sampler (greedy unless `temperature > 0`). A hundred steps of a 37k-parameter model make Python-shaped noise.
"""),
    code('''
model = jaxpt.load(runs["siamese_post_pre"])
print(model.config.norm_scheme, model.kind, type(model.tokenizer).__name__)
for prompt, text in zip(["def main(", "import os\\nimport"],
                        model.generate(["def main(", "import os\\nimport"], max_new_tokens=24)):
  print(repr(prompt), "->", repr(text))
print("sampled:", model.generate(["class "], max_new_tokens=24, temperature=0.8, top_p=0.95, seed=1))
logits = model.logits([[5, 9, 17, 3]])
print("logits", logits.shape, logits.dtype)
'''),
    md("""
## The two-stream architecture

In `siamese_post_pre` every sub-layer F (attention, then the MLP) reads both streams and writes to both:
`xh = LN_post(x); z = F(LN_in(xh + LN_pre(y))); x <- xh + z / c_l; y <- y + z`, with `c_l = sqrt(2 (l + 1))` for
the 0-based layer l; the head reads `LN(LN_x(x_L) + LN_y(y_L))`. Below: the parameters each model has (the
Siamese one has the extra per-stream norms; the leading axis of 2 is the layers, stacked by `nn.scan`) and `c_l`
per layer, from the block code itself.
"""),
    code('''
import jax.numpy as jnp

from jaxpt.models.blocks import depth_scale


def param_table(params, prefix=""):
  for name, value in params.items():
    if isinstance(value, dict):
      yield from param_table(value, f"{prefix}{name}/")
    else:
      yield f"{prefix}{name}", tuple(value.shape)


pre = jaxpt.load(runs["pre"])
for scheme, loaded in (("siamese_post_pre", model), ("pre", pre)):
  table = dict(param_table(loaded.params))
  print(f"{scheme}: {sum(int(jnp.size(x)) for x in jax.tree.leaves(loaded.params)):,} params")
  for name, shape in table.items():
    print(f"  {name:55s} {shape}")
print("c_l per layer:", [round(float(depth_scale(layer)), 4) for layer in range(model.config.num_layers)])
'''),
    md("""
## For a real run

- Model: `d_model=768, num_layers=12, num_heads=12, num_kv_heads=12, mlp_dim=3072, max_seq_len=1024` (or
  `experiments/configs/tiny.py` for a few-minute CPU run), `vocab_size=32000`.
- Data: `data.path="/path/to/text"` (a file or folder; empty = the embedded corpus), `data.seq_len`,
  `data.batch_size`, `data.max_corpus_bytes=0` (no cap); `steps` in the thousands, `checkpoint_every`.
- On a TPU or GPU runtime: `model.dtype="bfloat16"`, and `mesh=dict(data=1, fsdp=-1)` (or `tp`) to shard over devices;
  `jaxpt pretrain --help` lists every field.
- Use a persistent `WORKDIR` (e.g. on Drive): rerunning into it resumes from the last checkpoint.
"""),
    code(CLEANUP),
]

# ---------------------------------------------------------------------------------------------------------------
# losses_as_functions.ipynb
# ---------------------------------------------------------------------------------------------------------------

LOSSES = [
    md("""
# Losses are pure functions

Every jaxpt loss is a function of arrays (logits, log-probs, rewards, masks, hidden states) that returns
`(loss, metrics)`, registered by kind: `jaxpt.get_loss(kind, name)`. This notebook calls the GRPO, Dr.GRPO, GSPO,
CLIPO, Bradley–Terry and DIR losses on hand-made arrays, differentiates them with `jax.grad`, maps them with
`jax.vmap`, and plots the PPO clipping region. No model is trained; it runs in seconds.
"""),
    code(INSTALL),
    code('''
import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np

for kind in jaxpt.LOSS_KINDS:
  print(f"{kind:12s}", jaxpt.known_losses(kind))
'''),
    md("""
## Group advantages: GRPO vs Dr.GRPO

Rewards of 2 prompts x 4 rollouts (groups contiguous). GRPO normalises by the group's std; Dr.GRPO only
subtracts the mean; a group where every rollout got the same reward gives zero advantage either way.
"""),
    code('''
from jaxpt.losses.grpo import group_advantages

rewards = jnp.array([1.0, 0.0, 0.0, 1.0,   1.0, 1.0, 1.0, 1.0])
for estimator in ("grpo", "drgrpo", "rloo"):
  print(f"{estimator:7s}", np.round(np.asarray(group_advantages(rewards, 4, estimator)), 3))
'''),
    md("""
## The PPO-clip policy loss (GRPO) and GSPO on a hand-made batch

Log-probs `[batch, tokens]` of the current and the old policy, one advantage per row, a mask for the response
tokens. `jax.grad` differentiates with respect to the current log-probs only: padded tokens get exactly zero.
"""),
    code('''
ppo_clip = jaxpt.get_loss("policy", "ppo_clip")
gspo = jaxpt.get_loss("policy", "gspo")

key = jax.random.PRNGKey(0)
old_logp = -jax.random.uniform(key, (4, 6), minval=0.1, maxval=3.0)
logp = old_logp + 0.3 * jax.random.normal(jax.random.PRNGKey(1), (4, 6))
mask = jnp.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0]], jnp.float32)
advantages = group_advantages(jnp.array([1.0, 0.0, 1.0, 0.0]), 4, "grpo")

for name, loss_fn, options in (("GRPO (ppo_clip, clip-higher)", ppo_clip, dict(eps_lo=0.2, eps_hi=0.28)),
                               ("Dr.GRPO (ppo_clip, seq-mean-token-sum-norm)", ppo_clip,
                                dict(agg="seq-mean-token-sum-norm", max_tokens=6)),
                               ("GSPO", gspo, {})):
  adv = group_advantages(jnp.array([1.0, 0.0, 1.0, 0.0]), 4, "drgrpo") if name.startswith("Dr") else advantages
  loss, metrics = loss_fn(logp, old_logp, adv, mask, **options)
  grad = jax.grad(lambda lp: loss_fn(lp, old_logp, adv, mask, **options)[0])(logp)
  print(f"{name}: loss {float(loss):+.4f}, clip_frac {float(metrics['clip_frac']):.2f}, "
        f"|grad| on padding {float(jnp.abs(grad * (1 - mask)).max()):.1f}")
'''),
    md("""
## The clipping region, with `jax.vmap` and `jax.grad`

One token, advantage +1 or -1, ratio `rho = exp(logp - old_logp)` swept over [0.2, 4.5]: `jax.vmap` maps the loss
over the sweep and `jax.grad` gives the gradient that reaches `logp`. Flat stretches are where the clip (or, for
A < 0, the dual clip at `c = 3`) stops the gradient.
"""),
    code('''
rho = jnp.linspace(0.2, 4.5, 300)
one = jnp.ones((1, 1))


def token_loss(log_ratio, advantage):
  return ppo_clip(log_ratio.reshape(1, 1), jnp.zeros((1, 1)), jnp.array([advantage]), one, eps_lo=0.2,
                  eps_hi=0.28, dual_clip_c=3.0)[0]


fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
for advantage in (1.0, -1.0):
  values = jax.vmap(token_loss, in_axes=(0, None))(jnp.log(rho), advantage)
  grads = jax.vmap(jax.grad(token_loss), in_axes=(0, None))(jnp.log(rho), advantage)
  axes[0].plot(rho, values, label=f"A = {advantage:+.0f}")
  axes[1].plot(rho, grads, label=f"A = {advantage:+.0f}")
for ax, title in zip(axes, ("loss", "d loss / d logp")):
  ax.axvspan(0.8, 1.28, color="0.9")
  ax.set_xlabel("ratio rho")
  ax.set_title(title)
  ax.legend()
plt.show()
'''),
    md("""
## Policy losses side by side: the gradient each token gets

The picture people draw to compare policy losses: for one token of advantage +1 or -1, the gradient that reaches
`logp` as the importance ratio `rho` sweeps [0.2, 4.5] (`jax.grad` of each registered loss at its paper defaults,
`eps_lo=0.2`, `eps_hi=0.28`; GPPO's beta1 = beta2 = 1; TOPR's sequence ratio is the token's own here). PPO-clip stops
the gradient outside the clip range (and, for A < 0, past the dual clip), CISPO keeps every token with a clipped
weight, GPPO keeps a bounded gradient where PPO-clip has none, TOPR weights positive tokens by 1 and negative ones
by min(rho, 1). Clip-Cov and KL-Cov select tokens by their covariance over a batch, so one token cannot show them.
"""),
    code('''
policy_losses = {"ppo_clip": dict(eps_lo=0.2, eps_hi=0.28, dual_clip_c=3.0), "cispo": dict(eps_lo=0.2, eps_hi=0.28),
                 "gppo": dict(eps_lo=0.2, eps_hi=0.28), "topr": {}}


def token_gradient(name, log_ratio, advantage):
  loss_fn = jaxpt.get_loss("policy", name)
  loss = lambda lr: loss_fn(lr.reshape(1, 1), jnp.zeros((1, 1)), jnp.array([advantage]), one,
                            **policy_losses[name])[0]
  return jax.grad(loss)(log_ratio)


fig, axes = plt.subplots(1, 2, figsize=(10, 3.5), sharey=True)
for ax, advantage in zip(axes, (1.0, -1.0)):
  for name in policy_losses:
    ax.plot(rho, jax.vmap(lambda lr: token_gradient(name, lr, advantage))(jnp.log(rho)), label=name)
  ax.axvspan(0.8, 1.28, color="0.9")
  ax.set_xlabel("ratio rho")
  ax.set_title(f"d loss / d logp, A = {advantage:+.0f}")
  ax.legend()
plt.show()
'''),
    md("""
## CLIPO: a contrastive loss over rollouts' hidden states

CLIPO projects each rollout's hidden state with a small head; correct rollouts of a prompt are pulled together
(InfoNCE over the group), and the per-rollout loss becomes a (non-positive) reward added before the advantage.
Here `z` is a hand-made `[8, 16]` batch: 2 prompts x 4 rollouts, labels 1 = correct.
"""),
    code('''
from jaxpt.losses.clipo import contrastive_reward

infonce = jaxpt.get_loss("contrastive", "clipo_infonce")
z = jax.random.normal(jax.random.PRNGKey(2), (8, 16))
labels = jnp.array([1, 1, 0, 1,   1, 0, 0, 1])
groups = jnp.array([0, 0, 0, 0,   1, 1, 1, 1])
loss, metrics = infonce(z, labels, groups, jax.random.PRNGKey(3))
print("InfoNCE loss", float(loss), "anchors", int(metrics["num_anchors"]))
print("r_con", np.round(np.asarray(contrastive_reward(metrics["per_rollout_loss"], labels)), 3))

# One gradient step on z lowers the loss: the correct rollouts of each prompt move together.
grad = jax.grad(lambda z: infonce(z, labels, groups, positive_index=jnp.array([1, 0, 0, 0, 7, 0, 0, 4]))[0])(z)
z_after = z - 1.0 * grad
for name, value in (("before", z), ("after", z_after)):
  print(name, float(infonce(value, labels, groups, positive_index=jnp.array([1, 0, 0, 0, 7, 0, 0, 4]))[0]))
'''),
    md("""
## Bradley–Terry and DIR

A reward model's loss on pair scores. DIR adds the CLUB estimate of the mutual information between the pair's
hidden states and a bias label (here: which response is longer), with the estimator's params held fixed; in
training `club.inner_update` fits the estimator on each batch first. `jax.vmap` evaluates BT over a batch of
score margins at once.
"""),
    code('''
from jaxpt.losses import club

bt = jaxpt.get_loss("preference", "bt")
dir_loss = jaxpt.get_loss("preference", "dir")

margins = jnp.linspace(-4, 4, 81)
bt_curve = jax.vmap(lambda m: bt(jnp.array([m]), jnp.zeros(1))[0])(margins)

n, d = 16, 8
hidden_chosen = jax.random.normal(jax.random.PRNGKey(4), (n, d))
hidden_rejected = jax.random.normal(jax.random.PRNGKey(5), (n, d))
longer = (jax.random.uniform(jax.random.PRNGKey(6), (n,)) < 0.5).astype(jnp.int32)
hidden_chosen = hidden_chosen.at[:, 0].add(2.0 * longer)  # the bias leaks into one hidden direction
chosen, rejected = jax.random.normal(jax.random.PRNGKey(7), (n,)) + 0.5, jax.random.normal(jax.random.PRNGKey(8), (n,))

q_params = club.init_club_estimator(jax.random.PRNGKey(9), club.club_input_dim(d), hidden=32)
opt = club.make_estimator_optimizer(learning_rate=1e-2)
opt_state = opt.init(q_params)
x = club.club_input(hidden_chosen, hidden_rejected)
# Fit the estimator q(a | X) on this batch: 100 AdamW steps under one jitted lax.scan.
fit = jax.jit(lambda q, state: club.inner_update(q, state, x, longer, opt, num_steps=100))
q_params, opt_state, fit_metrics = fit(q_params, opt_state)
print("estimator accuracy on the bias label:", float(fit_metrics["estimator_accuracy"][-1]))
loss, metrics = dir_loss(chosen, rejected, hidden_chosen, hidden_rejected, longer, q_params, mi_weight=1.0)
print(f"BT {float(metrics['bt_loss']):.4f} + MI penalty {float(metrics['mi_loss']):.4f} = DIR {float(loss):.4f}")
grads = jax.grad(lambda h: dir_loss(chosen, rejected, h, hidden_rejected, longer, q_params, mi_weight=1.0)[0])(
    hidden_chosen)
print("DIR pushes on the biased hidden direction most:", np.round(np.abs(np.asarray(grads)).mean(0), 3))

fig, ax = plt.subplots(figsize=(5, 3))
ax.plot(margins, bt_curve)
ax.set_xlabel("r_chosen - r_rejected")
ax.set_ylabel("BT loss")
plt.show()
'''),
    md("""
## For real use

The trainers call these same functions: `--config.grpo.*` picks the policy loss (`ppo_clip` / `gspo`), the
advantage estimator and the aggregation; `--config.clipo.*` the contrastive objective and level;
`--config.rm.loss=bt|dir|odin` the reward-model loss. A new loss is a function decorated with
`jaxpt.register_loss(kind, name)`; a config may only name a loss of the kind its trainer calls.
"""),
]

# ---------------------------------------------------------------------------------------------------------------
# reward_model_dir.ipynb
# ---------------------------------------------------------------------------------------------------------------

REWARD = [
    md("""
# Reward models: Bradley–Terry vs DIR on a length-biased task

jaxpt's synthetic preference task asks one-digit sums; the chosen answer is correct, the rejected one is off by a
few, and one of the two is padded with content-free sentences. In training the chosen answer is the longer one in
95% of pairs, so length is a shortcut. DIR adds a mutual-information penalty between the reward model's hidden
states and the "which is longer" label. This notebook trains both on a tiny backbone for 150 steps, scores
pairs with `model.score`, and plots score against response length.
"""),
    code(INSTALL),
    code('''
import json
import tempfile

import matplotlib.pyplot as plt
import numpy as np
from tqdm.auto import tqdm

MADE_DIR = tempfile.mkdtemp(prefix="jaxpt-rm-")  # the last cell removes it
WORKDIR = MADE_DIR  # or a folder of your own (e.g. on Drive), which is kept


def tiny_rm_config(loss: str):
  return jaxpt.config_dict(
      jaxpt.RMRunConfig, steps=150, log_every=25, eval_every=0, checkpoint_every=0, seed=0,
      model=dict(vocab_size=512, d_model=32, num_layers=1, num_heads=2, num_kv_heads=2, mlp_dim=64, max_seq_len=64,
                 norm_scheme="pre"),
      data=dict(source="synthetic", seq_len=48, batch_size=32, length_bias=0.95, synthetic_train_pairs=1024,
                synthetic_test_pairs=256),
      optim=dict(learning_rate=3e-3, warmup_steps=10, weight_decay=0.01),
      rm=dict(loss=loss, mi_weight=1.0, estimator_hidden=64))


runs = {}
for loss in tqdm(["bt", "dir"], desc="reward models"):
  runs[loss] = os.path.join(WORKDIR, loss)
  jaxpt.train("rm", tiny_rm_config(loss), runs[loss])
'''),
    md("""
Each run writes `rm_eval.json`: accuracy on the training distribution's test split (`test`: length carries no
information) and on the `adversarial` split (the chosen answer is always the shorter one), with the correlation
of the reward with length.
"""),
    code('''
for loss, workdir in runs.items():
  with open(os.path.join(workdir, "rm_eval.json")) as f:
    report = json.load(f)
  print(f"{loss:4s} test accuracy {report['accuracy']:.3f} (chosen longer {report['chosen_longer']['accuracy']:.3f}, "
        f"chosen shorter {report['chosen_shorter']['accuracy']:.3f}), pearson(score, length) "
        f"{report['pearson_score_length']:+.3f}")
'''),
    md("""
## Score pairs with `model.score`

`jaxpt.load(workdir)` of a reward-model run gives a model whose `score(prompts, responses)` builds the rows as the
trainer does. We score both responses of fresh adversarial pairs and plot reward against response length.
"""),
    code('''
from jaxpt.data.synthetic_preferences import make_synthetic_preferences

pairs = make_synthetic_preferences(64, seed=123, split="adversarial")
prompts = [p.prompt for p in pairs] * 2
responses = [p.chosen for p in pairs] + [p.rejected for p in pairs]
lengths = np.array([len(r) for r in responses])
print(repr(pairs[0].prompt), "| chosen:", repr(pairs[0].chosen), "| rejected:", repr(pairs[0].rejected))

fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=False)
for ax, (loss, workdir) in zip(axes, runs.items()):
  model = jaxpt.load(workdir)
  scores = model.score(prompts, responses)
  chosen, rejected = scores[:len(pairs)], scores[len(pairs):]
  accuracy = float(np.mean(chosen > rejected))
  ax.scatter(lengths[:len(pairs)], chosen, s=12, label="chosen (correct, shorter)")
  ax.scatter(lengths[len(pairs):], rejected, s=12, label="rejected (wrong, longer)")
  ax.set_title(f"{loss}: adversarial accuracy {accuracy:.2f}, corr(score, length) "
               f"{np.corrcoef(scores, lengths)[0, 1]:+.2f}", fontsize=9)
  ax.set_xlabel("response length (characters)")
  ax.set_ylabel("reward")
  ax.legend(fontsize=8)
plt.show()
'''),
    md("""
## The reward model in the RL loop: two GRPO steps rewarded by it

An RL run reads a reward model through its `reward` section: `reward.model` is the RM run's workdir (or `hf:DIR`,
its `jaxpt export-hf` export), scored on the run's mesh; `reward.verifier_weight=0` leaves the RM as the only
source. The policy here is a fresh tiny LM on jaxpt's arithmetic prompts with its own tokenizer, so the RM scores
the decoded prompt + response re-tokenized with its own (said once at start). Each step's metrics carry the RM's
mean score (`rm_score`), the verifier's (`gold_score`: the task still knows the right answer), the response length
and the bias monitors' shares (`bias_<name>_share`): the numbers to watch for reward hacking.
"""),
    code('''
from jaxpt.engine.metrics import read_metrics

rlhf_config = jaxpt.config_dict(
    jaxpt.GRPORunConfig, steps=2, log_every=1, eval_every=0, checkpoint_every=0, seed=0,
    model=dict(vocab_size=512, d_model=32, num_layers=1, num_heads=2, num_kv_heads=2, mlp_dim=64, max_seq_len=64,
               norm_scheme="pre"),
    task=dict(name="arithmetic", num_steps=1, max_value=9, ops="+", train_size=64, test_size=8),
    data=dict(prompts_per_step=2, max_prompt_len=32, eval_prompts=0), sampling=dict(max_new_tokens=16),
    grpo=dict(group_size=4, minibatches=1),
    reward=dict(model=runs["dir"], verifier_weight=0.0, normalize="batch"))  # prompt + response fit the RM's 64
rlhf_dir = os.path.join(WORKDIR, "rlhf")
jaxpt.train("grpo", rlhf_config, rlhf_dir)
for row in read_metrics(rlhf_dir):
  print(f"step {row['step']}: rm_score {row['rm_score']:+.3f}, gold_score {row['gold_score']:.3f}, response length "
        f"{row['response_length']:.1f}, reward_mean {row['reward_mean']:+.3f}")
'''),
    md("""
150 steps of a one-layer model are too few for a verdict: at this size both models can still rank mostly by
length, and the numbers move with the seed; the point here is the pipeline. The README and `experiments/` hold the
committed multi-seed comparison.

## For a real run

- `steps` in the hundreds (`experiments/configs/rm_tiny.py`: 300 steps, 2 layers, d_model 64, about a minute on
  CPU), `data.synthetic_train_pairs=4096`, several seeds.
- Real preferences: `data.source="jsonl"`, `data.path=...` (`{"prompt", "chosen", "rejected"}` per line, or
  hh-rlhf), and a pretrained backbone: `init_from="hf:/path/to/Llama-3.2-1B"` (see `experiments/configs/rm_hf.py`).
- DIR knobs: `rm.mi_weight` (lambda), `rm.inner_steps`, `rm.bias` (length, sycophancy, format).
- RLHF against the RM from an SFT policy (`jaxpt sft` -> `jaxpt rm` -> `jaxpt grpo --config
  experiments/configs/rlhf_tiny.py --config.init_from=SFT --config.reward.model=RM`, or `jaxpt ppo --config
  experiments/configs/ppo_tiny.py ...` with a learned critic); `reward_hacking.png` in the run's workdir plots
  RM score, gold score and length over steps.
"""),
    code(CLEANUP),
]

# ---------------------------------------------------------------------------------------------------------------
# grpo_clipo.ipynb
# ---------------------------------------------------------------------------------------------------------------

GRPO = [
    md("""
# SFT, then GRPO with and without CLIPO, on arithmetic word problems

jaxpt embeds a verifiable task: short arithmetic word problems whose answer is checked exactly. This notebook
fine-tunes a tiny policy on worked solutions (SFT), then runs a few GRPO steps from it, once plain and once with
CLIPO's contrastive reward, plots reward and accuracy per step, and samples answers before and after. The model and
run lengths are tiny (CPU, about a minute), so expect small moves, not a trained solver.
"""),
    code(INSTALL),
    code('''
import tempfile

import matplotlib.pyplot as plt
from tqdm.auto import tqdm

from jaxpt.engine.metrics import read_metrics

MADE_DIR = tempfile.mkdtemp(prefix="jaxpt-grpo-")  # the last cell removes it
WORKDIR = MADE_DIR  # or a folder of your own (e.g. on Drive), which is kept
MODEL = dict(vocab_size=512, d_model=32, num_layers=1, num_heads=2, num_kv_heads=2, mlp_dim=64, max_seq_len=80,
             norm_scheme="siamese_post_pre")
TASK = dict(name="arithmetic", num_steps=1, max_value=9, ops="+-", train_size=400, test_size=64)

sft_config = jaxpt.config_dict(
    jaxpt.SFTRunConfig, steps=300, log_every=50, eval_every=0, checkpoint_every=0, seed=0, model=MODEL, task=TASK,
    data=dict(seq_len=80, batch_size=16, eval_batches=1), optim=dict(learning_rate=1e-2, warmup_steps=5),
    decode=dict(prompt_len=48, max_new_tokens=24, eval_problems=32, batch_size=32))
sft_dir = os.path.join(WORKDIR, "sft")
result = jaxpt.train("sft", sft_config, sft_dir)
print({k: round(v, 3) for k, v in result.last_row.items() if isinstance(v, float)})
'''),
    md("""
## GRPO from the SFT run, with and without CLIPO

`init_from` points at the SFT workdir (its params and tokenizer). Each step samples `group_size` answers for each
of `prompts_per_step` prompts, rewards exact answers, and takes PPO-clip steps on group-normalised advantages.
With `clipo.enabled`, a linear head on the rollouts' hidden states adds the contrastive reward.
"""),
    code('''
def grpo_config(clipo: bool):
  return jaxpt.config_dict(
      jaxpt.GRPORunConfig, steps=12, log_every=1, eval_every=0, checkpoint_every=0, seed=0, init_from=sft_dir,
      model=MODEL, task=TASK, data=dict(prompts_per_step=4, max_prompt_len=48, eval_prompts=0),
      sampling=dict(max_new_tokens=24, temperature=1.0),
      grpo=dict(group_size=8, eps_hi=0.28, kl_coef=0.001, minibatches=1),
      clipo=dict(enabled=clipo, out_dim=16),
      optim=dict(learning_rate=3e-3, warmup_steps=0, end_lr_fraction=1.0, weight_decay=0.0, grad_clip=1.0))


runs = {}
for name, clipo in tqdm([("GRPO", False), ("GRPO + CLIPO", True)], desc="runs"):
  runs[name] = os.path.join(WORKDIR, name.replace(" + ", "_").lower())
  jaxpt.train("grpo", grpo_config(clipo), runs[name])
'''),
    md("""
Both runs start from the same policy with the same seed, so they sample the same rollouts until their updates
differ enough to change a sampled token. The CLIPO run's mean reward is lower by construction: it adds the
contrastive reward (<= 0) to correct rollouts. Twelve steps of a tiny policy are noise; the README's GRPO vs
GRPO + CLIPO experiment compares them over seeds.
"""),
    code('''
fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
for name, workdir in runs.items():
  rows = [r for r in read_metrics(workdir) if "reward_mean" in r]
  axes[0].plot([r["step"] for r in rows], [r["reward_mean"] for r in rows], "o-", label=name)
  axes[1].plot([r["step"] for r in rows], [r["accuracy"] for r in rows], "o-", label=name)
for ax, title in zip(axes, ("mean reward", "accuracy (exact answers)")):
  ax.set_xlabel("GRPO step")
  ax.set_title(title)
  ax.legend()
plt.show()
'''),
    md("""
## Answers before and after

Greedy answers of the SFT policy and of each GRPO policy to a few held-out problems, checked by the same verifier
the reward uses.
"""),
    code('''
from jaxpt.data import arithmetic
from jaxpt.data.math_task import prompt_text
from jaxpt.rl.rewards import math_reward

knobs = arithmetic.ArithmeticConfig(num_steps=TASK["num_steps"], max_value=TASK["max_value"], ops=TASK["ops"])
problems = arithmetic.generate(knobs, 4, seed=0, split="test")
prompts = [prompt_text(p.question) for p in problems]
for name, workdir in [("SFT", sft_dir), *runs.items()]:
  answers = jaxpt.load(workdir).generate(prompts, max_new_tokens=24)
  print(f"--- {name}")
  for problem, answer in zip(problems, answers):
    print(f"  [{'ok' if math_reward(answer, problem.answer) > 0 else '  '}] {problem.question!r} -> {answer!r}")
'''),
    md("""
## For a real run

- `experiments/configs/sft_tiny.py` + `grpo_tiny.py` (2 layers, d_model 128, 300 SFT + 60 GRPO steps: minutes
  on CPU); larger `task.max_value`, `task.num_steps` for harder problems.
- From a pretrained instruct model: `init_from="hf:/path/to/Qwen2.5-0.5B-Instruct"`, `task.name="gsm8k"`,
  `task.prompt_format="chat"` (`experiments/configs/grpo_hf.py`), on a TPU/GPU runtime with `model.dtype=
  "bfloat16"`; `grpo.group_size=8`, `data.prompts_per_step=32`, `sampling.max_new_tokens=512`.
- CLIPO: `clipo.objective` (infonce, supcon_out, supcon_in, soft_nn), `clipo.level`, `clipo.reward_coef`.
"""),
    code(CLEANUP),
]

# ---------------------------------------------------------------------------------------------------------------
# hf_model.ipynb
# ---------------------------------------------------------------------------------------------------------------

HF = [
    md("""
# A Hugging Face checkpoint in jaxpt: import, generate, GRPO, export

jaxpt reads local Hugging Face checkpoint directories (Llama, Mistral, Qwen2/2.5, Qwen3: `config.json` +
safetensors + `tokenizer.json`) into its Pre-Norm model, with the tokenizer and chat template, and writes them
back. This notebook uses the tiny random Qwen2 checkpoint that jaxpt's tests use (`tests/assets/hf/qwen2`, 64-wide,
2 layers, a 256-token vocabulary: its text is noise), so nothing is downloaded.
"""),
    code(INSTALL),
    code('''
import tempfile

import numpy as np

# The repository's test fixture: beside this notebook in a checkout (colab/..), or in the clone the install cell made.
FIXTURE = next(os.path.join(root, "tests", "assets", "hf", "qwen2")
               for root in (os.path.dirname(os.getcwd()), os.getcwd(), "jaxpt")
               if os.path.isdir(os.path.join(root, "tests", "assets", "hf", "qwen2")))
MADE_DIR = tempfile.mkdtemp(prefix="jaxpt-hf-")  # the last cell removes it
WORKDIR = MADE_DIR  # or a folder of your own, which is kept
print(FIXTURE, sorted(os.listdir(FIXTURE)))

model = jaxpt.load(f"hf:{FIXTURE}")
print(model.config)
'''),
    md("""
## Generate, and the chat template

`generate` tokenizes as the trainers do; `chat=True` wraps each prompt as one user turn of the checkpoint's chat
template (rendered with jinja2 as `transformers` renders it).
"""),
    code('''
print(model.generate(["What is 12 * 7?"], max_new_tokens=12))
print(model.tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True))
print(model.generate(["Hi"], max_new_tokens=8, chat=True, temperature=1.0, seed=0))
'''),
    md("""
## A few GRPO steps from the checkpoint

`init_from="hf:DIR"` fills the model's architecture from `config.json` (the config names only how the model
runs) and gives the run the checkpoint's tokenizer. The random model is never right, so the reward is 0: the steps
show the pipeline (sampling, verifier, PPO-clip update), not learning.
"""),
    code('''
from jaxpt.engine.metrics import read_metrics

grpo_dir = os.path.join(WORKDIR, "grpo")
config = jaxpt.config_dict(
    jaxpt.GRPORunConfig, steps=2, log_every=1, eval_every=0, checkpoint_every=0, init_from=f"hf:{FIXTURE}",
    model=dict(dtype="float32", remat="none", max_seq_len=128),
    task=dict(name="arithmetic", num_steps=1, max_value=9, train_size=8, test_size=8, prompt_format="plain"),
    data=dict(prompts_per_step=2, max_prompt_len=96, eval_prompts=0), sampling=dict(max_new_tokens=16),
    grpo=dict(group_size=4, minibatches=1), optim=dict(learning_rate=1e-3, warmup_steps=0))
result = jaxpt.train("grpo", config, grpo_dir)
for row in read_metrics(grpo_dir):
  print({k: round(v, 4) for k, v in row.items() if k in ("step", "loss", "reward_mean", "accuracy", "response_length")})
'''),
    md("""
## Export, and read the export back

A Pre-Norm model exports in transformers' own format (here Qwen2: `transformers.AutoModelForCausalLM` loads it);
SiameseNorm and other schemes export to a jaxpt-native HF-style directory. We export the policy of the GRPO run and
check that the re-imported model computes the same logits.
"""),
    code('''
tuned = jaxpt.load(grpo_dir)
export_dir = os.path.join(WORKDIR, "export")
print("format:", tuned.save_hf(export_dir), sorted(os.listdir(export_dir)))
back = jaxpt.load(f"hf:{export_dir}")
ids = np.array([[1, 17, 42, 99, 7]])
print("max |logits difference| after the round trip:",
      float(np.abs(np.asarray(back.logits(ids)) - np.asarray(tuned.logits(ids))).max()))
'''),
    md("""
## For a real model

- Put a checkpoint directory on the runtime (e.g. `huggingface-cli download Qwen/Qwen2.5-0.5B-Instruct
  --local-dir /content/qwen`; jaxpt itself never downloads) and use `hf:/content/qwen`.
- On a TPU or GPU runtime: `model.dtype="bfloat16"`, `mesh=...` to shard (`jaxpt.load(..., mesh=mesh)` streams
  each device's block), `max_seq_len` as the task needs.
- GRPO: `experiments/configs/grpo_hf.py` (GSM8K in the chat template, `task.prompt_format="chat"`), SFT / RM / DPO
  from `sft_hf.py`, `rm_hf.py`, `dpo_hf.py`; `jaxpt export-hf --workdir RUN --out DIR` from the command line.
"""),
    code(CLEANUP),
]

NOTEBOOKS = {
    "quickstart.ipynb": QUICKSTART,
    "losses_as_functions.ipynb": LOSSES,
    "reward_model_dir.ipynb": REWARD,
    "grpo_clipo.ipynb": GRPO,
    "hf_model.ipynb": HF,
}


def build(cells: list) -> nbformat.NotebookNode:
  notebook = nbformat.v4.new_notebook(cells=cells)
  notebook.metadata = {
      "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
      "language_info": {"name": "python"},
      "colab": {"provenance": []},
  }
  for index, cell in enumerate(notebook.cells):
    cell["id"] = f"cell-{index}"  # stable ids: regenerating gives the same file
  nbformat.validate(notebook)
  return notebook


def render(cells: list) -> str:
  return nbformat.writes(build(cells)) + "\n"


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--check", action="store_true", help="compare colab/*.ipynb with this file; write nothing")
  args = parser.parse_args(argv)
  stale = []
  os.makedirs(COLAB, exist_ok=True)
  for name, cells in NOTEBOOKS.items():
    path, text = os.path.join(COLAB, name), render(cells)
    if args.check:
      current = open(path).read() if os.path.exists(path) else None
      if current != text:
        stale.append(name)
    else:
      with open(path, "w") as f:
        f.write(text)
  if stale:
    print(f"stale (run python3 tools/make_notebooks.py): {', '.join(stale)}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
