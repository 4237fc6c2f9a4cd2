"""benchmarks/train_step.py's references, without timing anything: the peers are ready one at a time before jaxpt
compiles (and one that fails closes the others), every round runs each scheme and then each peer once, a ratio to a
reference is the median of per-round ratios, and `train_peers.py` speaks `sampler_peers.serve`'s protocol through
`benchmarks.common.Peer`; the peer scripts refuse what they do not run before importing their library."""

import json
import os
import subprocess
import sys
import textwrap
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from benchmarks import common, train_step

BENCHMARKS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")


@pytest.fixture
def step_clock(monkeypatch):
  """benchmarks.common's perf_counter replaced by a clock that only a fake step moves (`step_clock(seconds)`), so
  the timed ratios are exactly the fake steps' under any machine load."""
  now = [0.0]

  def advance(seconds):
    now[0] += seconds

  monkeypatch.setattr(common, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
  return advance


def test_alternating_seconds_calls_each_peer_once_a_round_after_the_runs():
  log = []
  runs = {"a": lambda: log.append("a"), "b": lambda: log.append("b")}
  peer_seconds = iter([5.0, 7.0])

  def peer(r):
    log.append(f"peer {r}")
    return next(peer_seconds)

  times = common.alternating_seconds(runs, repeats=2, peers={"p": peer})
  assert log == ["a", "b", "a", "b", "peer 1", "a", "b", "peer 2"]  # one warm-up round, without the peer
  assert times["p"] == [5.0, 7.0] and len(times["a"]) == len(times["b"]) == 2


def test_every_result_names_the_cpu_it_ran_on(tmp_path):
  cpuinfo = tmp_path / "cpuinfo"
  cpuinfo.write_text("processor\t: 0\ncpu family\t: 6\nmodel\t\t: 207\nmodel name\t: Intel(R) Xeon(R) Processor\n"
                     "stepping\t: 2\nflags\t\t: fpu avx2 avx512f amx_tile\n\nprocessor\t: 1\nflags\t: fpu\n")
  assert common.cpu_model(str(cpuinfo)) == {"cpu_model": "Intel(R) Xeon(R) Processor", "cpu_id": "6/207/2",
                                            "cpu_extensions": ["avx2", "avx512f", "amx_tile"]}
  assert common.cpu_model(str(tmp_path / "none")) == {}
  assert set(common.machine_info()) >= {"device", "jax", "cpu_count", "machine"}


def test_the_ratio_to_a_reference_pairs_seconds_round_by_round():
  # Per-round ratios 2, 0.5, 2 (median 2); the ratio of the medians would be 2 / 2 = 1.
  times = {"pre": [1.0, 2.0, 4.0], "hf": [2.0, 1.0, 8.0]}
  peer = types.SimpleNamespace(name="hf", params=7, setting="torch_threads=2")
  reference, vs_pre = train_step.reference_report(peer, times, "bfloat16")
  assert vs_pre == 2.0
  assert reference == {"train_tokens_per_sec": 1024.0, "step_ms": 2000.0, "dtype": "bfloat16", "params": 7,
                       "setting": "torch_threads=2"}
  tunix = types.SimpleNamespace(name="tunix", params=7, setting="")
  assert train_step.reference_report(tunix, {"tunix": [1.0]}, "bfloat16") == (
      {"train_tokens_per_sec": 2048.0, "step_ms": 1000.0, "dtype": "float32", "params": 7, "setting": ""}, None)


def test_main_starts_the_peers_before_compiling_and_reports_them(monkeypatch, capsys):
  log, dots_files = [], []

  class FakePeer:
    def __init__(self, name, argv, stderr=None):
      self.name, self.argv, self.params, self.setting = name, argv, 10, f"{name} setting"
      log.append(("start", name, tuple(argv[1:])))
      if name == "hf_dot_pass":
        with open(argv[-1]) as f:
          dots_files.append(json.load(f))

    def wait_ready(self):
      log.append(("ready", self.name))

    def seconds(self, seed):
      log.append(("run", self.name, seed))
      return 1.0

    def close(self):
      log.append(("close", self.name))

  def compile_scheme(scheme, **overrides):
    log.append(("compile", scheme, overrides["dtype"], overrides["param_dtype"]))
    facts = {"params": 100, "active_params": 100, "memory": {"peak_mib": 1.0}}

    def run():
      log.append(("step", scheme))
      time.sleep(0.002)  # a step_ms that rounds to more than 0

    return facts, run

  dots = common.traced_dots(lambda a, b: a @ b, jnp.ones((3, 4)), jnp.ones((4, 5)))

  def scheme_dots(scheme, **overrides):
    log.append(("dots of", scheme, overrides["dtype"]))
    return dots

  def dot_pass(traced):
    assert traced is dots
    return 2.0, lambda: log.append(("step", "pre_dot_pass"))

  monkeypatch.setattr(common, "Peer", FakePeer)
  monkeypatch.setattr(train_step, "compile_scheme", compile_scheme)
  monkeypatch.setattr(train_step, "scheme_dots", scheme_dots)
  monkeypatch.setattr(train_step, "dot_pass", dot_pass)
  monkeypatch.setattr(train_step, "matmul_gflops", lambda *args, **kwargs: 100.0)
  train_step.main(["--schemes", "pre,post", "--repeats", "2", "--dtype", "bfloat16", "--hf-python", "py-hf",
                   "--tunix-python", "py-tunix"])
  script = str(train_step.PEER_SCRIPT)
  # Pre-Norm's dots traced (not compiled) for the torch dot pass; each peer warms up (HF picks its torch threads)
  # alone, before jaxpt compiles anything
  dots_start = next(entry for entry in log if entry[:2] == ("start", "hf_dot_pass"))
  assert log[:9] == [("dots of", "pre", "bfloat16"),
                     ("start", "hf", (script, "hf", "512", "8", "bfloat16")), ("ready", "hf"),
                     ("start", "tunix", (script, "tunix", "512", "8", "float32")), ("ready", "tunix"),
                     dots_start, ("ready", "hf_dot_pass"),
                     ("compile", "pre", "bfloat16", "float32"), ("compile", "post", "bfloat16", "float32")]
  assert dots_start[2][:5] == (script, "hf_dot_pass", "512", "8", "bfloat16")
  timed = [entry for entry in log[9:] if entry[0] in ("step", "run")]
  round_ = [("step", "pre"), ("step", "post"), ("step", "pre_dot_pass")]
  peers = lambda r: [("run", "hf", r), ("run", "tunix", r), ("run", "hf_dot_pass", r)]  # noqa: E731
  assert timed[:15] == round_ + [*round_, *peers(1), *round_, *peers(2)]
  assert log[-3:] == [("close", "hf"), ("close", "tunix"), ("close", "hf_dot_pass")]
  assert dots_files == [common.dots_json(dots)] and not os.path.exists(dots_start[2][5])  # read, then removed
  report = json.loads(capsys.readouterr().out)
  assert report["config"]["dtype"] == "bfloat16" and report["config"]["param_dtype"] == "float32"
  for name, dtype in (("hf", "bfloat16"), ("tunix", "float32")):
    assert report[f"{name}_reference"]["dtype"] == dtype
    assert report[f"{name}_reference"]["setting"] == f"{name} setting"
    assert report[f"pre_tokens_per_sec_vs_{name}"] > 0
  assert {"schemes", "ratios_vs_pre", "matmul_gflops_per_sec", "hf_dot_pass"} <= set(report)
  assert "hf_dot_pass_reference" not in report and "pre_tokens_per_sec_vs_hf_dot_pass" not in report
  assert len(report["round_seconds"]["hf_dot_pass"]) == len(report["round_seconds"]["pre"]) == 2
  assert report["hf_dot_pass"]["setting"] == "hf_dot_pass setting"
  assert report["pre_dot_pass"]["gflop"] == 2.0 and report["pre_dot_pass"]["share_of_step"] > 0


def test_the_torch_dot_pass_says_what_the_step_would_be_with_torchs_matmuls():
  """Per round: HF's step over (Pre-Norm's step - XLA's dot pass + torch's dot pass), then the median."""
  times = {"pre": [1.0, 2.0, 1.0], "pre_dot_pass": [0.7, 1.4, 0.7], "hf_dot_pass": [0.5, 1.0, 0.6],
           "hf": [0.9, 2.0, 1.0]}
  report = train_step.hf_dot_pass_report(times, gflop=10.0, setting="torch")
  assert report["ms"] == 600.0 and report["gflops_per_sec"] == round(10.0 / 0.6, 1)
  assert report["speed_vs_pre_dot_pass"] == round(1.4, 3)  # median of 1.4, 1.4, 7/6
  assert report["pre_vs_hf_with_hf_dots"] == round(0.9 / 0.8, 3)  # median of 0.9/0.8, 2.0/1.6, 1.0/0.9


@pytest.mark.parametrize("dimension_numbers, shapes", [
    ((((1,), (0,)), ((), ())), ((3, 4), (4, 5))),  # x @ w
    ((((0,), (0,)), ((), ())), ((4, 3), (4, 5))),  # a weight gradient, x^T g
    ((((1,), (1,)), ((), ())), ((3, 4), (5, 4))),  # g w^T
    ((((3,), (3,)), ((0, 1), (0, 1))), ((2, 3, 4, 5), (2, 3, 6, 5))),  # attention scores, batch and heads
    ((((2,), (1,)), ((0,), (2,))), ((2, 3, 4), (5, 4, 2))),  # a batch axis last on the rhs
])
def test_einsum_spec_computes_what_dot_general_does(dimension_numbers, shapes):
  sys.path.insert(0, BENCHMARKS)
  from train_peers import einsum_spec

  rng = np.random.default_rng(0)
  lhs, rhs = (rng.normal(size=shape) for shape in shapes)
  expected = jax.lax.dot_general(jnp.asarray(lhs, jnp.float32), jnp.asarray(rhs, jnp.float32), dimension_numbers)
  spec = einsum_spec(lhs.ndim, rhs.ndim, dimension_numbers)
  np.testing.assert_allclose(np.einsum(spec, lhs, rhs), expected, rtol=1e-5, atol=1e-5)


def test_dots_json_carries_each_dots_shapes_and_dimension_numbers():
  lhs, rhs = jax.ShapeDtypeStruct((8, 4, 128, 64), jnp.float32), jax.ShapeDtypeStruct((8, 4, 256, 64), jnp.float32)
  params = {"dimension_numbers": (((3,), (3,)), ((0, 1), (0, 1))), "precision": None}
  assert json.loads(json.dumps(common.dots_json([(lhs, rhs, params)]))) == [
      [[8, 4, 128, 64], [8, 4, 256, 64], [[[3], [3]], [[0, 1], [0, 1]]], ["float32", "float32"]]]
  mixed = jax.ShapeDtypeStruct((2, 3), jnp.bfloat16), jax.ShapeDtypeStruct((3, 4), jnp.float32)
  assert common.dots_json([(*mixed, {"dimension_numbers": (((1,), (0,)), ((), ()))})])[0][3] == ["bfloat16",
                                                                                                  "float32"]


def test_a_peer_that_never_gets_ready_closes_the_ones_started_before_it(monkeypatch):
  started = []

  class Recorded(common.Peer):
    def __init__(self, name, argv, **kwargs):
      super().__init__(name, argv, **kwargs)
      started.append(self)

  monkeypatch.setattr(common, "Peer", Recorded)
  serving = f"import sys; sys.path.insert(0, {BENCHMARKS!r}); from sampler_peers import serve; serve(print, '1 ok')"
  with pytest.raises(RuntimeError, match=r"peer broken ended \(exit 3\)"):
    common.ready_peers({"good": [sys.executable, "-c", serving],
                        "broken": [sys.executable, "-c", "raise SystemExit(3)"]})
  assert [p.name for p in started] == ["good", "broken"] and started[0].proc.returncode == 0  # told to quit


def test_a_serving_peer_answers_each_run_with_its_seconds(tmp_path):
  calls = tmp_path / "calls"
  code = textwrap.dedent(f"""
      import sys
      sys.path.insert(0, {BENCHMARKS!r})
      from sampler_peers import serve
      def call(seed):
        with open({str(calls)!r}, "a") as f:
          f.write(f"{{seed}}\\n")
      serve(call, "42 torch_threads=1 (fp32)")
      """)
  peer = common.Peer("fake", [sys.executable, "-c", code], stderr=None)
  peer.wait_ready()
  assert (peer.params, peer.setting) == (42, "torch_threads=1 (fp32)")
  assert all(isinstance(peer.seconds(seed), float) for seed in (3, 5))
  peer.close()
  assert peer.proc.returncode == 0 and calls.read_text() == "3\n5\n"


@pytest.mark.parametrize("argv, message", [(["tunix", "512", "8", "bfloat16"], "runs float32, not 'bfloat16'"),
                                           (["hf", "512", "8", "float16"], "runs float32 | bfloat16"),
                                           (["jax", "512", "8"], "unknown peer 'jax'"),
                                           (["hf_dot_pass", "512", "8", "float32"], "needs DOTS_JSON")])
def test_train_peers_refuses_what_it_does_not_run(argv, message):
  result = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "train_peers.py"), *argv], capture_output=True,
                          text=True, timeout=60, check=False)
  assert result.returncode != 0 and message in result.stderr, result.stderr


@pytest.mark.parametrize("argv, message", [(["8", "64", "32", "256", "4", "4"], "expected ROWS PROMPT COMPLETION"),
                                           (["8", "64", "0", "256", "4", "4", "2"], "COMPLETION must be a positive"),
                                           (["8", "64", "32", "256", "4", "3", "1"], "divisible by HEADS")])
def test_tunix_ppo_update_refuses_sizes_it_cannot_build(argv, message):
  result = subprocess.run([sys.executable, os.path.join(BENCHMARKS, "tunix_ppo_update.py"), *argv],
                          capture_output=True, text=True, timeout=60, check=False)
  assert result.returncode != 0 and message in result.stderr, result.stderr


def test_lora_is_timed_in_the_same_rounds_as_its_full_fine_tune(monkeypatch, capsys, step_clock):
  """`--lora R`: each scheme compiled twice (rank 0 and R), both stepped in every round, and `lora_vs_full` the
  median of the per-round ratios."""
  log, seconds = [], {"pre": [0.04] * 3, "pre+lora8": [0.01] * 3}

  def compile_scheme(scheme, lora_rank=0, **overrides):
    name = scheme + (f"+lora{lora_rank}" if lora_rank else "")
    log.append(("compile", name))
    facts = {"params": 100, "active_params": 100, "memory": {"peak_mib": 2.0 if lora_rank else 4.0}}

    def run():
      log.append(("step", name))
      step_clock(seconds[name].pop() if seconds[name] else 0.001)

    return facts, run

  monkeypatch.setattr(train_step, "compile_scheme", compile_scheme)
  monkeypatch.setattr(train_step, "scheme_dots", lambda scheme, **overrides: [])
  monkeypatch.setattr(train_step, "matmul_gflops", lambda *args, **kwargs: 100.0)
  train_step.main(["--schemes", "pre", "--repeats", "2", "--lora", "8"])
  assert log[:2] == [("compile", "pre"), ("compile", "pre+lora8")]
  assert [entry[1] for entry in log[2:] if entry[0] == "step"][:6] == ["pre", "pre+lora8"] * 3
  report = json.loads(capsys.readouterr().out)
  assert report["lora_vs_full"]["pre"]["peak_memory"] == 0.5
  assert report["lora_vs_full"]["pre"]["step_time"] == pytest.approx(0.25)
  assert len(report["loadavg_1_5_15min"]["before_timing"]) == 3


def test_memory_only_compiles_each_scheme_and_times_nothing(monkeypatch, capsys):
  """`--memory-only`: every scheme compiled with the flags' settings, no step run and no peer started; the peak
  memory over Pre-Norm's."""
  compiled = []

  def compile_scheme(scheme, **overrides):
    compiled.append((scheme, overrides["scan_layers"], overrides["dtype"]))
    run = lambda: pytest.fail("a step ran")  # noqa: E731
    return {"memory": {"peak_mib": {"pre": 4.0, "siamese_post_pre": 5.0}[scheme], "temp_mib": 1.0}}, run

  monkeypatch.setattr(train_step, "compile_scheme", compile_scheme)
  monkeypatch.setattr(train_step, "start_peers", lambda args: pytest.fail("a peer started"))
  train_step.main(["--memory-only", "--scan", "--dtype", "bfloat16", "--schemes", "pre,siamese_post_pre",
                   "--hf-python", "py-hf"])
  assert compiled == [("pre", True, "bfloat16"), ("siamese_post_pre", True, "bfloat16")]
  report = json.loads(capsys.readouterr().out)
  assert report["peak_memory_vs_pre"] == {"pre": 1.0, "siamese_post_pre": 1.25}
  assert report["config"]["scan_layers"] and report["memory_mib"]["pre"]["temp_mib"] == 1.0


def test_the_scheduler_benchmark_compiles_each_scheme_both_ways_and_reports_ratios(monkeypatch, capsys, step_clock):
  """benchmarks/xla_cpu_scheduler.py with fake steps on a fake clock (`step_clock`): each scheme compiled with the
  scheduler on (no options) and off (its XLA option), and the exact ratios of their per-round seconds."""
  from benchmarks import xla_cpu_scheduler

  compiled = []

  def fake_compile(scheme, compiler_options=None, **overrides):
    compiled.append((scheme, compiler_options, overrides["scan_layers"]))
    seconds = 0.002 * (2 if scheme == "post" else 1) * (0.5 if compiler_options else 1)
    return {}, lambda: step_clock(seconds)

  monkeypatch.setattr(xla_cpu_scheduler, "compile_scheme", fake_compile)
  xla_cpu_scheduler.main(["--rounds", "3", "--scan"])
  report = json.loads(capsys.readouterr().out)
  off = {"xla_cpu_enable_concurrency_optimized_scheduler": False}
  assert compiled == [("pre", {}, True), ("pre", off, True), ("post", {}, True), ("post", off, True)]
  assert set(report["step_s"]) == {"pre_on", "pre_off", "post_on", "post_off"}
  assert all(len(v) == 3 for v in report["step_s"].values())
  assert report["off_vs_on"]["pre"] == pytest.approx(0.5)
  assert report["vs_first_scheme"]["on"]["post"] == pytest.approx(2)


def test_traced_dots_finds_every_matmul_of_forward_and_backward_a_scan_body_once_per_iteration():
  """A 3-step scan of [2, 4] x [4, 4] under grad: 3 forward dots, and per step the carry's and the weight's
  gradient: 9 dots of 2 * 2 * 4 * 4 FLOPs; a cond's branch c @ c.T ([2, 4] x [4, 2]): its forward and a gradient
  for each of its two operands, 3 dots of 2 * 2 * 2 * 4 (the other branch has none)."""
  def loss(w, x):
    body = lambda c, wi: (jnp.tanh(c @ wi), None)  # noqa: E731
    c = jax.lax.scan(body, x, w)[0]
    return jax.lax.cond(c.sum() > 0, lambda c: (c @ c.T).sum(), lambda c: c.sum(), c)

  dots = common.traced_dots(jax.grad(loss), jnp.ones((3, 4, 4)), jnp.ones((2, 4)))
  assert sorted(common.dot_flops(*dot) for dot in dots) == [32] * 3 + [64] * 9


def test_dot_flops_counts_batch_and_free_dimensions():
  lhs, rhs = jax.ShapeDtypeStruct((8, 4, 128, 64), jnp.float32), jax.ShapeDtypeStruct((8, 4, 256, 64), jnp.float32)
  params = {"dimension_numbers": (((3,), (3,)), ((0, 1), (0, 1)))}
  assert common.dot_flops(lhs, rhs, params) == 2 * 8 * 4 * 128 * 256 * 64


def test_a_dot_pass_computes_each_dot_on_its_random_operands():
  dots = common.traced_dots(lambda a, b: a @ b, jnp.ones((3, 4)), jnp.ones((4, 5)))
  gflop, run = common.dot_pass(dots * 2)
  assert gflop == 2 * 2 * 3 * 4 * 5 / 1e9
  first, second = run()
  a = jax.random.normal(jax.random.PRNGKey(0), (3, 4))
  b = jax.random.normal(jax.random.PRNGKey(1), (4, 5))
  np.testing.assert_allclose(first, np.asarray(a, np.float64) @ np.asarray(b, np.float64), rtol=1e-5)
  np.testing.assert_array_equal(first, second)
