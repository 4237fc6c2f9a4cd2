"""DAPO's host pieces (jaxpt.rl.dapo) against plain NumPy statements: the soft overlong punishment (the paper's
piecewise formula in float64), truncation and overlong filtering, informative groups, dynamic sampling (drop,
refill, the cap), the refill prompt stream."""

import re

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxpt.config import ConfigError, from_section
from jaxpt.data import order
from jaxpt.rl import dapo


def paper_penalty(length: int, l_max: int, l_cache: int) -> float:
  """DAPO eq. 13, as written: 0 if |y| <= L_max - L_cache; ((L_max - L_cache) - |y|) / L_cache if
  L_max - L_cache < |y| <= L_max; -1 if L_max < |y|."""
  if length <= l_max - l_cache:
    return 0.0
  if length <= l_max:
    return float(np.float64(l_max - l_cache - length) / np.float64(l_cache))
  return -1.0


def test_overlong_penalty_at_the_boundary_lengths():
  l_max, l_cache = 40, 8
  lengths = np.array([0, 1, 31, 32, 33, 36, 39, 40, 41])
  want = [0, 0, 0, 0, -1 / 8, -4 / 8, -7 / 8, -1, -1]
  np.testing.assert_allclose(dapo.overlong_penalty(lengths, l_max, l_cache), want, rtol=1e-7, atol=0)
  np.testing.assert_allclose(dapo.overlong_penalty(lengths, l_max, l_cache, 0.5), np.multiply(want, 0.5), rtol=1e-7)
  assert dapo.overlong_penalty(lengths, l_max, 0).tolist() == [0.0] * len(lengths)  # buffer 0: off
  assert dapo.overlong_penalty(lengths, l_max, l_cache).dtype == np.float32
  np.testing.assert_allclose(dapo.overlong_penalty([1, 5], 5, 5), [-0.2, -1.0], rtol=1e-7)  # buffer = whole cap


def verl_penalty(length: int, max_resp_len: int, buffer_len: int, factor: float) -> float:
  """verl/workers/reward_manager/dapo.py:116-122 (no lower bound: lengths never exceed max_resp_len there)."""
  exceed_len = length - (max_resp_len - buffer_len)
  return min(-exceed_len / buffer_len * factor, 0)


@given(l_max=st.integers(1, 4096), data=st.data(), factor=st.floats(0.0, 4.0))
def test_overlong_penalty_matches_the_paper_and_verl(l_max, data, factor):
  l_cache = data.draw(st.integers(1, l_max))
  lengths = np.asarray(data.draw(st.lists(st.integers(0, l_max + 3), min_size=1, max_size=16)))
  got = dapo.overlong_penalty(lengths, l_max, l_cache, factor)
  want = np.asarray([factor * paper_penalty(n, l_max, l_cache) for n in lengths])
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  within = lengths <= l_max
  np.testing.assert_allclose(got[within], [verl_penalty(n, l_max, l_cache, factor) for n in lengths[within]],
                             rtol=1e-6, atol=1e-7)
  assert np.all(got <= 0) and np.all(got >= -factor * (1 + 1e-6))
  assert np.all(np.diff(dapo.overlong_penalty(np.arange(l_max + 2), l_max, l_cache, factor)) <= 0)  # monotone


def test_truncated_means_the_cap_reached_without_eos():
  eos = 3
  lengths = np.array([2, 5, 5, 5, 4])
  last = np.array([0, 7, 3, 0, 0])  # row 2 ends on EOS exactly at the cap: complete, not truncated
  assert dapo.truncated(lengths, last, 5, [eos]).tolist() == [False, True, False, True, False]
  assert dapo.truncated(lengths, last, 5, [eos, 7]).tolist() == [False, False, False, True, False]  # + end of turn
  assert dapo.truncated(lengths, last, 5, []).tolist() == [False, True, True, True, False]


def test_overlong_filtering_zeroes_exactly_the_truncated_rows():
  mask = np.array([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 1]], np.float32)
  got = dapo.filter_overlong(jnp.asarray(mask), np.array([False, True, False, True]))
  np.testing.assert_array_equal(got, [[1, 1, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0]])
  assert got.dtype == np.float32


def test_informative_groups():
  values = np.array([1, 1, 1, 0, 0, 0, 1, 0, 0, 0.5, 0.5, 0.5])
  assert dapo.informative_groups(values, 3).tolist() == [False, False, True, False]
  assert dapo.informative_groups(values, 1).tolist() == [True] * 12  # verl keeps single-rollout groups


@settings(max_examples=200)
@given(st.lists(st.floats(-10, 10), min_size=12, max_size=12), st.floats(0.0, 3.0), st.sampled_from([2, 3, 4, 6]))
def test_informative_groups_with_a_minimum_std_is_the_population_std_above_it(values, min_std, group_size):
  values = np.asarray(values, np.float32)
  std = np.array([np.std(values[i:i + group_size].astype(np.float64)) for i in range(0, 12, group_size)])
  want = std > min_std if min_std > 0 else np.array([len(set(values[i:i + group_size])) > 1
                                                      for i in range(0, 12, group_size)])
  np.testing.assert_array_equal(dapo.informative_groups(values, group_size, min_std), want)


G, B = 3, 4
KINDS = {"right": [1, 1, 1], "wrong": [0, 0, 0], "mixed": [1, 0, 0]}


def scripted_draws(rounds_of_kinds):
  """draw(r) for rounds of group kinds; each row carries (round, group, index) so the batch can be traced."""
  calls = []

  def draw(r):
    calls.append(r)
    kinds = rounds_of_kinds[r]
    scores = np.concatenate([KINDS[k] for k in kinds]).astype(np.float32)
    origin = np.asarray([(r, g, i) for g in range(len(kinds)) for i in range(G)])
    return {"scores": scores, "origin": origin, "hidden": jnp.asarray(origin, jnp.float32), "none": None}

  return draw, calls


def groups_of(batch):
  return [tuple(batch["origin"][k * G, :2]) for k in range(B)]


def check_rows_follow_groups(batch):
  for key in ("origin", "hidden"):
    rows = np.asarray(batch[key]).reshape(B, G, 3)
    np.testing.assert_array_equal(rows[:, :, 2], np.tile(np.arange(G), (B, 1)))  # whole groups, in order
  np.testing.assert_array_equal(batch["hidden"], batch["origin"])
  assert batch["none"] is None
  np.testing.assert_array_equal(batch["group_ids"], np.repeat(np.arange(B), G))


def test_dynamic_sampling_drops_all_right_and_all_wrong_groups_and_refills():
  rounds = [["right", "mixed", "wrong", "mixed"], ["wrong", "wrong", "right", "right"], ["mixed", "right", "mixed",
                                                                                         "mixed"]]
  draw, calls = scripted_draws(rounds)
  batch, metrics = dapo.dynamic_sampling(draw, B, G, max_rounds=5, at_cap="fill", metric_key="scores")
  assert calls == [0, 1, 2]  # round 1 held nothing informative; round 2 completed the batch
  assert groups_of(batch) == [(0, 1), (0, 3), (2, 0), (2, 2)]  # the first B informative groups, draw order
  assert len(batch["scores"]) == B * G
  assert all(len(set(batch["scores"][k * G:(k + 1) * G])) > 1 for k in range(B))
  assert metrics == {"dapo_rounds": 3, "dapo_groups_drawn": 12, "dapo_groups_informative": 5,
                     "dapo_groups_filled": 0}
  check_rows_follow_groups(batch)


def test_dynamic_sampling_needs_no_refill_when_the_first_round_is_informative():
  draw, calls = scripted_draws([["mixed"] * B])
  batch, metrics = dapo.dynamic_sampling(draw, B, G, 3, "error", "scores")
  assert calls == [0] and metrics["dapo_rounds"] == 1 and groups_of(batch) == [(0, g) for g in range(B)]


def test_at_the_cap_fill_tops_up_with_dropped_groups_in_draw_order_and_error_stops():
  rounds = [["right", "mixed", "wrong", "right"], ["wrong", "mixed", "right", "wrong"]]
  draw, calls = scripted_draws(rounds)
  batch, metrics = dapo.dynamic_sampling(draw, B, G, 2, "fill", "scores")
  assert calls == [0, 1]
  assert groups_of(batch) == [(0, 1), (1, 1), (0, 0), (0, 2)]  # 2 informative, then the first 2 dropped ones
  assert metrics == {"dapo_rounds": 2, "dapo_groups_drawn": 8, "dapo_groups_informative": 2,
                     "dapo_groups_filled": 2}
  check_rows_follow_groups(batch)
  draw, _ = scripted_draws(rounds)
  with pytest.raises(RuntimeError, match=re.escape("dynamic sampling: 2 rounds (config.dapo.max_rounds) gave 2 "
                                                   "informative groups of the 4 needed")):
    dapo.dynamic_sampling(draw, B, G, 2, "error", "scores")


def test_refill_stream_is_a_function_of_seed_and_position_and_differs_from_the_training_order():
  main, refill = order.StepOrder(7, 50, 8), order.StepOrder(7, 50, 8, stream=1)
  again = order.StepOrder(7, 50, 8, stream=1)
  np.testing.assert_array_equal([refill.rows(i) for i in (5, 0, 9)], [again.rows(i) for i in (5, 0, 9)])
  assert not np.array_equal(main.permutation(0), refill.permutation(0))
  np.testing.assert_array_equal(main.permutation(3), np.random.default_rng([7, 3]).permutation(50))  # unchanged
  first_epoch = np.concatenate([refill.rows(i) for i in range(7)])[:50]
  np.testing.assert_array_equal(first_epoch, refill.permutation(0))  # each row once per epoch


@pytest.mark.parametrize("field, value, message", [
    ("max_rounds", 0, "config.dapo.max_rounds=0: must be >= 1"),
    ("at_cap", "skip", "config.dapo.at_cap='skip': must be one of fill, error"),
    ("filter_metric", "acc", "config.dapo.filter_metric='acc': must be one of score, reward"),
    ("overlong_buffer", -1, "config.dapo.overlong_buffer=-1: must be >= 0"),
    ("overlong_penalty_factor", -0.5, "config.dapo.overlong_penalty_factor=-0.5: must be in [0.0, inf]"),
    ("filter_min_std", -0.1, "config.dapo.filter_min_std=-0.1: must be in [0.0, inf]"),
])
def test_dapo_section_errors_name_the_field_in_one_line(field, value, message):
  with pytest.raises(ConfigError, match=re.escape(message)) as error:
    from_section(dapo.DAPOConfig, {field: value}, "config.dapo")
  assert "\n" not in str(error.value)
