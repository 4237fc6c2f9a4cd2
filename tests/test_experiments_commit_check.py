"""experiments/residual_schemes_lm/commit_check.py: which commits it compares for each scheme (read from the
committed runs), and that its comparison is bit for bit (issue 31 item 5)."""

import math

from experiments.residual_schemes_lm import commit_check


def test_every_scheme_is_checked_at_each_commit_that_trained_it_and_at_the_reference():
  plan = commit_check.commits_by_scheme()
  assert set(plan) == {"pre", "post", "hybrid", "siamese_post_pre", "siamese_hybrid_pre", "hc:2", "hc:4",
                       "mhc_lite:2", "mhc_lite:4", "pre+moe", "siamese_post_pre+moe"}
  assert all(commits[-1] == commit_check.REFERENCE and commits.count(commit_check.REFERENCE) == 1
             for commits in plan.values())
  assert plan["pre"] == ["679dbd2", "8beaf73", commit_check.REFERENCE]  # the single-stream finals' commit
  assert {commit_check.HARNESS.get(c, "lm_comparison") for c in plan["pre"]} == {"siamese_vs_prenorm",
                                                                                   "lm_comparison"}


def test_runs_are_compared_bit_for_bit():
  run = dict(train_loss=[5.5, 4.25], eval_loss=[4.0, math.nan], test_loss=3.75)
  assert commit_check.first_difference(run, dict(run)) is None  # NaN at the same place counts as equal
  nudged = dict(run, train_loss=[5.5, math.nextafter(4.25, 5.0)])
  assert commit_check.first_difference(nudged, run) == f"train_loss[1]: {math.nextafter(4.25, 5.0)!r} against 4.25"
  assert commit_check.first_difference(dict(run, eval_loss=[4.0]), run) == "eval_loss: 1 values against 2"
  assert commit_check.first_difference(dict(run, test_loss=3.5), run) == "test_loss[0]: 3.5 against 3.75"


def test_each_check_run_is_tied_to_the_committed_final_run_of_its_scheme():
  lr, row = commit_check.committed_final_run("pre")
  assert lr == 0.01 and set(row) == set(commit_check.ROW_KEYS)
  assert row["loss"] == 6.707103443145752  # final/pre/lr0.01/seed0's step-10 row, as committed
  assert commit_check.committed_final_run("post")[0] == 0.001
