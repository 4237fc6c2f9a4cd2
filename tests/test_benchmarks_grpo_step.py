"""`benchmarks/grpo_step.py --point realistic` at a tiny point: the static sampler and the engine each give a whole
step split into rollout / scoring / update, on the same forced lengths."""

import json

import pytest

from benchmarks import grpo_step

TINY_POINT = ["--point", "realistic", "--model", "tiny", "--prompts", "2", "--group", "2", "--min-prompt", "8",
              "--max-prompt", "48", "--median", "6", "--max-new", "16", "--slots", "2", "--page-size", "8",
              "--minibatches", "1", "--rounds", "1"]


@pytest.mark.slow  # ~23 s (two trainers built and stepped); the benchmark's fixed point runs in the default suite
# through tools/device_check's dry run (tests/test_device_check.py)
def test_the_realistic_step_splits_both_systems_steps_on_the_same_lengths(capsys):
  grpo_step.main(TINY_POINT)
  report = json.loads(capsys.readouterr().out)
  assert report["point"] == "realistic" and report["config"]["rollout_tokens"] > 0
  for name in ("static", "engine"):
    entry = report[name]
    assert entry["step_s"] > 0 and entry["rollout_s"] > 0 and entry["update_s"] > 0
    assert abs(sum(entry["share"].values()) - 1) < 0.01
    assert [r["step"] for r in entry["rounds_s"]] == [entry["step_s"]]  # every round's seconds (here one round)
  # both ended every row at its forced length: the same mean response length
  assert report["static"]["response_length"] == report["engine"]["response_length"]
  assert report["engine"]["step_speedup_vs_static"] > 0
