"""experiments/compute.py: the committed compute.json is what the committed per-run files give, and a reused run
(a done.json byte for byte another experiment's) is counted once, where it was trained (issue 31 item 5)."""

import json
import os

from experiments import compute


def test_the_committed_compute_json_and_table_are_the_per_run_files_sum():
  result = compute.compute()
  with open(compute.OUT) as f:
    assert json.load(f) == result
  with open(os.path.join(compute.HERE, "README.md")) as f:
    assert compute.table(result) in f.read()
  assert result["total"]["runs"] == sum(len(compute.run_files(e)) for e in compute.ORDER) - sum(
      n for r in result["experiments"] for n in r.get("reused", {}).values())


def test_a_reused_run_counts_once_under_the_experiment_that_trained_it(tmp_path, monkeypatch):
  def run(experiment, name, wall, phase="final"):
    directory = tmp_path / experiment / "results" / "runs" / name
    directory.mkdir(parents=True)
    (directory / "done.json").write_text(json.dumps(dict(name=name, phase=phase, wall_s=wall)))

  run("first", "tune/pre", 30.0, "tune")
  run("first", "final/pre", 10.0)
  run("second", "final/pre", 10.0)  # the same file: reused
  run("second", "final/hc", 20.5)
  monkeypatch.setattr(compute, "HERE", str(tmp_path))
  seen = {}
  first, second = (compute.experiment_row(e, seen) for e in ("first", "second"))
  assert (first["runs"], first["wall_s"], first["by_phase"]) == (2, 40, {"final": dict(runs=1, wall_s=10),
                                                                         "tune": dict(runs=1, wall_s=30)})
  assert (second["runs"], second["wall_s"], second["reused"]) == (1, 20, {"first": 1})
  assert os.path.basename(compute.OUT) == "compute.json"
