"""experiments/toolkit: --set overrides, the results folder guard, paired statistics against their formulas, and the
probes (gradient reaching each block, residual-stream norms) against independent computations."""

import dataclasses
import itertools
import json
import math
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from experiments.configs import tiny
from experiments.toolkit import flags, probes, results, stats
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import TransformerLM, init_params
from jaxpt.trainers.lm import make_lm_loss_fn
from tests import reference_model

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ------------------------------------------------------------------------------------------------------ flags


def test_set_overrides_nested_fields_and_reads_literals():
  config = tiny.get_config()
  flags.apply_sets(config, ["optim.learning_rate=1", "steps=7", "model.norm_scheme=siamese_post_pre",
                            "data.path=a=b"])
  assert config.optim.learning_rate == 1.0 and isinstance(config.optim.learning_rate, float)
  assert config.steps == 7 and config.model.norm_scheme == "siamese_post_pre" and config.data.path == "a=b"


@pytest.mark.parametrize("item, message", [
    ("optim.lr=1", "config.optim has no field 'lr'"),
    ("nosuch.x=1", "config has no field 'nosuch'"),
    ("steps", "expected KEY=VALUE"),
    ("steps=abc", "--set steps='abc'"),
])
def test_bad_set_is_one_line_naming_the_key(item, message):
  with pytest.raises(flags.OverrideError, match=message.replace("(", r"\(").replace("[", r"\[")) as e:
    flags.apply_sets(tiny.get_config(), [item])
  assert "\n" not in str(e.value)


def test_split_list_names_the_flag():
  assert flags.split_list("3,1", int) == [3, 1]
  with pytest.raises(flags.OverrideError, match="--methods: unknown postt"):
    flags.split_list("pre,postt", allowed=("pre", "post"), flag="--methods")


def test_out_refuses_a_non_empty_folder_unless_overwrite(tmp_path):
  committed = tmp_path / "results"
  committed.mkdir()
  (committed / "results.json").write_text("{}")
  with pytest.raises(results.OutError, match="not empty"):
    results.prepare_out(str(committed), str(tmp_path), overwrite=False)
  assert results.prepare_out(str(committed), str(tmp_path), overwrite=True) == str(committed)
  assert results.prepare_out(None, str(tmp_path / "work"), overwrite=False) == str(tmp_path / "work" / "results")


def test_write_json_records_environment_and_writes_nan_as_null(tmp_path):
  path = os.path.join(tmp_path, "r.json")
  results.write_json(path, dict(value=math.nan, nested=[1.0, math.inf]))
  text = open(path).read()
  assert "NaN" not in text and "Infinity" not in text
  import json
  payload = json.loads(text)
  assert payload["value"] is None and payload["nested"] == [1.0, None]
  assert payload["environment"]["packages"]["jax"] == jax.__version__ and payload["environment"]["git_head"]


# ------------------------------------------------------------------------------------------------------ stats


def test_summary_uses_the_sample_std():
  s = stats.summary([1.0, 2.0, 4.0])
  assert s["n"] == 3 and s["mean"] == pytest.approx(7 / 3)
  assert s["std"] == pytest.approx(math.sqrt(((1 - 7 / 3) ** 2 + (2 - 7 / 3) ** 2 + (4 - 7 / 3) ** 2) / 2))
  assert stats.fmt([1.0, 2.0, 4.0], 2) == "2.33 ± 1.53 (3)"
  assert stats.summary([5.0])["std"] == 0.0 and stats.fmt([]) == "—"


def plain_sign_flip_p(d):
  """Every sign pattern, written out."""
  observed = abs(sum(d)) / len(d)
  hits = [abs(sum(s * v for s, v in zip(signs, d))) / len(d) >= observed - 1e-12
          for signs in itertools.product((1, -1), repeat=len(d))]
  return sum(hits) / len(hits)


def test_paired_statistics_against_their_formulas():
  a = [5.1, 5.3, 4.9, 5.0, 5.2]
  b = [5.0, 5.35, 4.7, 4.8, 5.15]
  d = [x - y for x, y in zip(a, b)]
  s = stats.paired(a, b)
  mean = sum(d) / 5
  std = math.sqrt(sum((v - mean) ** 2 for v in d) / 4)
  t = mean / (std / math.sqrt(5))
  assert s["mean_diff"] == pytest.approx(mean) and s["std_diff"] == pytest.approx(std) and s["t"] == pytest.approx(t)
  from scipy import stats as scipy_stats
  assert s["p_t"] == pytest.approx(scipy_stats.ttest_rel(a, b).pvalue)
  assert s["p_sign_flip"] == pytest.approx(plain_sign_flip_p(d))
  assert s["min_p_sign_flip"] == pytest.approx(2 / 32) and (s["wins"], s["losses"]) == (1, 4)
  assert s["ci95"][0] <= mean <= s["ci95"][1]


def test_sign_flip_reaches_its_minimum_only_when_every_seed_agrees():
  s = stats.paired([1.0, 2.0, 3.0], [2.0, 3.5, 3.1])
  assert s["p_sign_flip"] == pytest.approx(0.25) == pytest.approx(s["min_p_sign_flip"])  # 3 seeds: never < 0.25
  assert stats.paired([1.0, 2.0, 3.0], [2.0, 1.0, 3.1])["p_sign_flip"] > 0.25
  constant = stats.paired([1.0, 1.0], [1.0, 1.0])
  assert constant["p_t"] == 1.0 and constant["p_sign_flip"] == 1.0
  with pytest.raises(ValueError, match="equal-length"):
    stats.paired([1.0], [1.0, 2.0])


# ----------------------------------------------------------------------------------------------------- probes


@pytest.fixture(scope="module", params=["pre", "siamese_post_pre"])
def model_and_batch(request):
  config = ModelConfig(vocab_size=32, d_model=16, num_layers=3, num_heads=2, num_kv_heads=2, mlp_dim=32,
                       norm_scheme=request.param)
  params = init_params(config, jax.random.key(1))
  rng = np.random.default_rng(0)
  weights = np.ones((2, 6), np.float32)
  weights[1, 4:] = 0.0
  batch = dict(inputs=rng.integers(1, 32, (2, 6)).astype(np.int32),
               targets=rng.integers(1, 32, (2, 6)).astype(np.int32), weights=weights)
  return config, params, batch


def test_block_gradient_norms_equal_the_scanned_models_gradient_sliced_by_layer(model_and_batch):
  config, params, batch = model_and_batch
  loss_fn = make_lm_loss_fn(TransformerLM(config), z_loss=0.0)
  grads = jax.jit(jax.grad(lambda p: loss_fn(p, batch, jax.random.key(0))[0]))(params)["decoder"]["layers"]
  expected = [math.sqrt(sum(float(np.sum(np.square(np.asarray(g)[l]))) for g in jax.tree.leaves(grads)))
              for l in range(config.num_layers)]
  np.testing.assert_allclose(probes.block_gradient_norms(config, params, batch), expected, rtol=1e-5)


def test_stream_norms_equal_the_float64_reference_streams(model_and_batch):
  config, params, batch = model_and_batch
  p = reference_model.as64(jax.tree.map(np.asarray, jax.device_get(
      {**params, "decoder": {f"layers_{l}": jax.tree.map(lambda x, l=l: x[l], params["decoder"]["layers"])
                             for l in range(config.num_layers)}})))
  x = p["embedding"][batch["inputs"]]
  streams = (x, x) if config.is_siamese else (x,)
  positions = np.broadcast_to(np.arange(6), (2, 6)).astype(np.float64)
  depth = [streams]
  for l in range(config.num_layers):
    streams = reference_model.block(p["decoder"][f"layers_{l}"], streams, l, positions, None, config)
    depth.append(streams)
  w = batch["weights"].astype(np.float64)
  expected = [[(np.linalg.norm(s, axis=-1) * w).sum() / w.sum() for s in d] for d in depth]
  np.testing.assert_allclose(probes.stream_norms(config, params, batch), expected, rtol=2e-5)


@pytest.fixture(scope="module", params=["pre", "siamese_post_pre"])
def vit_and_batch(request):
  from experiments.configs import vit_digits
  from jaxpt.config import from_section
  from jaxpt.models.vit import init_vit_params
  from jaxpt.trainers.vit import ViTRunConfig

  run = from_section(ViTRunConfig, vit_digits.get_config(), "config")
  config = dataclasses.replace(run.model, d_model=16, num_layers=3, num_heads=2, num_kv_heads=2, mlp_dim=32,
                               norm_scheme=request.param)
  params = init_vit_params(config, run.vit, jax.random.key(1))
  params = reference_model.randomise_norms(jax.device_get(params))
  rng = np.random.default_rng(0)
  batch = dict(images=rng.uniform(-1, 1, (3, 8, 8, 1)).astype(np.float32),
               labels=rng.integers(0, 10, 3).astype(np.int32), weights=np.array([1.0, 1.0, 0.0], np.float32))
  return config, run.vit, params, batch


def test_vit_block_gradient_norms_equal_the_loss_gradient_per_block(vit_and_batch):
  config, vit, params, batch = vit_and_batch
  from jaxpt.models.vit import ViT
  from jaxpt.trainers.vit import make_vit_loss_fn

  loss_fn = make_vit_loss_fn(ViT(config, vit), train=False)
  grads = jax.grad(lambda p: loss_fn(p, batch, jax.random.key(0))[0])(params)["encoder"]
  expected = [math.sqrt(sum(float(np.sum(np.square(np.asarray(g)))) for g in jax.tree.leaves(grads[f"layers_{l}"])))
              for l in range(config.num_layers)]
  np.testing.assert_allclose(probes.vit_block_gradient_norms(config, vit, params, batch), expected, rtol=1e-5)


def test_vit_stream_norms_equal_the_float64_reference_streams(vit_and_batch):
  from tests import reference_vit

  config, vit, params, batch = vit_and_batch
  p = reference_model.as64(jax.tree.map(np.asarray, params))
  x = reference_vit.embed(p, batch["images"].astype(np.float64), config, vit)
  streams = (x, x) if config.is_siamese else (x,)
  depth = [streams]
  for l in range(config.num_layers):
    streams = reference_model.block(p["encoder"][f"layers_{l}"], streams, l, None, None, config)
    depth.append(streams)
  w = batch["weights"].astype(np.float64)[:, None]
  expected = [[(np.linalg.norm(s, axis=-1) * w).sum() / (w.sum() * x.shape[1]) for s in d] for d in depth]
  np.testing.assert_allclose(probes.vit_stream_norms(config, vit, params, batch), expected, rtol=2e-5)


# ----------------------------------------------------------------------------------------------------- runner


def square_or_fail(run, directory):
  """A module-level train_one (the workers unpickle it): fails for x = 3."""
  if run["x"] == 3:
    raise ValueError("three")
  with open(os.path.join(directory, "trained"), "a") as f:
    f.write("once\n")
  return dict(square=run["x"] ** 2)


def test_grid_trains_each_run_once_and_keeps_going_past_a_failure(tmp_path, capsys):
  from experiments.toolkit import runner

  runs = [dict(name=f"x{x}", x=x, sets={"a": 1}) for x in (1, 2, 3)]
  first = runner.finished_or_trained(runs, square_or_fail, str(tmp_path), 1, False, {"sets": {"a": 1}})
  assert [s["square"] for s in first] == [1, 4] and "x3: FAILED: ValueError: three" in capsys.readouterr().out
  again = runner.finished_or_trained(runs[:2], square_or_fail, str(tmp_path), 1, False, {"sets": {"a": 1}})
  assert again == first and open(tmp_path / "x1" / "trained").read() == "once\n"  # not trained twice
  with pytest.raises(SystemExit, match="x1: trained with other overrides"):
    runner.finished_or_trained(runs[:1], square_or_fail, str(tmp_path), 1, True, {"sets": {"a": 2}})


def worker_xla_flags(run, directory):
  """A module-level train_one: the XLA_FLAGS its worker process started with."""
  return dict(flags=os.environ.get("XLA_FLAGS", ""))


def test_workers_are_single_threaded_only_when_runs_share_the_cores(tmp_path, monkeypatch):
  from experiments.toolkit import runner

  monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/nowhere")
  pair = runner.run_grid([dict(name="a"), dict(name="b")], worker_xla_flags, str(tmp_path), jobs=2)
  assert all(runner.SINGLE_THREADED_XLA in s["flags"] and "--xla_dump_to" in s["flags"] for s in pair)
  lone = runner.run_grid([dict(name="a"), dict(name="c")], worker_xla_flags, str(tmp_path), jobs=2)[1]
  assert lone["flags"] == "--xla_dump_to=/nowhere"  # one run left: one worker, XLA's own threads
  assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/nowhere"  # the grid's process keeps its flags


def test_report_only_reports_runs_whose_config_digest_alone_changed(tmp_path, capsys):
  from experiments.toolkit import runner

  directory = tmp_path / "x1"
  directory.mkdir()
  (directory / runner.DONE_FILE).write_text('{"name": "x1", "sets": {}, "config_digest": "old", "square": 1}')
  same = {"sets": {}, "config_digest": "new"}
  assert [s["square"] for s in runner.finished_or_trained([dict(name="x1")], square_or_fail, str(tmp_path), 1, True,
                                                          same)] == [1]
  assert "config_digest old (the current code's: new)" in capsys.readouterr().out
  with pytest.raises(SystemExit, match="trained with other overrides"):  # training would mix configs
    runner.finished_or_trained([dict(name="x1")], square_or_fail, str(tmp_path), 1, False, same)
  with pytest.raises(SystemExit, match="trained with other overrides"):  # other --set values: never
    runner.finished_or_trained([dict(name="x1")], square_or_fail, str(tmp_path), 1, True,
                               {"sets": {"a": 1}, "config_digest": "new"})


def test_strict_refuses_finished_runs_and_pilot_rows_of_another_config_digest(tmp_path):
  """A stage that reads runs and then trains others (a main stage): a run of another digest stops it, even where
  `report_only` would only warn, before anything trains; the message names the run and both digests."""
  from experiments.toolkit import runner

  directory = tmp_path / "x1"
  directory.mkdir()
  (directory / runner.DONE_FILE).write_text('{"name": "x1", "sets": {}, "config_digest": "old", "square": 1}')
  same = {"sets": {}, "config_digest": "new"}
  for report_only in (True, False):
    with pytest.raises(SystemExit, match=r"^x1 \(.*\): trained with config_digest old, the current code's is new; "):
      runner.finished_or_trained([dict(name="x1"), dict(name="x2", x=2)], square_or_fail, str(tmp_path), 1,
                                 report_only, same, strict=True)
  assert not (tmp_path / "x2").exists()  # refused before training
  (directory / runner.DONE_FILE).write_text('{"name": "x1", "sets": {}, "config_digest": "new", "square": 1}')
  assert [s["square"] for s in runner.finished_or_trained([dict(name="x1")], square_or_fail, str(tmp_path), 1, True,
                                                          same, strict=True)] == [1]
  rows = [dict(name="tune/a", config_digest="new"), dict(name="pilot/b", config_digest="old")]
  with pytest.raises(SystemExit, match=r"^pilot/b \(p.json\): trained with config_digest old, the current code's is "
                                       "new"):
    runner.refuse_other_digests(rows, same, "p.json")
  with pytest.raises(SystemExit, match="config_digest None"):  # a row that does not record it cannot be checked
    runner.refuse_other_digests([dict(name="c")], same)
  runner.refuse_other_digests(rows[:1], same)


def test_doc_section_needs_its_markers():
  doc = "Intro.\n\nStages (x):\n  pilot: a\n  main: b\nEvery run: c"
  assert results.doc_section(doc, "Stages", "Every run") == "(x):\n  pilot: a\n  main: b"
  with pytest.raises(ValueError, match="'Steps' occurs 0 times"):
    results.doc_section(doc, "Steps", "Every run")
  with pytest.raises(ValueError, match="'pilot' occurs 2 times"):
    results.doc_section(doc + " pilot", "pilot", "main")
  with pytest.raises(ValueError, match="'--smoke' does not follow 'Stages'"):
    results.doc_section(doc, "Stages", "--smoke")
  with pytest.raises(ValueError, match="occurs 0 times"):
    results.doc_section(None, "Stages", "Every run")  # python -OO: no docstring


def test_report_only_results_file_keeps_the_config_that_trained_the_runs(tmp_path):
  path = str(tmp_path / "results.json")
  results.write_json(path, dict(config={"lr": 1}, table=[1]))
  results.write_json(path, dict(config={"lr": 1, "added_since": 0}, table=[2]), report_only=True)
  payload = json.load(open(path))
  assert payload["config"] == {"lr": 1} and payload["table"] == [2] and "kept from" in payload["config_source"]


def test_a_late_or_orphaned_worker_never_replaces_a_finished_run(tmp_path, monkeypatch):
  from experiments.toolkit import runner

  run = dict(name="x1", x=1)
  first = runner._train_and_record(square_or_fail, run, str(tmp_path))
  record = (tmp_path / "x1" / "done.json").read_text()
  assert runner._train_and_record(square_or_fail, run, str(tmp_path)) == first  # a second grid's queued copy
  assert (tmp_path / "x1" / "done.json").read_text() == record
  assert (tmp_path / "x1" / "trained").read_text() == "once\n"  # trained once, no temporary file left
  assert sorted(os.listdir(tmp_path / "x1")) == ["done.json", "trained"]
  monkeypatch.setattr(runner, "_GRID_PID", os.getppid() + 1)  # the grid that started this worker is gone
  with pytest.raises(runner.GridGone, match="x2: the grid process"):
    runner._train_and_record(square_or_fail, dict(name="x2", x=2), str(tmp_path))
  assert not (tmp_path / "x2").exists()


def note_pid_and_wait(run, directory):
  """A module-level train_one that never finishes: writes its worker's pid (to the workdir) and sleeps."""
  with open(os.path.join(os.path.dirname(directory), "worker.pid"), "w") as f:
    f.write(str(os.getpid()))
  time.sleep(300)


def test_a_worker_whose_grid_is_killed_stops_its_run_and_exits(tmp_path):
  """SIGKILL to the grid process mid-run: its worker (reparented) gets SIGTERM and is gone within seconds, not left
  waiting for work forever (an orphan of a killed grid once sat beside a timed test run)."""
  script = ("import sys; from experiments.toolkit import runner; from tests import test_experiments_toolkit as t; "
            "runner.run_grid([dict(name='x1', x=1)], t.note_pid_and_wait, sys.argv[1], jobs=1)")
  grid = subprocess.Popen([sys.executable, "-c", script, str(tmp_path)], cwd=ROOT, env=dict(
      os.environ, PYTHONPATH=ROOT), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  pid_file = tmp_path / "worker.pid"
  deadline = time.monotonic() + 120
  while not pid_file.exists() and time.monotonic() < deadline and grid.poll() is None:
    time.sleep(0.2)
  assert pid_file.exists(), "the worker never started the run"
  time.sleep(0.2)
  worker = int(pid_file.read_text())
  grid.kill()
  grid.wait()
  deadline = time.monotonic() + 30
  while _alive(worker) and time.monotonic() < deadline:
    time.sleep(0.2)
  outlived = _alive(worker)
  if outlived:
    os.kill(worker, signal.SIGKILL)
  assert not outlived, f"worker {worker} outlived its grid by 30 s"
  assert not (tmp_path / "x1" / "done.json").exists()


def _alive(pid):
  """True while `pid` runs (a zombie, exited but not reaped by init yet, counts as gone)."""
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(")")[-1].split()[0] != "Z"
  except FileNotFoundError:
    return False


def test_a_run_stays_locked_until_its_record_is_written_and_a_locked_run_is_not_trained(tmp_path, monkeypatch):
  from experiments.toolkit import runner

  lock = tmp_path / "x1" / ".lock"
  holders = []

  def environment_while_recording():  # called after train_one returned, before done.json is written
    holders.append(json.loads(lock.read_text())["pid"])
    return {}

  monkeypatch.setattr("experiments.toolkit.environment.environment", environment_while_recording)
  runner._train_and_record(square_or_fail, dict(name="x1", x=1), str(tmp_path))
  assert holders == [os.getpid()] and not lock.exists()
  other = subprocess.Popen(["sleep", "60"])  # another grid's live worker trains x2
  try:
    (tmp_path / "x2").mkdir()
    (tmp_path / "x2" / ".lock").write_text(json.dumps({"host": socket.gethostname(), "pid": other.pid}))
    with pytest.raises(runner.RunFailed, match=f"in use by pid {other.pid}"):
      runner._train_and_record(square_or_fail, dict(name="x2", x=2), str(tmp_path))
    assert os.listdir(tmp_path / "x2") == [".lock"]  # not trained, nothing recorded
  finally:
    other.kill()
    other.wait()


# ------------------------------------------------------------------------------------------- lm_comparison


def test_a_scheme_string_sets_streams_moe_and_depth():
  from experiments.toolkit import lm_comparison

  assert lm_comparison.parse_scheme("pre") == dict(norm_scheme="pre", moe=False)
  assert lm_comparison.parse_scheme("mhc_lite:4+moe@24") == dict(norm_scheme="mhc_lite", moe=True, hc_streams=4,
                                                                 num_layers=24)
  run = dict(config="experiments.siamese_vs_prenorm.config", sets={"model.mlp_dim": 64}, scheme="hc:2+moe@3",
             lr=0.02, seed=7, corpus="")
  config = lm_comparison.make_config(run)
  model = config.model
  assert (model.norm_scheme, model.hc_streams, model.num_layers) == ("hc", 2, 3)
  assert (model.num_experts, model.experts_per_token, model.mlp_dim) == (8, 2, 32)  # same active MLP width
  assert (config.optim.learning_rate, config.seed) == (0.02, 7)
  assert lm_comparison.make_config(dict(run, num_layers=12)).model.num_layers == 12  # a depth run's own depth
  with pytest.raises(ValueError, match="the only suffix is \\+moe"):
    lm_comparison.parse_scheme("pre+dense")


def test_config_digest_changes_with_any_value():
  config = tiny.get_config()
  assert flags.config_digest(config) == flags.config_digest(tiny.get_config())
  assert flags.config_digest(config) != flags.config_digest(flags.apply_sets(tiny.get_config(), ["steps=7"]))


# ----------------------------------------------------------------------------------------- image_comparison


def test_lr_selection_follows_the_metrics_direction_and_counts_a_diverged_run_as_worst():
  from experiments.toolkit import tuning

  runs = [dict(scheme="a", lr=lr, val=v) for lr, v in ((1e-3, 0.5), (1e-3, 0.7), (1e-2, 0.9), (1e-2, math.nan))]
  runs += [dict(scheme="b", lr=lr, val=v) for lr, v in ((1e-3, 0.2), (1e-3, 0.2), (1e-2, 0.4), (1e-2, 0.4))]
  best, table = tuning.select_lrs(runs, ("a", "b"), (1e-3, 1e-2), (100, 101), "val", "validation",
                                  higher_is_better=True)
  assert best == {"a": 1e-3, "b": 1e-2}  # a's 1e-2 has a diverged seed: -inf, whatever its other seed
  assert [r["at_grid_edge"] for r in table if r["chosen"]] == [True, True]
  best, _ = tuning.select_lrs(runs, ("a", "b"), (1e-3, 1e-2), (100, 101), "val")
  assert best == {"a": 1e-3, "b": 1e-3}  # lower is better: a's NaN seed is +inf


def test_image_comparison_pairs_by_seed_and_counts_wins_in_the_metrics_direction():
  from experiments.toolkit import image_comparison

  metric = image_comparison.Metric(key="top1", label="top-1", higher_is_better=True)
  top1 = {"a": [0.9, 0.8, 0.7], "b": [0.85, 0.82, 0.6]}
  runs = [dict(scheme=s, seed=i, lr=1e-3, params=1, diverged=False, test_top1=v, val_top1=v, test_loss=1.0)
          for s, values in top1.items() for i, v in enumerate(values)]
  rows, [c] = image_comparison.final_table(runs, ("a", "b"), (("a", "b"),), metric)
  assert [r["test"]["n"] for r in rows] == [3, 3]
  assert (c["a_better"], c["a_worse"], c["seeds"]) == (2, 1, [0, 1, 2])
  assert c["mean_diff"] == pytest.approx(np.mean([0.05, -0.02, 0.1]))
  runs[0]["diverged"] = True  # a's seed 0: left out of the pairs
  _, [c] = image_comparison.final_table(runs, ("a", "b"), (("a", "b"),), metric)
  assert c["seeds"] == [1, 2]


def test_image_comparison_config_sets_the_run_and_keeps_one_checkpoint():
  from experiments.toolkit import image_comparison

  run = dict(config="experiments.siamese_dit.config", sets={"steps": 40}, scheme="pre", lr=3e-4, seed=5,
             classifier="/tmp/vit")
  config = image_comparison.make_config(run)
  assert (config.model.norm_scheme, config.optim.learning_rate, config.seed, config.steps) == ("pre", 3e-4, 5, 40)
  assert (config.fid.classifier, config.eval_every, config.keep_checkpoints, config.progress) == ("/tmp/vit", 250, 1,
                                                                                                 False)


def test_image_comparison_trains_a_vit_run_and_reads_its_final_eval_and_probes(tmp_path):
  """One ViT run end to end through `train_one` (build, train, the last eval row, the probes at init and at the end),
  so that the toolkit follows the trainer API (it once called a method `BuiltRun` no longer has)."""
  from experiments.toolkit import image_comparison

  run = dict(kind="vit", config="experiments.siamese_vit.config", scheme="siamese_post_pre", lr=3e-3, seed=8,
             probe=True, sets={"steps": 4, "eval_every": 2, "model.num_layers": 2, "data.batch_size": 16})
  summary = image_comparison.train_one(run, str(tmp_path))
  assert summary["diverged"] is False and summary["step"] == 4
  assert 0.0 <= summary["test_top1"] <= 1.0 and 0.0 <= summary["val_top1"] <= 1.0
  assert np.isfinite(summary["test_loss"]) and summary["params"] > 0
  for when in ("init", "final"):
    assert len(summary[f"probe_{when}"]["block_grad_norms"]) == 2
