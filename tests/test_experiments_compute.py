"""experiments/compute.py: the committed compute.json is what the committed per-run files give, and a reused run
(a done.json byte for byte another experiment's) is counted once, where it was trained (issue 31 item 5)."""

import hashlib
import json
import os

from experiments import compute


def test_the_committed_compute_json_and_table_are_the_per_run_files_sum():
  result = compute.compute()
  with open(compute.OUT) as f:
    assert json.load(f) == result
  with open(os.path.join(compute.HERE, "README.md")) as f:
    assert compute.table(result) in f.read()
  timed = {}
  for experiment in compute.ORDER:
    for path in compute.run_files(experiment):
      assert compute.IN_PROGRESS not in path
      with open(path, "rb") as f:
        raw = f.read()
      timed.setdefault(hashlib.sha256(raw).hexdigest(), json.loads(raw).get("wall_s") is not None)
  assert result["total"]["runs"] == sum(timed.values())  # every distinct timed run file once


def test_a_reused_run_counts_once_under_the_experiment_that_trained_it(tmp_path, monkeypatch):
  def run(experiment, name, wall, phase="final"):
    directory = tmp_path / experiment / "results" / "runs" / name
    directory.mkdir(parents=True)
    (directory / "done.json").write_text(json.dumps(dict(name=name, phase=phase, wall_s=wall)))

  run("first", "tune/pre", 30.0, "tune")
  run("first", "final/pre", 10.0)
  run("second", "final/pre", 10.0)  # the same file: reused
  run("second", "final/hc", 20.5)
  run("second", "kept_runs/final/mhc", 99.0)  # still running: not counted
  run("second", "v1/sft", None, "sft")  # recorded without a time
  monkeypatch.setattr(compute, "HERE", str(tmp_path))
  seen = {}
  first, second = (compute.experiment_row(e, seen) for e in ("first", "second"))
  assert (first["runs"], first["wall_s"], first["by_phase"]) == (2, 40, {"final": dict(runs=1, wall_s=10),
                                                                         "tune": dict(runs=1, wall_s=30)})
  assert (second["runs"], second["wall_s"], second["reused"], second["untimed"]) == (1, 20, {"first": 1}, 1)
  assert os.path.basename(compute.OUT) == "compute.json"
