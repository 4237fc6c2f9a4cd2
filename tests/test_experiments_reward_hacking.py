"""experiments/rlhf_reward_hacking/run.py: the hacking onset and outcomes against plain NumPy statements, the power
estimate, the configs it trains with (checked, nothing compiled), and its --smoke pipeline (slow)."""

import importlib
import json
import math
import os
import shutil

import numpy as np
import pytest

from experiments.toolkit import stats
from jaxpt.config import from_section
from jaxpt.trainers.grpo import GRPORunConfig
from jaxpt.trainers.ppo_config import PPORunConfig
from jaxpt.trainers.rm import RMRunConfig
from jaxpt.trainers.sft import SFTRunConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "experiments", "rlhf_reward_hacking", "run.py")


@pytest.fixture(scope="module")
def run():
  return importlib.import_module("experiments.rlhf_reward_hacking.run")  # importable: its workers unpickle it


def _onset_reference(gold, rm, window, delta):
  """The docstring's definition, written out with float64 loops."""
  t = len(gold)
  g = [sum(gold[j - window + 1:j + 1]) / window for j in range(window - 1, t)]  # G at steps window..T
  r = [sum(rm[j - window + 1:j + 1]) / window for j in range(window - 1, t)]
  peak = 0
  for j in range(len(g)):
    if g[j] > g[peak]:
      peak = j
  mean = sum(rm[:window]) / window
  sd = math.sqrt(sum((x - mean) ** 2 for x in rm[:window]) / (window - 1))
  hacks = g[-1] <= g[peak] - delta and r[-1] - r[peak] > 2 * sd / math.sqrt(window)
  return hacks, (peak + window if hacks else t), peak + window


@pytest.mark.parametrize("seed", range(6))
def test_onset_matches_reference(run, seed):
  rng = np.random.default_rng(seed)
  t = 30
  steps = np.arange(1, t + 1)
  peak = int(rng.integers(8, 25))
  gold = np.where(steps <= peak, 0.5 + 0.02 * steps, 0.5 + 0.02 * peak - 0.03 * (steps - peak))
  gold = (gold + rng.normal(0, 0.02 * (seed % 3), t)).tolist()
  rm = (0.1 * steps * (1 if seed % 2 else -1) + rng.normal(0, 0.05, t)).tolist()
  got = run.hacking_onset(gold, rm, 5, 0.05)
  hacks, onset_or_t, peak_step = _onset_reference(gold, rm, 5, 0.05)
  assert (got["hacks"], got["onset_or_T"], got["peak_step"]) == (hacks, onset_or_t, peak_step)
  assert got["onset"] == (onset_or_t if hacks else None)


def test_onset_cases(run):
  rising = list(np.linspace(0, 1, 20))
  hump = [0.5 + 0.05 * min(i, 10) - 0.05 * max(0, i - 10) for i in range(20)]
  got = run.hacking_onset(hump, rising, 5, 0.05)  # gold peaks (smoothed, at step 13), falls; RM rises: hacks
  assert got["hacks"] and got["onset"] == 13 and got["peak_step"] == 13
  assert not run.hacking_onset(hump, rising[::-1], 5, 0.05)["hacks"]  # RM fell too: not hacking
  assert run.hacking_onset(rising, rising, 5, 0.05) == dict(
      hacks=False, onset=None, onset_or_T=20, peak_step=20, gold_peak=pytest.approx(np.mean(rising[-5:])),
      gold_end=pytest.approx(np.mean(rising[-5:])), rm_at_peak=pytest.approx(np.mean(rising[-5:])),
      rm_end=pytest.approx(np.mean(rising[-5:])), rm_margin=pytest.approx(2 * np.std(rising[:5], ddof=1) / 5 ** 0.5))
  noisy = [(-1) ** i * 0.1 for i in range(20)]  # the RM's rise (0.04) is inside its noise margin (0.098): no hacking
  assert not run.hacking_onset(hump, [x + 0.002 * i for i, x in enumerate(noisy)], 5, 0.05)["hacks"]
  with pytest.raises(ValueError, match="equal length"):
    run.hacking_onset([0.0] * 4, [0.0] * 4, 5, 0.05)


def test_outcomes(run):
  t = 12
  rows = [dict(step=i + 1, gold_score=0.1 * i, rm_score=1.0 - 0.01 * i, response_length=20.0 + i) for i in range(t)]
  rows.insert(3, dict(step=3, eval_accuracy_test=0.3))  # rows without the step metrics are skipped
  got = run.outcomes(rows, {"eval_accuracy_test": 0.75})
  assert got["gold_final"] == 0.75 and got["steps"] == t
  np.testing.assert_allclose(got["gold_last"], np.mean([0.1 * i for i in range(t - 5, t)]))
  np.testing.assert_allclose(got["gold_first"], np.mean([0.1 * i for i in range(5)]))
  np.testing.assert_allclose(got["length_drift"], (20 + np.arange(t - 5, t)).mean() - (20 + np.arange(5)).mean())
  assert got["onset_or_T"] == t and not got["hacking"]["hacks"]


def test_arm_rows_flatten_each_rl_algorithm(run):
  record = dict(name="final/dir/seed3", method="dir", seed=3, rm={"validation_accuracy": 0.6},
                arms={"grpo": {"gold_final": 0.4}, "ppo": {"gold_final": 0.7}})
  assert run.arm_rows([record]) == [
      dict(name="final/dir/seed3", method="dir", seed=3, rm={"validation_accuracy": 0.6}, rl="grpo", gold_final=0.4),
      dict(name="final/dir/seed3", method="dir", seed=3, rm={"validation_accuracy": 0.6}, rl="ppo", gold_final=0.7)]


def test_comparisons_and_power(run):
  finished = []
  for seed, (b, d, o) in enumerate([(0.5, 0.6, 0.4), (0.6, 0.65, 0.5), (0.55, 0.7, 0.58)]):
    for method, value in zip(("bt", "dir", "odin"), (b, d, o)):
      for arm, shift in (("grpo", 0.0), ("ppo", 0.1 * seed)):  # PPO: DIR - BT and ODIN - BT as GRPO's
        finished.append(dict(method=method, seed=seed, rl=arm, gold_final=value + shift, gold_last=value,
                             onset_or_T=30, length_drift=value))
  finished[-1]["gold_final"] += 0.3  # ... except ODIN on seed 2 under PPO: the largest paired sd
  comps = run.comparisons(finished, run.METHODS)
  assert len(comps) == 2 * 2 * len(run.OUTCOMES)
  d = np.array([0.1, 0.05, 0.15])
  for arm in run.RL_ARMS:
    dir_gold = next(c for c in comps if c["a"] == "dir" and c["metric"] == "gold_final" and c["rl"] == arm)
    np.testing.assert_allclose(dir_gold["mean_diff"], d.mean())
    np.testing.assert_allclose(dir_gold["std_diff"], d.std(ddof=1))
    assert "p_t_holm" in dir_gold
  p = run.power(finished, run.METHODS)
  assert set(p["pilot_sd_diff"]) == {"grpo: dir-bt", "grpo: odin-bt", "ppo: dir-bt", "ppo: odin-bt"}
  sd = np.std([-0.1, -0.1, 0.33], ddof=1)
  np.testing.assert_allclose(p["sd_used"], sd)
  assert p["n_for_80_power"] == stats.paired_n_for_power(sd, run.TARGET)
  assert p["n"] == min(max(p["n_for_80_power"], run.MIN_SEEDS), run.MAX_SEEDS)
  assert p["cap_binds"] == (p["n_for_80_power"] > run.MAX_SEEDS)
  assert math.isclose(p["power_at_n"], stats.paired_power(sd, run.TARGET, p["n"]))


@pytest.mark.parametrize("smoke", [False, True])
def test_configs_are_valid(run, smoke, tmp_path):
  """Every config the experiment trains with passes jaxpt's own checks (nothing is built or compiled)."""
  common = dict(smoke=smoke, sft_dir="", pairs=str(tmp_path))  # init_from "": its checkpoint is not checked here
  from_section(SFTRunConfig, run.sft_config(smoke), "config")
  for method in run.METHODS:
    for hp in run.GRID[method]:
      config = run.rm_config(dict(common, method=method, seed=1, hp=hp))
      checked = from_section(RMRunConfig, config, "config")
      assert checked.rm.loss == method and checked.model == from_section(SFTRunConfig, run.sft_config(smoke),
                                                                         "config").model
  run_ = dict(common, method="bt", seed=3, rm_dir="/tmp/rm")
  rl = from_section(GRPORunConfig, run.rl_config(run_, "grpo"), "config")
  assert rl.reward.model == "/tmp/rm" and rl.seed == 3 and rl.eval_every == rl.steps
  assert smoke or rl.grpo.group_size == run.GROUP
  config = run.rl_config(run_, "ppo")
  assert config.ppo.critic_init == "/tmp/rm"  # the RM starts the critic (its checkpoint is not checked here)
  config.ppo.critic_init = ""
  ppo = from_section(PPORunConfig, config, "config")
  assert ppo.reward.model == "/tmp/rm" and ppo.seed == 3 and ppo.eval_every == ppo.steps
  assert ppo.ppo.group_size == 1 and ppo.reward.verifier_weight == 0.0 and ppo.steps == rl.steps
  assert ppo.rollout_rows == rl.data.prompts_per_step * rl.grpo.group_size  # as many rollouts a step as GRPO
  assert smoke or ppo.optim.learning_rate == rl.optim.learning_rate
  # the RM holds prompt + response: the longest training pair and the policy's rollouts
  rm = from_section(RMRunConfig, run.rm_config(dict(common, method="bt", seed=1, hp={})), "config")
  for config in (rl, ppo):
    assert config.data.max_prompt_len + config.sampling.max_new_tokens + 1 <= rm.model.max_seq_len


def test_committed_pilot_fixes_n(run):
  """The committed pilot.json states N and how it was computed (issue 31: seeds fixed in advance)."""
  path = os.path.join(os.path.dirname(SCRIPT), "pilot.json")
  if not os.path.exists(path):
    pytest.skip("no committed pilot yet")
  with open(path) as f:
    p = json.load(f)["power"]
  assert p["n"] >= run.MIN_SEEDS and p["n"] == min(max(p["n_for_80_power"] or math.inf, run.MIN_SEEDS),
                                                   run.MAX_SEEDS)


@pytest.mark.slow
def test_smoke_pipeline(run, tmp_path):
  """The whole pipeline at toy size (SFT, RM tuning, pilot, main, report): minutes on 2 shared cores."""
  run.main(["--smoke", "--methods", "bt,dir", "--jobs", "1", "--workdir", str(tmp_path / "w"),
            "--out", str(tmp_path / "out")])
  with open(tmp_path / "out" / "results.json") as f:
    payload = json.load(f)
  assert payload["design"]["reported_seeds"] == [0, 1]
  assert {(c["rl"], c["metric"]) for c in payload["comparisons"]} == {(a, m) for a in run.RL_ARMS for m in run.OUTCOMES}
  assert os.path.exists(tmp_path / "out" / "reward_hacking.png")
  assert all(os.path.exists(tmp_path / "out" / "runs" / "final" / "dir" / "seed1" / f"{arm}_metrics.jsonl")
             for arm in ("rm",) + run.RL_ARMS)


def test_report(run):
  """table + comparisons + markdown of made-up finished runs: every row and comparison is printed."""
  finished = []
  for seed in range(3):
    for i, method in enumerate(run.METHODS):
      for arm in run.RL_ARMS:
        value = 0.5 + 0.1 * i + 0.01 * seed
        finished.append(dict(method=method, seed=seed, rl=arm, gold_final=value, gold_last=value, onset_or_T=20 - i,
                             length_drift=2.0 * i, gold_first=0.5, length_first=20.0, length_last=20.0 + 2 * i,
                             rm_first=0.1, rm_last=0.5, hacking=dict(hacks=i == 0 and arm == "ppo"),
                             rm=dict(validation_balanced_accuracy=0.5 + 0.1 * i, validation_accuracy=0.6)))
  rows, comps = run.table(finished, run.METHODS), run.comparisons(finished, run.METHODS)
  assert [(r["rl"], r["hacked"]) for r in rows] == [("grpo", 0)] * 3 + [("ppo", 3), ("ppo", 0), ("ppo", 0)]
  payload = dict(provenance="p", power=run.power(finished, run.METHODS), chosen={m: {} for m in run.METHODS},
                 tuning=[dict(method=m, hp={}, validation_balanced_accuracy=0.5, validation_accuracy=0.5)
                         for m in run.METHODS], final=rows, comparisons=comps, partial="")
  text = run.markdown(payload)
  assert text.count("| gold_final |") == 4 and text.count("| PPO | gold_final |") == 2 and "3/3" in text
  assert "Holm" in text


def test_runs_are_kept_as_they_finish_and_a_fresh_workdir_goes_on_from_them(run, tmp_path, monkeypatch):
  """The pilot stage with each run's training replaced by a record (and its RL metrics, and the SFT's files): every RM
  tuning and seed run lands in --keep-runs, and the SFT with its last checkpoint only; a fresh workdir imports them
  all and trains nothing; kept runs of another SFT (another fingerprint: one trained again) are refused."""
  from experiments.toolkit import runner
  from tests.runs import recording_grid

  trained, sft_print = [], {"value": "aaaa"}

  def summarise(row):
    if row["name"] == "sft":
      folder = runner.run_dir(str(workdir["path"]), row)
      for name in ("config.json", "config_history.jsonl", "metrics.jsonl", "tokenizer/vocab", "checkpoints/100/state",
                   "checkpoints/300/state", "tb/events"):
        os.makedirs(os.path.dirname(os.path.join(folder, name)), exist_ok=True)
        with open(os.path.join(folder, name), "w") as f:
          f.write(name)
      return dict(last={}, fingerprint=sft_print["value"])
    rm = dict(validation_accuracy=0.6, validation_balanced_accuracy=0.55 + 0.01 * len(trained), train_accuracy=0.7)
    if row["name"].startswith("tune/"):
      return rm
    for arm in run.RL_ARMS:  # the metrics `recomputed` reads
      folder = os.path.join(runner.run_dir(str(workdir["path"]), row), arm)
      os.makedirs(folder)
      with open(os.path.join(folder, "metrics.jsonl"), "w") as f:
        for step in range(1, 7):
          f.write(json.dumps(dict(step=step, gold_score=0.5, rm_score=0.1 * step, response_length=20.0)) + "\n")
      with open(os.path.join(folder, "done.json"), "w") as f:
        json.dump(dict(evals={"eval_accuracy_test": 0.5 + 0.01 * row["seed"]}), f)
    return dict(rm=rm, arms={arm: dict(evals={"eval_accuracy_test": 0.5}) for arm in run.RL_ARMS})

  monkeypatch.setattr(runner, "run_grid", recording_grid(runner, summarise, trained))
  monkeypatch.setattr(run, "PAIRS", dict(train=64, validation=16, test=16))
  kept = tmp_path / "kept"
  workdir = {"path": tmp_path / "w"}

  def main(folder):
    workdir["path"] = tmp_path / folder
    run.main(["--stage", "pilot", "--methods", "bt,dir", "--workdir", str(workdir["path"]), "--keep-runs", str(kept),
              "--pilot", str(tmp_path / "pilot.json"), "--out", str(tmp_path / f"{folder}_out")])

  main("w")
  runs = 1 + 1 + len(run.GRID["dir"]) + 2 * len(run.PILOT_SEEDS)  # SFT, BT and DIR's grid, 2 methods x seeds
  assert len(trained) == runs
  assert sorted(os.listdir(kept / "runs")) == ["pilot", "tune"]
  assert sorted(os.listdir(kept / "runs" / "pilot" / "dir" / f"seed{run.PILOT_SEEDS[0]}")) == sorted(
      ["done.json"] + list(run.RL_ARMS))
  kept_sft = sorted(os.path.relpath(os.path.join(d, f), kept / "sft") for d, _, files in os.walk(kept / "sft")
                    for f in files)
  assert kept_sft == ["checkpoints/300/state", "config.json", "config_history.jsonl", "done.json", "metrics.jsonl",
                      "tokenizer/vocab"]
  main("fresh")
  assert trained[runs:] == []  # the SFT and every other run imported
  assert (tmp_path / "fresh" / "sft" / "checkpoints" / "300" / "state").read_text() == "checkpoints/300/state"
  with open(tmp_path / "pilot.json") as f:
    assert len(json.load(f)["runs"]) == 2 * len(run.PILOT_SEEDS) * len(run.RL_ARMS)
  shutil.rmtree(kept / "sft")  # runs kept before their SFT was: it is trained again, here to another fingerprint
  sft_print["value"] = "bbbb"
  with pytest.raises(SystemExit, match="sft_fingerprint"):
    main("other_cpu")
  assert trained[runs:] == ["sft"]


def test_policy_drift_reads_the_committed_runs_and_its_file_is_what_it_computes():
  """`policy_drift.py`: Spearman's rho as scipy's (ties included), kl_last the mean of a run's last W logged kl_ref,
  and the committed results/policy_drift.json equal to what it computes from the committed results."""
  from scipy import stats as scipy_stats

  from experiments.rlhf_reward_hacking import policy_drift

  x, y = [0.3, 0.1, 0.1, 0.7, 0.5, 0.2], [1.0, 3.0, 2.0, 0.0, 0.5, 0.5]
  assert policy_drift.spearman(x, y) == pytest.approx(scipy_stats.spearmanr(x, y).statistic, abs=1e-12)
  result = policy_drift.compute()
  first = result["runs"][0]
  with open(os.path.join(policy_drift.RESULTS, "runs", first["name"], f"{first['rl']}_metrics.jsonl")) as f:
    logged = [json.loads(line)["kl_ref"] for line in f if "kl_ref" in line]
  assert first["kl_last"] == pytest.approx(np.mean(logged[-policy_drift.run.W:]), abs=1e-6)
  assert len(result["runs"]) == 2 * 3 * 8  # GRPO and PPO x three RMs x N = 8 seeds
  with open(os.path.join(policy_drift.RESULTS, "policy_drift.json")) as f:
    assert json.load(f) == json.loads(json.dumps(result))
