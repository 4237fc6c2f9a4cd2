"""`benchmarks/engine_rounds.py` at a tiny point: both systems draw the same rollouts, the stream takes fewer decode
steps than a call per round, and the report holds the figures its doc names."""

import pytest

from benchmarks import engine_rounds

TINY_POINT = ["--model", "tiny", "--prompts", "4", "--group", "4", "--min-prompt", "8", "--max-prompt", "16",
              "--median", "12", "--max-new", "48", "--slots", "8", "--page-size", "8", "--rounds", "1"]


@pytest.mark.slow  # the stream's fewer decode steps and equal rollouts are test_rl_engine's; this is the benchmark's
def test_the_stream_draws_the_calls_rollouts_in_fewer_decode_steps(capsys):
  report = engine_rounds.main(TINY_POINT)
  assert report["same_rollouts"]
  steps = report["decode_steps"]
  assert steps["stream"] < steps["calls"] and steps["stream_after_round0"] == steps["call_round0"]
  assert report["useful_fraction"]["stream"] > report["useful_fraction"]["calls"]
  assert set(report["seconds"]) == {"calls", "stream", "call_round0", "stream_round0"}
  assert report["speedup"] > 0 and report["round0_overhead"] > 0 and '"benchmark": "engine_rounds"' in (
      capsys.readouterr().out)
