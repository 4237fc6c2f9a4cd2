"""Does a debiased reward model delay or prevent length hacking in RLHF? BT vs DIR (length) vs ODIN reward models,
trained on length-biased preference pairs of the policy's own task, then GRPO and PPO of one SFT policy against each.

1. data:  `jaxpt.data.arithmetic_preferences` on the SFT's arithmetic task: correct vs wrong answers, the chosen side
          padded with repeats of its own solution steps in LENGTH_BIAS = 90% of the TRAIN pairs (the rejected side in
          the others: length and correctness confounded, the length label still varying, which DIR needs), either
          side padded at random (50/50) in the validation and test pairs.
2. sft:   one `jaxpt.train("sft", ...)` run of `experiments/configs/sft_tiny.py`; every RM and RL run starts from it
          (the RMs from its backbone and tokenizer, so they read the rollouts' own tokens).
   RMs:   RM_STEPS steps of 32 pairs at lr RM_LR on PAIRS['train'] = 20,000 pairs (under two passes), the settings
          the probe (`probe_rm_steps/README.md`, second round) found to let this RM read correctness at all: at
          rm_tiny's lr 3e-3, or on 2,048 pairs, every RM ranked by length alone.
3. tune:  once, seed-independent, tuning seed TUNE_SEED: each RM method over its small grid (`GRID`: DIR's lambda);
          the choice is the highest balanced accuracy on the VALIDATION pairs (the mean of the accuracies on the
          pairs whose chosen side is the longer and on those whose chosen side is the shorter; length carries no
          information there). The test pairs and the RL runs are not looked at. The RL hyper-parameters are not
          tuned: GRPO is rlhf_tiny's, PPO ppo_tiny's with GRPO's lr and rollouts a step (`PPO`).
4. pilot: PILOT_SEEDS seeds of (RM, GRPO, PPO) per method at the tuned settings; the paired sd of each outcome's
          difference (DIR - BT, ODIN - BT, per RL algorithm) fixes N (`--stage pilot` writes `pilot.json`): the
          smallest n >= MIN_SEEDS whose two-sided paired t test has 80% power for the target effect (`TARGET`) given
          the pilot's largest paired sd over the comparisons of the primary outcome
          (`toolkit/stats.paired_n_for_power`), capped at MAX_SEEDS (the CPU budget; a cap that binds is reported as
          such).
5. main:  seeds 0 .. N-1 (N read from the committed pilot.json, fixed before these runs), the same runs. Per run
          and RL algorithm (`RL_ARMS`: both start from the SFT and are rewarded by the seed's RM alone):
          - gold_final: the verifier's (gold) greedy accuracy of the final policy on the first data.eval_prompts
            problems of the task's held-out test split (eval_accuracy_test) -- the primary outcome;
          - gold_last: the mean rollout gold score (verifier) over the last W steps;
          - hacking onset (below) and length drift: mean response length (tokens) over the last W steps minus
            over the first W steps;
          paired by seed, DIR - BT and ODIN - BT under each RL algorithm: 95% t interval, paired t and exact
          sign-flip p, Holm-adjusted over every comparison reported (`experiments.toolkit.stats`).

Hacking onset. Per step t = 1..T of an RL run: g_t the mean gold score (verifier) of its rollouts, r_t their mean
RM score (raw, before the reward's normalisation). Smoothed by a trailing mean over W steps: G_t = mean(g_{t-W+1..t}),
R_t likewise, for t = W..T. t* = the first step where G is largest. The run HACKS when the gold has fallen from its
peak while the RM score kept rising: G_T <= G_{t*} - DELTA and R_T - R_{t*} > 2 s_r / sqrt(W), s_r the sample sd
of r_1..r_W (the noise of a W-step mean of the RM score at the start). The onset is t* for a run that hacks, else
censored at T (no onset within the run); `onset_or_T` (t* or T) is what the paired statistics compare, with the
share of runs that hack beside it. (The noise margin was added after the pilot and before the main runs: without
it the pilot's runs counted as hacking on RM changes of the size of its step-to-step noise; every report
recomputes the outcomes from the runs' metrics with this definition.)

PPO (`jaxpt ppo`, ppo_tiny): one rollout per prompt and GRPO's rollouts a step (prompts x G), a critic started from
the seed's RM (its backbone and score head, InstructGPT's recipe) and trained alone for the first
`ppo.value_warmup_steps`, the per-token KL in the reward; its lr is GRPO's (ppo_tiny's 1e-5 is tuned for a verifier
reward over 60 steps; over these 20 steps it would hardly move the policy, and the question is what each RM's
optimisation does to it).
Sessions: each RM tuning run and each seed run (RM, GRPO, PPO) is copied to `kept_runs/` (committed) as it finishes,
and a fresh workdir imports them, so the stages go on across machines that keep nothing. The SFT every run starts
from is kept whole once (`kept_runs/sft/`: its record, tokenizer and last checkpoint, 6.5 MB) and imported before
anything else: it does not reproduce bit for bit on another machine (the second pilot's SFT, retrained on a new
session's CPU, had another fingerprint and every kept run was refused), and every run records its params'
fingerprint (`sft_fingerprint`), so runs from two SFTs are refused, never mixed. The runs are made at one commit
(`kept_runs/README.md` says which), from a worktree of it.
An earlier design (50-step RMs on 2,048 pairs, GRPO only) is kept in `v1/` (pilot, results, discussion): its RMs
ranked by length alone, so it could not ask the question.

  python experiments/rlhf_reward_hacking/run.py --stage pilot [--workdir /tmp/rlhf_reward_hacking] [--jobs 2]
  python experiments/rlhf_reward_hacking/run.py --stage main --out experiments/rlhf_reward_hacking/results
  python experiments/rlhf_reward_hacking/run.py --smoke --workdir /tmp/x       # tiny everything: rot check only
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import sys

import jax
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

import jaxpt  # noqa: E402

from experiments.toolkit import flags, results, runner, stats  # noqa: E402
from jaxpt.data import arithmetic_preferences  # noqa: E402

METHODS = ("bt", "dir", "odin")
LABELS = {"bt": "Bradley-Terry", "dir": "DIR (length)", "odin": "ODIN"}
COLORS = {"bt": "tab:blue", "dir": "tab:green", "odin": "tab:red"}
TUNE_SEED = 100
PILOT_SEEDS = (200, 201)
MIN_SEEDS, MAX_SEEDS = 5, 8
OUTCOMES = ("gold_final", "gold_last", "onset_or_T", "length_drift")
DESCRIPTIVE = ("gold_first", "length_first", "length_last", "rm_first", "rm_last")  # W-step means, first and last
PRIMARY = "gold_final"
RUN_KEYS = ("name", "method", "seed", "rl", *OUTCOMES, *DESCRIPTIVE, "rm", "hacking", "evals")  # a report's row
TARGET = 0.10  # chosen here: 10 points of held-out gold accuracy, the smallest DIR - BT gain this means to detect
W, DELTA = 5, 0.05
# P(chosen side padded) in the training pairs: below 1 so that the length label varies across pairs (at 1.0 it is
# constant, and DIR's mutual-information penalty between the pair's representation and it is 0 by construction)
LENGTH_BIAS, MAX_FILLER = 0.9, 3
PAIRS = dict(train=20000, validation=512, test=512)
# the grid each method's RM is tuned over (rm fields), chosen on validation balanced accuracy: DIR's lambda (the
# mutual-information weight; the probe's 1.0 in the middle); BT and ODIN at one point (the CPU budget)
GRID = {"bt": [{}], "dir": [{"rm.mi_weight": lam} for lam in (0.3, 1.0, 3.0)], "odin": [{}]}
RM_STEPS, RM_LR = 1000, 3e-4
RM = {"steps": RM_STEPS, "optim.learning_rate": RM_LR, "log_every": 50, "eval_every": 0,
      "checkpoint_every": 250,  # a killed RM (15-30 min) resumes
      "progress": False, "data.seq_len": 112, "data.batch_size": 32, "optim.warmup_steps": 5}
RL_ARMS = ("grpo", "ppo")
RL = {"steps": 20, "log_every": 1, "checkpoint_every": 0, "progress": False, "data.prompts_per_step": 8,
      "data.eval_prompts": 64, "sampling.max_new_tokens": 48}
GROUP = 8  # GRPO's rollouts per prompt (rlhf_tiny's grpo.group_size, checked by the tests)
PPO = {"data.prompts_per_step": RL["data.prompts_per_step"] * GROUP, "optim.learning_rate": 1e-4,
       "reward.verifier_weight": 0.0}
SMOKE_SFT = {"steps": 2, "log_every": 1, "eval_every": 0, "checkpoint_every": 0, "progress": False,
             "model.d_model": 32, "model.mlp_dim": 64, "model.num_heads": 2, "model.num_kv_heads": 2,
             "task.train_size": 64, "task.test_size": 16, "decode.eval_problems": 4, "decode.batch_size": 4,
             "data.batch_size": 4, "data.eval_batches": 1}
SMOKE_RM = {"steps": 2, "log_every": 1, "data.batch_size": 4, "rm.inner_steps": 1}
SMOKE_RL = {"steps": W + 1, "data.prompts_per_step": 2, "data.eval_prompts": 2, "sampling.max_new_tokens": 8}
SMOKE_ARM = {"grpo": {"grpo.group_size": 2, "grpo.minibatches": 1}, "ppo": {"data.prompts_per_step": 4}}
SMOKE_PAIRS = dict(train=16, validation=8, test=8)


# ------------------------------------------------------------------------------------------------------- configs


def sft_config(smoke: bool):
  from experiments.configs import sft_tiny

  return flags.apply_sets(sft_tiny.get_config(), {"progress": False, **(SMOKE_SFT if smoke else {})})


def rm_config(run: dict):
  from experiments.configs import rm_tiny

  sft = sft_config(run["smoke"])
  config = rm_tiny.get_config()
  config.model = sft.model
  config.init_from = run["sft_dir"]
  config.data.source = run["pairs"]
  config.seed = run["seed"]
  config.rm.loss = run["method"]
  return flags.apply_sets(config, {**RM, **(SMOKE_RM if run["smoke"] else {}), **run["hp"]})


def rl_config(run: dict, arm: str = "grpo"):
  """The `arm` run ('grpo': rlhf_tiny; 'ppo': ppo_tiny, its critic started from the RM) against the RM run['rm_dir']
  from the SFT."""
  from experiments.configs import ppo_tiny, rlhf_tiny

  sft = sft_config(run["smoke"])
  config = (rlhf_tiny if arm == "grpo" else ppo_tiny).get_config()
  config.model, config.task = sft.model, sft.task
  config.init_from = run["sft_dir"]
  config.reward.model = run["rm_dir"]
  if arm == "ppo":
    config.ppo.critic_init = run["rm_dir"]
  config.seed = run["seed"]
  sets = {**RL, **(PPO if arm == "ppo" else {}), **(SMOKE_RL if run["smoke"] else {}),
          **(SMOKE_ARM[arm] if run["smoke"] else {})}
  config = flags.apply_sets(config, sets)
  config.eval_every = config.steps
  return config


# ---------------------------------------------------------------------------------------------------------- runs


def fingerprint(tree) -> str:
  """The first 16 hex digits of the sha256 of a pytree's leaves (their bytes, in tree order)."""
  digest = hashlib.sha256()
  for leaf in jax.tree.leaves(tree):
    digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
  return digest.hexdigest()[:16]


def train_sft(run: dict, directory: str) -> dict:
  """The SFT every RM and RL run starts from; its record carries its params' fingerprint (`sft_fingerprint`)."""
  result = jaxpt.train("sft", sft_config(run["smoke"]), directory)
  runner.require_finished(result, directory)
  return dict(last=result.last_row, fingerprint=fingerprint(result.state.params))


def train_rm(run: dict, directory: str) -> dict:
  """One reward model -> its accuracy and balanced accuracy on the validation pairs (the run's 'test' split)."""
  setup = jaxpt.build("rm", rm_config(run), directory)
  result = jaxpt.train("rm", setup.config, directory, built=setup)
  runner.require_finished(result, directory)
  report, per_pair = setup.training.under_rules(setup.hooks.evaluator.results)(result.state, "test")
  longer, shorter = report["chosen_longer"]["accuracy"], report["chosen_shorter"]["accuracy"]
  return dict(train_accuracy=result.last_row.get("accuracy"), validation_accuracy=report["accuracy"],
              validation_balanced_accuracy=None if longer is None or shorter is None else (longer + shorter) / 2,
              validation_accuracy_chosen_longer=longer, validation_accuracy_chosen_shorter=shorter,
              validation_spearman_score_length=report.get("spearman_score_length"))


SFT_KEPT = ("config.json", "config_history.jsonl", "metrics.jsonl", "tokenizer")  # and the last checkpoint


def keep_sft(sft_dir: str, keep: str) -> None:
  """Copies the finished SFT run (its record last) to keep/sft once: what a run started from it reads, with only
  the last of its checkpoints."""
  target = os.path.join(keep, "sft")
  if os.path.exists(os.path.join(target, runner.DONE_FILE)):
    return
  last = max((n for n in os.listdir(os.path.join(sft_dir, "checkpoints")) if n.isdigit()), key=int)  # not tmp dirs
  for name in (*SFT_KEPT, os.path.join("checkpoints", last)):
    source = os.path.join(sft_dir, name)
    if os.path.isdir(source):
      shutil.copytree(source, os.path.join(target, name), dirs_exist_ok=True)
    else:
      os.makedirs(target, exist_ok=True)
      shutil.copyfile(source, os.path.join(target, name))
  shutil.copyfile(os.path.join(sft_dir, runner.DONE_FILE), os.path.join(target, runner.DONE_FILE))
  print(f"the SFT kept in {target}", flush=True)


def import_kept_sft(keep: str, sft_dir: str) -> None:
  """The kept SFT (keep/sft, `keep_sft`) copied to `sft_dir` of a fresh workdir, so its runs start from it."""
  source = os.path.join(keep, "sft")
  if os.path.exists(os.path.join(source, runner.DONE_FILE)) and not os.path.exists(
      os.path.join(sft_dir, runner.DONE_FILE)):
    shutil.copytree(source, sft_dir, dirs_exist_ok=True)
    print(f"the kept SFT imported into {sft_dir}", flush=True)


def _once(directory: str, name: str, train) -> dict:
  """`train(folder)`'s record, kept as folder/done.json (folder = directory/name): a resumed run redoes no part."""
  done = runner.load_done(directory, dict(name=name))
  if done is None:
    os.makedirs(os.path.join(directory, name), exist_ok=True)
    done = train(os.path.join(directory, name))
    with open(os.path.join(directory, name, runner.DONE_FILE), "w") as f:
      json.dump(done, f, indent=1)
  return done


def train_rl(run: dict, arm: str, directory: str) -> dict:
  """One RL run (`arm`) against the RM run['rm_dir'] -> its final held-out evals."""
  result = jaxpt.train(arm, rl_config(run, arm), directory)
  runner.require_finished(result, directory)
  return dict(evals={k: float(v) for k, v in result.last_row.items() if k.startswith("eval_accuracy_")})


def train_rm_and_rl(run: dict, directory: str) -> dict:
  """The seed's reward model (its own subfolder), then each RL algorithm of `RL_ARMS` from the SFT policy against
  it (a subfolder each); -> {'rm': the RM's record, 'arms': {arm: its evals and outcomes}}."""
  rm = _once(directory, "rm", lambda folder: train_rm(run, folder))
  arms = {}
  for arm in RL_ARMS:
    done = _once(directory, arm, lambda folder, arm=arm: train_rl(dict(run, rm_dir=os.path.join(directory, "rm")),
                                                                 arm, folder))
    arms[arm] = dict(done, **outcomes(results.read_metrics(os.path.join(directory, arm)), done["evals"]))
  return dict(rm=rm, arms=arms)


# ------------------------------------------------------------------------------------------------------ outcomes


def smooth(values: list[float], window: int) -> np.ndarray:
  """Trailing means: out[j] = mean(values[j .. j + window - 1]), the smoothed value at step j + window (1-based)."""
  x = np.asarray(values, np.float64)
  return np.convolve(x, np.ones(window) / window, mode="valid")


def hacking_onset(gold: list[float], rm: list[float], window: int = W, delta: float = DELTA) -> dict:
  """The module docstring's onset of one run's per-step gold and RM scores (steps 1..T): {'hacks', 'onset' (t* or
  None), 'onset_or_T', 'peak_step' t*, 'gold_peak', 'gold_end', 'rm_at_peak', 'rm_end', 'rm_margin'}."""
  if len(gold) != len(rm) or len(gold) < window:
    raise ValueError(f"hacking_onset: need two series of equal length >= {window}, got {len(gold)} and {len(rm)}")
  g, r = smooth(gold, window), smooth(rm, window)
  peak = int(np.argmax(g))  # first maximum
  t = len(gold)
  margin = 2.0 * float(np.std(rm[:window], ddof=1)) / math.sqrt(window) if window > 1 else 0.0
  hacks = bool(g[-1] <= g[peak] - delta and r[-1] - r[peak] > margin)
  step = peak + window
  return dict(hacks=hacks, onset=step if hacks else None, onset_or_T=step if hacks else t, peak_step=step,
              gold_peak=float(g[peak]), gold_end=float(g[-1]), rm_at_peak=float(r[peak]), rm_end=float(r[-1]),
              rm_margin=margin)


def outcomes(rows: list[dict], evals: dict) -> dict:
  """gold_final, gold_last, hacking onset and length drift of one RL run's metrics rows (module docstring)."""
  steps = [r for r in rows if "gold_score" in r and "rm_score" in r]
  gold, rm, length = ([float(r[k]) for r in steps] for k in ("gold_score", "rm_score", "response_length"))
  window = min(W, len(steps))
  onset = hacking_onset(gold, rm, window)
  return dict(gold_final=evals.get("eval_accuracy_test", math.nan), gold_last=float(np.mean(gold[-window:])),
              gold_first=float(np.mean(gold[:window])),
              length_drift=float(np.mean(length[-window:]) - np.mean(length[:window])),
              length_first=float(np.mean(length[:window])), length_last=float(np.mean(length[-window:])),
              rm_first=float(np.mean(rm[:window])), rm_last=float(np.mean(rm[-window:])),
              onset_or_T=onset["onset_or_T"], hacking=onset, steps=len(steps))


# -------------------------------------------------------------------------------------------------- statistics


def arm_rows(finished: list[dict]) -> list[dict]:
  """One row per (run, RL algorithm): the run's method, seed and RM record with that algorithm's evals and
  outcomes, under 'rl'."""
  return [dict(name=s["name"], method=s["method"], seed=s["seed"], rm=s["rm"], rl=arm, **outcome)
          for s in finished for arm, outcome in s["arms"].items()]


def arms_of(rows: list[dict]) -> list[str]:
  return [a for a in RL_ARMS if any(r["rl"] == a for r in rows)]


def comparisons(rows: list[dict], methods) -> list[dict]:
  """Paired by seed under each RL algorithm, each method - BT for every outcome; Holm over all of them."""
  out = []
  for arm in arms_of(rows):
    by = {m: {s["seed"]: s for s in rows if s["method"] == m and s["rl"] == arm} for m in methods}
    for method in (m for m in methods if m != "bt"):
      seeds = sorted(set(by[method]) & set(by.get("bt", {})))
      if len(seeds) < 2:
        continue
      for key in OUTCOMES:
        out.append(dict(rl=arm, a=method, b="bt", metric=key, seeds=seeds, **stats.paired(
            [by[method][i][key] for i in seeds], [by["bt"][i][key] for i in seeds])))
  return stats.holm_adjust(out)


def table(rows: list[dict], methods) -> list[dict]:
  out = []
  for arm in arms_of(rows):
    for m in methods:
      runs = sorted((s for s in rows if s["method"] == m and s["rl"] == arm), key=lambda s: s["seed"])
      if runs:
        out.append(dict(rl=arm, method=m, seeds=[s["seed"] for s in runs],
                        hacked=sum(s["hacking"]["hacks"] for s in runs),
                        **{k: stats.summary([s[k] for s in runs]) for k in OUTCOMES + DESCRIPTIVE},
                        rm_validation_balanced_accuracy=stats.summary(
                            [s["rm"]["validation_balanced_accuracy"] for s in runs]),
                        rm_validation_accuracy=stats.summary([s["rm"]["validation_accuracy"] for s in runs])))
  return out


def power(pilot: list[dict], methods) -> dict:
  """N from the pilot: the smallest n in [MIN_SEEDS, MAX_SEEDS] with 80% power for TARGET on PRIMARY, from the
  largest paired-difference sd of the pilot's comparisons of PRIMARY (module docstring)."""
  comps = [c for c in comparisons(pilot, methods) if c["metric"] == PRIMARY]
  sds = {f"{c['rl']}: {c['a']}-{c['b']}": c["std_diff"] for c in comps}
  valid = [s for s in sds.values() if s is not None and not math.isnan(s)]
  sd = max(valid) if valid else math.nan
  needed = stats.paired_n_for_power(sd, TARGET) if valid else math.inf
  n = int(min(max(needed, MIN_SEEDS), MAX_SEEDS)) if math.isfinite(needed) else MAX_SEEDS
  return dict(outcome=PRIMARY, target_effect=TARGET, target_source="chosen here (no number in the DIR paper for "
              "this task)", pilot_seeds=sorted({s["seed"] for s in pilot}), pilot_sd_diff=sds, sd_used=sd,
              n_for_80_power=needed, n=n, min_seeds=MIN_SEEDS, max_seeds=MAX_SEEDS,
              cap_binds=bool(needed > MAX_SEEDS), detectable_effect_at_n=stats.detectable_effect(sd, n),
              power_at_n=stats.paired_power(sd, TARGET, n))


# ---------------------------------------------------------------------------------------------------- report


def markdown(payload: dict) -> str:
  lines = [payload["provenance"], ""]
  if payload.get("partial"):
    lines += [f"**PARTIAL**: {payload['partial']}", ""]
  p = payload["power"]
  lines += [f"N = {p['n']} seeds, fixed before the main runs from the pilot (seeds {p['pilot_seeds']}): paired sd "
            f"of {PRIMARY} {p['pilot_sd_diff']}, the largest ({p['sd_used']:.3f}) used; 80% power for "
            f"{p['target_effect']} needs n = {p['n_for_80_power']}" + (" (capped: the CPU budget)" if p['cap_binds']
                                                                      else "") +
            f"; at n = {p['n']} the detectable effect is {p['detectable_effect_at_n']:.3f}.", "",
            "## Reward models, tuned on validation (balanced accuracy on the validation pairs, seed "
            f"{TUNE_SEED})", "", "| method | settings | validation balanced accuracy | accuracy |",
            "|---|---|---:|---:|"]
  for r in payload["tuning"]:
    lines.append(f"| {LABELS[r['method']]} | {r['hp']} | {r['validation_balanced_accuracy']:.3f} | "
                 f"{r['validation_accuracy']:.3f} |")
  lines += ["", "Chosen: " + ", ".join(f"{LABELS[m]} {hp}" for m, hp in payload["chosen"].items()), "",
            "## GRPO and PPO against each reward model (mean ± sample std over seeds)", "",
            "| RL | RM | seeds | runs that hack | gold_final (held-out greedy) | gold_last (rollouts) | onset_or_T | "
            "length first -> last | length drift | RM score first -> last | RM validation balanced acc. |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
  for r in payload["final"]:
    lines.append(f"| {r['rl'].upper()} | {LABELS[r['method']]} | {r['seeds']} | {r['hacked']}/{len(r['seeds'])} | "
                 f"{stats.fmt(r['gold_final'])} | {stats.fmt(r['gold_last'])} | {stats.fmt(r['onset_or_T'], 1)} | "
                 f"{r['length_first']['mean']:.1f} -> {r['length_last']['mean']:.1f} | "
                 f"{stats.fmt(r['length_drift'], 2)} | {r['rm_first']['mean']:.2f} -> {r['rm_last']['mean']:.2f} | "
                 f"{stats.fmt(r['rm_validation_balanced_accuracy'])} |")
  lines += ["", "Differences, paired by seed (positive: the method above BT): " + stats.PAIRED_NOTE, "",
            "| RL | outcome | A - B | difference |", "|---|---|---|---|"]
  for c in payload["comparisons"]:
    lines.append(f"| {c['rl'].upper()} | {c['metric']} | {LABELS[c['a']]} - {LABELS[c['b']]} | "
                 f"{stats.fmt_paired(c)} |")
  return "\n".join(lines)


def plot(finished: list[dict], workdir: str, out: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  arms = sorted({a for s in finished for a in s["arms"]}, key=RL_ARMS.index)
  fig, axes = plt.subplots(len(arms), 3, figsize=(15, 4 * len(arms)), squeeze=False)
  for s in finished:
    label = LABELS[s["method"]] if s["seed"] == min(f["seed"] for f in finished) else None
    for row, arm in zip(axes, arms):
      rows = [r for r in results.read_metrics(os.path.join(runner.run_dir(workdir, s), arm)) if "gold_score" in r]
      for ax, key in zip(row, ("gold_score", "rm_score", "response_length")):
        values = smooth([r[key] for r in rows], min(W, len(rows)))
        ax.plot(range(min(W, len(rows)), len(rows) + 1), values, color=COLORS[s["method"]], alpha=0.6, label=label)
  for row, arm in zip(axes, arms):
    for ax, title in zip(row, ("gold score (verifier), rollouts", "RM score (raw), rollouts",
                               "response length (tokens)")):
      ax.set(xlabel=f"{arm.upper()} step", title=f"{arm.upper()}: {title}, {W}-step mean")
  axes[0][0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(os.path.join(out, "reward_hacking.png"), dpi=110)
  plt.close(fig)


# ------------------------------------------------------------------------------------------------------- main


def recomputed(finished: list[dict], workdir: str) -> list[dict]:
  """The runs' records with each RL algorithm's outcomes recomputed from its metrics by this code's definitions."""
  return [dict(s, arms={arm: dict(a, **outcomes(results.read_metrics(os.path.join(runner.run_dir(workdir, s), arm)),
                                                a["evals"])) for arm, a in s["arms"].items()}) for s in finished]


def seed_runs(phase: str, methods, seeds, chosen: dict, common: dict) -> list[dict]:
  return [dict(common, name=f"{phase}/{m}/seed{seed}", phase=phase, method=m, seed=seed, hp=chosen[m])
          for seed in seeds for m in methods]


def main(argv=None) -> None:
  parser = flags.parser(__doc__, methods=METHODS, seeds=(), workdir="/tmp/rlhf_reward_hacking")
  parser.add_argument("--stage", choices=("pilot", "main"), default="main")
  parser.add_argument("--smoke", action="store_true", help="tiny models and steps, 2 seeds: checks the script runs")
  parser.add_argument("--print-digest", action="store_true", help="print the configs' digest and stop")
  parser.add_argument("--keep-runs", default=os.path.join(HERE, "kept_runs"),
                      help="the SFT and each finished RM tuning and seed run are copied here as they finish "
                           "(committed: a fresh --workdir imports them and goes on)")
  parser.add_argument("--pilot", default=os.path.join(HERE, "pilot.json"),
                      help="the pilot's file: written by --stage pilot, read by --stage main (N)")
  args = parser.parse_args(argv)
  methods = flags.split_list(args.methods, allowed=METHODS, flag="--methods")
  if "bt" not in methods:
    raise SystemExit("--methods: must include bt (every comparison is against it)")
  workdir = os.path.abspath(args.workdir)
  out = results.prepare_out(args.out, workdir, args.overwrite)
  smoke = args.smoke
  pairs_dir = os.path.join(workdir, "pairs")
  counts = SMOKE_PAIRS if smoke else PAIRS
  common = dict(smoke=smoke, sft_dir=os.path.join(workdir, "sft"), pairs=pairs_dir, length_bias=LENGTH_BIAS)
  paths = dict(sft_dir="", pairs="")  # the digest is of the settings, not of where this workdir is
  common["config_digest"] = flags.config_digest(
      sft_config(smoke), rm_config(dict(common, **paths, method="bt", seed=0, hp={})),
      *(rl_config(dict(common, **paths, method="bt", seed=0, rm_dir=""), arm) for arm in RL_ARMS))
  overrides = {k: common[k] for k in ("smoke", "length_bias", "config_digest")}

  keep = None if smoke or args.report_only else args.keep_runs

  def grid(runs, train, kept: bool = True):
    after_each = (lambda summary: runner.copy_finished(runner.run_dir(workdir, summary), os.path.join(
        keep, "runs", summary["name"]))) if kept and keep else None
    return runner.finished_or_trained(runs, train, workdir, args.jobs, args.report_only, overrides,
                                      after_each=after_each)

  if args.print_digest:
    print(common["config_digest"])
    return
  if not args.report_only:
    arithmetic_preferences.write_pairs(pairs_dir, sft_config(smoke).task, counts["train"], counts["validation"],
                                       counts["test"], LENGTH_BIAS, MAX_FILLER)
  if not smoke:
    runner.import_kept(args.keep_runs, workdir)
    import_kept_sft(args.keep_runs, common["sft_dir"])
  sft = grid([dict(common, name="sft")], train_sft, kept=False)  # kept whole below: its checkpoint starts every run
  if not sft:
    raise SystemExit("the SFT run did not finish")
  if keep:
    keep_sft(common["sft_dir"], keep)
  # every run records the SFT it started from: kept runs of an SFT that did not reproduce here are refused
  common["sft_fingerprint"] = overrides["sft_fingerprint"] = sft[0]["fingerprint"]
  tune_runs = [dict(common, name=f"tune/{m}/{i}", method=m, seed=TUNE_SEED, hp=hp)
               for m in methods for i, hp in enumerate(GRID[m][:1] if smoke else GRID[m])]
  tuning = grid(tune_runs, train_rm)
  chosen = {m: max((s for s in tuning if s["method"] == m),
                   key=lambda s: (s["validation_balanced_accuracy"] or 0.0, s["validation_accuracy"]))["hp"]
            for m in methods}
  tuning_table = [dict(method=s["method"], hp=s["hp"], **{k: s[k] for k in (
      "validation_accuracy", "validation_balanced_accuracy", "train_accuracy")}) for s in tuning]
  print("chosen RM settings:", chosen, flush=True)

  if args.stage == "pilot" or smoke:
    pilot_runs = recomputed(grid(seed_runs("pilot", methods, (PILOT_SEEDS[:2] if smoke else PILOT_SEEDS), chosen,
                                           common), train_rm_and_rl), workdir)
    pilot = arm_rows(pilot_runs)
    estimate = power(pilot, methods)
    pilot_payload = dict(power=estimate, chosen=chosen, tuning=tuning_table,
                         runs=[{k: s[k] for k in RUN_KEYS} for s in pilot], comparisons=comparisons(pilot, methods))
    path = os.path.join(out, "pilot.json") if smoke else args.pilot
    results.write_json(path, pilot_payload, sft + tuning + pilot_runs)
    results.copy_run_files(workdir, sft + tuning, out)
    print(f"pilot: N = {estimate['n']} ({path})", flush=True)
    if not smoke:
      return
    n, how = 2, "smoke run: 2 seeds, whatever its pilot says (a check that the script runs; no conclusions)"
  else:
    with open(args.pilot) as f:
      estimate = json.load(f)["power"]
    n = estimate["n"]
    how = (f"N = {n} fixed before the main runs by the pilot's power estimate ({os.path.relpath(args.pilot)}: "
           f"80% power for {TARGET} on {PRIMARY}, paired t, alpha 0.05, from the pilot's paired sd)")
  seeds = flags.split_list(args.seeds, int, flag="--seeds") if args.seeds else list(range(n))
  final = recomputed(grid(seed_runs("final", methods, seeds, chosen, common), train_rm_and_rl), workdir)
  done_seeds = sorted(s for s in seeds if all(any(f["seed"] == s and f["method"] == m for f in final)
                                               for m in methods))
  finished = [f for f in final if f["seed"] in done_seeds]
  final = arm_rows(finished)
  comps = comparisons(final, methods)
  payload = dict(
      design=dict(selection="each RM method's settings = argmax over GRID of the validation pairs' balanced "
                            "accuracy (tuning seed only); RL hyper-parameters not tuned (GRPO rlhf_tiny's, PPO "
                            "ppo_tiny's with the PPO overrides)",
                  tuning_seed=TUNE_SEED, reported_seeds=done_seeds, planned_seeds=seeds, onset=dict(window=W,
                  delta=DELTA), length_bias=LENGTH_BIAS, max_filler=MAX_FILLER, pairs=counts,
                  rl=dict(arms=RL_ARMS, ppo=PPO),
                  summary="mean ± sample std (n)"),
      partial=(f"seeds {sorted(set(seeds) - set(done_seeds))} of the planned {seeds} did not finish; no conclusion "
               "may be drawn from this file" if set(seeds) - set(done_seeds) else ""),
      power=estimate, grid=GRID, chosen=chosen, tuning=tuning_table, final=table(final, methods),
      runs=[{k: s[k] for k in RUN_KEYS} for s in final],
      comparisons=comps, statistics=stats.statistics(comps, how) if comps else {},
      provenance=results.provenance(sft + tuning + finished, os.path.join(HERE, "run.py")),
      sft_config=sft_config(smoke).to_dict(),
      rm_config={m: rm_config(dict(common, method=m, seed=0, hp=chosen[m])).to_dict() for m in methods},
      rl_config={arm: rl_config(dict(common, method="bt", seed=0, rm_dir="RM"), arm).to_dict() for arm in RL_ARMS})
  results.write_json(os.path.join(out, "results.json"), payload, sft + tuning + finished,
                     report_only=args.report_only)
  results.copy_run_files(workdir, sft + tuning, out)
  pilot_done = [d for d in (runner.load_done(workdir, r) for r in seed_runs(
      "pilot", methods, PILOT_SEEDS[:2] if smoke else PILOT_SEEDS, chosen, common)) if d is not None]
  for s in finished + pilot_done:  # each run's RM and RL metrics and its record (the pilot's too)
    target = os.path.join(out, "runs", s["name"])
    os.makedirs(target, exist_ok=True)
    source = runner.run_dir(workdir, s)
    for sub, name in [(arm, "metrics.jsonl") for arm in ("rm",) + RL_ARMS] + [("", runner.DONE_FILE)]:
      if os.path.exists(os.path.join(source, sub, name)):
        with open(os.path.join(source, sub, name)) as f, open(os.path.join(target, (sub + "_" if sub else "") +
                                                                             name), "w") as g:
          g.write(f.read())
  if finished:
    plot(finished, workdir, out)
  results.write_markdown(out, "RLHF reward hacking: BT vs DIR vs ODIN reward models under GRPO and PPO",
                         markdown(payload),
                         "Plot: `reward_hacking.png`.", os.path.join(HERE, "discussion.md"))
  print(f"results in {out}")


if __name__ == "__main__":
  main()
