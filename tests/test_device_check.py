"""`tools/device_check --dry-run`: the prepared accelerator check runs end to end at tiny sizes on CPU, so the
script that runs once on a borrowed GPU cannot rot between borrowings."""

import json
import subprocess
import tarfile
import time

import pytest

from tools import deadline, device_check, device_engine, device_traces, device_training


def _read(folder, name):
  """A section's JSON from `sections.tar` (the summary's, loose)."""
  if name == "summary":
    return json.loads((folder / "summary.json").read_text())
  with tarfile.open(folder / "sections.tar") as tar:
    return json.load(tar.extractfile(f"{name}.json"))


def _sections(folder):
  with tarfile.open(folder / "sections.tar") as tar:
    return sorted(tar.getnames())


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("device_check")
  return device_check.main(["--dry-run", "--out", str(out)]), out


def test_every_section_runs_and_writes_its_json(dry_run):
  code, out = dry_run
  summary = _read(out, "summary")
  assert code == 0, {name: s.get("error") for name, s in summary["sections"].items()}
  assert list(summary["sections"]) == list(device_check.SECTIONS)
  assert summary["environment"]["backend"] == "cpu" and summary["environment"]["versions"]["jax"]
  for name in device_check.SECTIONS:
    assert "error" not in _read(out, name), name


def test_sections_report_their_figures(dry_run):
  _, out = dry_run
  numerics = _read(out, "kernel_numerics")
  assert numerics["all_ok"] and len(numerics["results"]) == 2 * len(device_check.DRY.norm_dims)
  assert all(0 < r["max_rel_error"]["pallas"] < 1e-2 for r in numerics["results"] if r["dtype"] == "bfloat16")
  norm = _read(out, "two_stream_norm")
  assert not norm["timed"] and {r["d"] for r in norm["results"]} == set(device_check.DRY.norm_dims)
  assert norm["tokamax"] == "not a GPU"
  variants = _read(out, "train_step")["models"]["tiny"]["variants"]
  assert set(variants) == set(device_training.TRAIN_VARIANTS)
  assert all(v["tokens_per_sec"] > 0 for v in variants.values())
  # off cuDNN (here: CPU) `auto` attention is jaxpt's own: the one program, compiled once
  assert {v: e.get("same_program_as") for v, e in variants.items() if "same_program_as" in e} == {
      "pre_jaxpt_attention": "pre"}
  assert _read(out, "sampler")["jaxpt"]["new_tokens_per_sec"] > 0
  engine = _read(out, "engine")  # the engine at the realistic point's tiny twin, beside the static sampler
  assert engine["speedup"] > 0 and engine["engine"]["call_s"] > 0 and engine["point"]["rounds"] == 1
  assert 0 < engine["trace"]["device_busy_ms"] and engine["trace"]["device_ops_top30"]
  on_cpu = [name for name, *_, needs_kernel in device_engine.VARIANTS if not needs_kernel]
  assert on_cpu and engine["skipped"] == [name for name, *_ in device_engine.VARIANTS if name not in on_cpu]
  for name in on_cpu:
    assert engine[f"{name}_speedup"] > 0 and engine[name]["call_s"] > 0
  assert list(engine["stages_s"]) == [
      "compile engine", "compile static", "first engine call", "first static call", "round 1",
      *(stage for name in on_cpu for stage in (f"compile {name}", f"first {name} call", f"{name} round 1")), "trace"]
  grpo = _read(out, "grpo_step")
  assert grpo["bfloat16"]["step_s"] > 0 and grpo["float32"]["rollout_s"] > 0
  tuning = _read(out, "kernel_tuning")["results"][0]
  assert tuning["tilings"] and all(t["max_abs_diff_vs_default"] == 0.0 for t in tuning["tilings"])


def test_traces_come_back_as_one_file(dry_run):
  _, out = dry_run
  with tarfile.open(out / "traces.tar") as tar:
    assert sorted(tar.getnames()) == ["engine_trace.json.gz", "kernel_trace.json.gz", "train_pre_trace.json.gz",
                                      "train_siamese_post_pre_trace.json.gz"]
  assert sorted(f.name for f in out.iterdir()) == ["sections.tar", "summary.json", "traces.tar"]  # the device
  assert _sections(out) == sorted(f"{name}.json" for name in device_check.SECTIONS)  # returns at most 8 files
  traces = _read(out, "train_step")["models"]["tiny"]["traces"]
  assert set(traces) == {"pre", "siamese_post_pre"}
  assert all(t["device_ops_top30"] and all(op["calls"] > 0 for op in t["device_ops_top30"].values())
             for t in traces.values())


def test_a_spent_budget_skips_every_measurement(tmp_path):
  assert device_check.main(["--dry-run", "--budget-s", "0", "--out", str(tmp_path),
                            "--sections", "kernel_numerics,two_stream_norm,train_step,engine,sampler"]) == 0
  assert len(_read(tmp_path, "kernel_numerics")["skipped"]) == 2 * len(device_check.DRY.norm_dims)
  assert _read(tmp_path, "train_step")["skipped"] == [f"tiny {v}" for v in device_training.TRAIN_VARIANTS]
  assert _read(tmp_path, "sampler")["skipped"] == ["the fixed-length sampler vs HF generate"]
  assert _read(tmp_path, "engine")["skipped"] == ["all"]


def test_a_budget_spent_by_the_compiles_still_times_one_round_of_the_engine(tmp_path, monkeypatch):
  """The fourth H200 run's engine compiled for 237 s, past its budget, and timed nothing: the first round runs
  whatever the budget; the trace and the variants, which need compiles of their own, do not start."""
  spent_after_start = iter([False])
  monkeypatch.setattr(device_check.Budget, "spent", lambda self: next(spent_after_start, True))
  assert device_check.main(["--dry-run", "--out", str(tmp_path), "--sections", "engine"]) == 0
  engine = _read(tmp_path, "engine")
  assert engine["point"]["rounds"] == 1 and engine["engine"]["call_s"] > 0 and engine["speedup"] > 0
  assert engine["skipped"] == [name for name, *_ in device_engine.VARIANTS] and "trace" not in engine


def test_the_engine_report_is_on_disk_before_its_trace_starts(tmp_path, monkeypatch):
  """In the fifth H200 run the profiler never returned from one engine call and the hard stop lost the section's
  timed figures: they are written before the trace."""
  seen = {}

  def trace_reading_the_report(run, trace_dir, call_s):
    seen.update(json.loads((tmp_path / "engine.json").read_text()))
    return {}

  monkeypatch.setattr(device_engine, "engine_trace", trace_reading_the_report)
  assert device_check.main(["--dry-run", "--out", str(tmp_path), "--sections", "engine"]) == 0
  assert seen["partial"] == "written before the trace" and seen["speedup"] > 0 and seen["whole_tables"]["call_s"] > 0
  assert "partial" not in _read(tmp_path, "engine")


def test_an_unknown_section_is_refused_naming_it(capsys):
  with pytest.raises(SystemExit):
    device_check.main(["--dry-run", "--sections", "train_step,warp_drive"])
  assert "--sections: unknown warp_drive" in capsys.readouterr().err


def test_the_deadline_cuts_the_running_section_and_starts_no_other(tmp_path, monkeypatch):
  """--deadline-s 1: the train step is running then (held 2 s before it starts its work: with its compiles cached
  from the dry run above it can end within the second); the section is cut (its JSON says so) and the sampler never
  starts; the summary is written and the exit status is non-zero."""
  train_step = device_check.SECTIONS["train_step"]
  monkeypatch.setitem(device_check.SECTIONS, "train_step",
                      lambda sizes, budget: time.sleep(2) or train_step(sizes, budget))
  assert device_check.main(["--dry-run", "--deadline-s", "1", "--grace-s", "600", "--out", str(tmp_path),
                            "--sections", "train_step,sampler"]) == 1
  sections = _read(tmp_path, "summary")["sections"]
  assert {n: s["status"] for n, s in sections.items()} == {"train_step": "cut", "sampler": "not started"}
  assert _read(tmp_path, "train_step")["error"] == "cut at --deadline-s"
  assert _sections(tmp_path) == ["train_step.json"]


def test_a_main_thread_stuck_past_the_grace_is_stopped_hard():
  """The hard stop is the timer thread's alone (the main thread, stuck in a call into XLA, never handles the
  deadline): it writes what is known, kills the children and exits with status 2 (here recorded instead; the timer
  is set to fire at 0.2 s while the deadline's own signal, at 60 s, never comes)."""
  events = []
  child = subprocess.Popen(["sleep", "60"])
  try:
    assert child.pid in deadline.child_pids()
    with deadline.Deadline(60, -59.8, lambda: events.append("summary"), kill=lambda: events.append("kill"),
                           exit=events.append):
      time.sleep(1.0)
    assert events == ["summary", "kill", deadline.HARD_STOP_STATUS]
  finally:
    child.kill()
    child.wait()


def test_the_overlap_of_matmuls_with_other_threads_ops(tmp_path):
  """`overlapped_fraction` (tools/step_profile.py's matmul figure) on a hand-made CPU trace: a 10 us matmul on
  thread 1 beside ops on thread 2 covering [2, 4) and [3, 6) us (their union: 4 us), another matmul alone, and an op
  on its own thread that does not count."""
  import gzip

  def op(name, tid, ts, dur):
    return {"ph": "X", "name": name, "tid": tid, "ts": ts, "dur": dur, "args": {"hlo_op": name}}

  events = [op("ynn_fusion.1", 1, 0, 10), op("add_fusion", 2, 2, 2), op("copy", 2, 3, 3),
            op("ynn_fusion.2", 1, 20, 10), op("add_fusion.1", 1, 30, 5), {"ph": "M", "name": "thread_name"}]
  path = tmp_path / "t.trace.json.gz"
  with gzip.open(path, "wt") as f:
    json.dump({"traceEvents": events}, f)
  assert device_traces.overlapped_fraction(str(path), "ynn_fusion") == {"ms": 0.02, "overlapped_fraction": 0.2}
  assert device_traces.overlapped_fraction(str(path), "none") == {"ms": 0.0, "overlapped_fraction": 0.0}
