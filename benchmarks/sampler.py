"""KV-cache sampler throughput (new tokens/s) per residual scheme and rollout dtype, beside HF `generate` and
tunix's `Sampler`, timed in alternation. Prints one JSON object (or writes it to --out).

    python -m benchmarks.sampler [--hf-python /tmp/peers2-venv/bin/python] [--tunix-python /tmp/peers-venv/bin/python]
                                 [--points small,kv] [--rounds 5,2]
                                 [--schemes pre,siamese_post_pre] [--kv-schemes pre] [--dtypes float32,bfloat16]
                                 [--out FILE] [realistic point flags: --prompts 32 --group 8 --min-prompt 64
                                 --max-prompt 256 --median 100 --max-new 512 --spread 0.9 --slots 64
                                 --page-size 16 --model issue|small|tiny]

Model (the issue's): d_model 512, 8 layers, 8 heads (4 KV), SwiGLU 2048, vocab 8192 (tied), random init. Points:
`small` = batch 8, prompt 32, 128 new tokens; `kv` = batch 64, prompt 256, 256 new tokens (the KV cache read per
step, ~0.4 GB in fp32, outweighs the 0.14 GB of weights). Every call samples at temperature 1 with no EOS, so all
rows generate every token. One jaxpt call = prefill + (new - 1) decode steps, compile excluded; `prefill_ms` is
the same sampler with 1 new token, so decode_step_ms = (call - prefill) / (new - 1). The first scheme's variants
also time the same call through the rollout engine (`engine`: `batch` slots, pages of 16, every row's budget the
new tokens): its call, tokens/s and speed-ups (vs the static sampler and each peer) in each round's alternation.

`realistic` (issue 29's: `python -m benchmarks.sampler --points realistic --rounds 3 --hf-python
/tmp/peers2-venv/bin/python --tunix-python /tmp/peers-venv/bin/python --out
benchmarks/results_sampler_realistic_cpu.json`): the rows and answer lengths of
`benchmarks/realistic.py` (B = --prompts prompts x G = --group rollouts, prompts --min-prompt .. --max-prompt
tokens left-padded, lognormal answer lengths of median --median up to --max-new), the same token ids and lengths
for every system: written once to an .npz that each peer process reads (`sampler_peers.py --rows`). jaxpt
(`jaxpt.pre_float32`) is the rollout engine (`jaxpt.rl.engine.Engine`, continuous batching over a paged cache,
--slots slots of --page-size pages) and `jaxpt_static.pre_float32` the static sampler beside it, both given the
lengths as per-row token budgets; HF and tunix end each row at its length by an EOS forced through their logits
(see `sampler_peers.py`); everyone may sample --max-new tokens, at temperature 1 over the full vocabulary. One call
samples every row; a round times the engine, the static sampler and each peer once, and a speed-up is the median
of per-round ratios. `tokens_per_sec` = sum of the forced lengths / call seconds; `useful_fraction` = useful decode
slot-steps (the engine's `EngineStats`; a static batch steps every row until its longest one ends: HF's call checks
it stopped there, tunix's while_loop stops when no row is left undone); `peak_mib` / `peak_vs_static`: the compiled
peak memory of the engine and the static sampler (`benchmarks/realistic.py`). `--model small|tiny` and smaller
sizes make a short smoke run. Prefill differs by design: the engine and the static sampler get group_size=G and
prefill each of the B distinct prompts once for its G rollouts (shared-prompt prefill, which issue 29 asks of
jaxpt), while HF and tunix, which have no shared-prompt prefill (HF's `num_return_sequences` repeats the prompts
before its prefill), prefill all B x G rows; so the speed-ups include that saving (the point's `note` says so).

Peers (`benchmarks/sampler_peers.py`, run with --hf-python, a venv with torch + transformers, and --tunix-python,
one with google-tunix 0.1.7 (which needs safetensors < 0.8, so the newest transformers cannot share its venv);
--peer-python is both, for a venv that holds them all): HF transformers `generate` and tunix's Sampler with untied
(tunix's default) and tied embeddings. Each peer is a persistent process fed one `run` command per round. At every
point the peers start first, one at a time: each builds, makes its warm-up call (compiles) and, for HF, picks its
torch thread count before the next starts and before jaxpt compiles anything, so each warm-up and HF's 1-or-2-thread
choice run beside no other work of the benchmark (a ready peer waits on its stdin). A round then times every jaxpt
variant and every peer once, one after the other, so a load swing reaches all alike, and a speed-up is the median
over rounds of that round's peer seconds / jaxpt seconds. `--rounds` gives one count per `--points` entry (default:
small 5, kv 2, realistic 3); a `--model` other than `issue` is refused where small or kv runs (they and their peers
build the issue's model).

Floors (same rounds): `read_gb_per_s` is the machine's measured memory read rate (a jitted sum over 256 MiB);
a decode step must read every weight and the filled part of the KV cache (the mean over steps of prompt + t
slots), so floor_ms = (weight bytes + mean KV bytes) / read rate and `decode_step_vs_floor` = step / floor;
`weights_matmul_ms` is one pass over every weight matrix as XLA batch-B matmuls (what XLA's dot reaches).
"""

from __future__ import annotations

from jaxpt.host_allocator import reuse_freed_host_memory

allocator_reuse = reuse_freed_host_memory()  # first, before JAX allocates (see jaxpt/host_allocator.py)

import argparse
import json
import os
import pathlib
import shlex
import statistics
import sys
import tempfile
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks import realistic, references
from benchmarks.common import alternating_seconds, machine_info, median_ratio, ready_peers
from benchmarks.train_step import MODEL
from jaxpt.models.config import ModelConfig
from jaxpt.models.transformer import init_params, param_count
from jaxpt.rl.engine import Engine, EngineConfig
from jaxpt.rl.sampler import SamplingConfig, make_sampler

POINTS = {"small": (8, 32, 128), "kv": (64, 256, 256)}  # batch, prompt, new tokens
ROUNDS = {"small": 5, "kv": 2, "realistic": 3}  # default timed rounds per point
PEERS = ("hf", "tunix_untied", "tunix_tied")
PEER_SCRIPT = pathlib.Path(__file__).resolve().parent / "sampler_peers.py"


def fixed_prompts(cfg: ModelConfig, batch: int, prompt: int) -> tuple[np.ndarray, np.ndarray]:
  """The fixed points' prompts: random token ids int32 [batch, prompt] (seed 0) and their all-ones mask."""
  prompts = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, prompt), dtype=np.int32)
  return prompts, np.ones_like(prompts)


def sampler_run(cfg: ModelConfig, params, batch: int, prompt: int, new_tokens: int, dtype: str
                ) -> Callable[[], jax.Array]:
  """One compiled sampler call per `run()` (prompts without padding, all rows run to new_tokens, a fresh key each)."""
  sampler = make_sampler(cfg, SamplingConfig(max_new_tokens=new_tokens, rollout_dtype=dtype), prompt)
  prompts, mask = fixed_prompts(cfg, batch, prompt)
  compiled = sampler.lower(params, prompts, mask, jax.random.PRNGKey(0)).compile()
  calls = iter(range(10 ** 6))
  return lambda: compiled(params, prompts, mask, jax.random.PRNGKey(next(calls))).tokens


def engine_run(cfg: ModelConfig, params, batch: int, prompt: int, new_tokens: int, dtype: str
               ) -> Callable[[], jax.Array]:
  """`sampler_run`'s call through the rollout engine (`jaxpt.rl.engine`): `batch` slots, pages of 16, every row's
  budget new_tokens (no EOS), a fresh key each."""
  engine = Engine(cfg, SamplingConfig(max_new_tokens=new_tokens, rollout_dtype=dtype), prompt,
                  EngineConfig(num_slots=batch, page_size=16))
  prompts, mask = fixed_prompts(cfg, batch, prompt)
  budgets = np.full((batch,), new_tokens, np.int32)
  compiled = engine.jitted.lower(params, prompts, mask, jax.random.PRNGKey(0), budgets).compile()
  calls = iter(range(10 ** 6))
  return lambda: compiled(params, prompts, mask, jax.random.PRNGKey(next(calls)), budgets)[0].tokens


def weights_matmul_run(params, batch: int, dtype: str) -> Callable[[], object]:
  """One pass over every weight matrix (in `dtype`) as a batch-`batch` matmul per `run()`, float32 accumulation."""
  def as_matrix(w):
    return w.reshape(-1, w.shape[-1]) if w.ndim == 3 and w.shape[0] < w.shape[-1] else w.reshape(w.shape[0], -1)

  matrices = [as_matrix(w).astype(dtype) for w in jax.tree_util.tree_leaves(params) if w.ndim >= 2]
  inputs = [jnp.ones((batch, m.shape[0]), m.dtype) for m in matrices]
  one_pass = jax.jit(lambda ms, xs: [jnp.dot(x, m, preferred_element_type=jnp.float32) for m, x in zip(ms, xs)])
  return lambda: one_pass(matrices, inputs)


def read_run(mib: int = 256) -> tuple[int, Callable[[], object]]:
  """(bytes, run): a jitted sum over `mib` MiB of float32 (the memory read rate a decode step can hope for)."""
  data = jnp.ones((mib * 2 ** 18,), jnp.float32)
  total = jax.jit(jnp.sum)
  return data.nbytes, lambda: total(data)


def timed(fn: Callable[[], object]) -> float:
  start = time.perf_counter()
  jax.block_until_ready(fn())
  return time.perf_counter() - start


def hf_flags(peer: str, threads: int) -> list[str]:
  """The HF peer's `--torch-threads` (0: none, it picks 1 or 2 threads by a trial call each)."""
  return ["--torch-threads", str(threads)] if peer == "hf" and threads else []


def peer_pythons(args) -> dict[str, str]:
  """{peer: the python it runs under} for every peer given one: --hf-python for HF, --tunix-python for tunix's two,
  --peer-python for either where its own is not given."""
  pythons = {p: (args.hf_python if p == "hf" else args.tunix_python) or args.peer_python for p in PEERS}
  return {p: python for p, python in pythons.items() if python}


def speedups(times: dict, peers, key) -> dict:
  """{"speedup_vs_<peer>": median over rounds of the peer's call seconds / times[key]'s} for every peer."""
  return {f"speedup_vs_{p.name}": round(median_ratio(times[(p.name, "call")], times[key]), 2) for p in peers}


def run_point(name: str, schemes: list[str], dtypes: list[str], rounds: int, pythons: dict[str, str],
              hf_threads: int = 0) -> dict:
  """Readies the peers of one operating point one at a time, then builds its jaxpt variants, times `rounds`
  alternating rounds, summarises."""
  batch, prompt, new = POINTS[name]
  peers = ready_peers({p: [python, str(PEER_SCRIPT), p, str(batch), str(prompt), str(new), *hf_flags(p, hf_threads)]
                       for p, python in pythons.items()})
  runs, facts = {}, {}
  for scheme in schemes:
    cfg = ModelConfig(norm_scheme=scheme, **MODEL)
    params = init_params(cfg, jax.random.PRNGKey(0))
    for dtype in dtypes:
      variant = f"{scheme}_{dtype}"
      facts[variant] = {"params": param_count(params), "bytes_per_param": jnp.dtype(dtype).itemsize,
                        "kv_bytes_per_slot": batch * cfg.num_layers * cfg.num_kv_heads * cfg.resolved_head_dim
                        * 2 * jnp.dtype(dtype).itemsize}
      runs[(variant, "call")] = sampler_run(cfg, params, batch, prompt, new, dtype)
      runs[(variant, "prefill")] = sampler_run(cfg, params, batch, prompt, 1, dtype)
      if scheme == schemes[0]:
        runs[("weights", dtype)] = weights_matmul_run(params, batch, dtype)
        runs[(variant, "engine")] = engine_run(cfg, params, batch, prompt, new, dtype)
  read_bytes, runs[("read", "")] = read_run()
  for fn in runs.values():  # warm-up (first executions), untimed
    jax.block_until_ready(fn())
  times = {key: [] for key in list(runs) + [(p.name, "call") for p in peers]}
  for r in range(rounds):
    for key, fn in runs.items():
      times[key].append(timed(fn))
    for peer in peers:
      times[(peer.name, "call")].append(peer.seconds(r + 1))
  for peer in peers:
    peer.close()

  med = {key: statistics.median(t) for key, t in times.items()}
  read_rate = read_bytes / med[("read", "")]
  variants = {}
  mean_slots = prompt + (new - 1) / 2  # decode step t (1 .. new - 1) reads prompt + t filled slots
  for variant, f in facts.items():
    dtype = variant.rsplit("_", 1)[1]
    call, prefill = med[(variant, "call")], med[(variant, "prefill")]
    step = (call - prefill) / (new - 1)
    floor = (f["params"] * f["bytes_per_param"] + mean_slots * f["kv_bytes_per_slot"]) / read_rate
    variants[variant] = {
        "call_ms": round(call * 1e3, 1), "prefill_ms": round(prefill * 1e3, 1), "decode_step_ms": round(step * 1e3, 2),
        "new_tokens_per_sec": round(batch * new / call, 1),
        "weights_mib": round(f["params"] * f["bytes_per_param"] / 2 ** 20, 1),
        "mean_kv_mib_per_step": round(mean_slots * f["kv_bytes_per_slot"] / 2 ** 20, 1),
        "floor_ms": round(floor * 1e3, 2), "decode_step_vs_floor": round(step / floor, 2),
        "weights_matmul_ms": round(med[("weights", dtype)] * 1e3, 2),
        "decode_step_vs_weights_matmul": round(step / med[("weights", dtype)], 2)}
    variants[variant].update(speedups(times, peers, (variant, "call")))
    if (variant, "engine") in times:
      engine = med[(variant, "engine")]
      variants[variant]["engine"] = {
          "call_ms": round(engine * 1e3, 1), "new_tokens_per_sec": round(batch * new / engine, 1),
          "speedup_vs_static": round(median_ratio(times[(variant, "call")], times[(variant, "engine")]), 2),
          **speedups(times, peers, (variant, "engine"))}
  report = {"batch": batch, "prompt": prompt, "new_tokens": new, "rounds": rounds,
            "read_gb_per_s": round(read_rate / 1e9, 1), "jaxpt": variants,
            "peers": {p.name: {"params": p.params, "setting": p.setting,
                               "call_ms": round(med[(p.name, "call")] * 1e3, 1),
                               "new_tokens_per_sec": round(batch * new / med[(p.name, "call")], 1)}
                      for p in peers}}
  tunix = fastest_tunix(report, "new_tokens_per_sec")
  report["goals"] = {f"{v}{path}_vs_{peer} >= {goal}": figures[f"speedup_vs_{peer}"]
                     for v, peer, goal in [(f"{schemes[0]}_float32", tunix, 1.5), (f"{schemes[0]}_float32", "hf", 2.0),
                                           (f"{schemes[0]}_bfloat16", tunix, 2.5)]
                     if v in variants and peer in report["peers"]
                     for path, figures in (("", variants[v]), ("_engine", variants[v]["engine"]))}
  return report


def fastest_tunix(report: dict, rate: str) -> str | None:
  """The faster of tunix's two samplers in `report["peers"]` by `rate` (also recorded as `fastest_tunix`), or None
  where tunix did not run."""
  ran = [p for p in ("tunix_untied", "tunix_tied") if p in report["peers"]]
  if not ran:
    return None
  report["fastest_tunix"] = max(ran, key=lambda p: report["peers"][p][rate])
  return report["fastest_tunix"]


def write_rows(path: str, cfg: ModelConfig, args, tokens, mask, lengths) -> None:
  """The realistic point's rows for the peers (`sampler_peers.py --rows`): tokens and mask [R, P], lengths [R],
  eos, max_new and the model's (d_model, layers, heads, KV heads, vocab)."""
  np.savez(path, tokens=tokens, mask=mask, lengths=lengths, eos=realistic.EOS, max_new=args.max_new,
           model=np.array([cfg.d_model, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.vocab_size]))


def run_realistic(args, rounds: int, pythons: dict[str, str], hf_threads: int = 0) -> dict:
  """The realistic point (see the module doc): the peers start on the rows' .npz one at a time, then jaxpt's
  engine and static sampler compile and run once (untimed), then `rounds` alternating rounds; -> its report."""
  cfg = ModelConfig(norm_scheme="pre", **realistic.MODELS[args.model])
  tokens, mask, lengths = realistic.realistic_rows(args, cfg.vocab_size)
  with tempfile.TemporaryDirectory() as tmp:
    rows = os.path.join(tmp, "rows.npz")
    write_rows(rows, cfg, args, tokens, mask, lengths)
    # each has read the rows and made its checked warm-up call before the next starts and jaxpt compiles
    peers = ready_peers({p: [python, str(PEER_SCRIPT), p, "--rows", rows, *hf_flags(p, hf_threads)]
                         for p, python in pythons.items()}, stderr=None)
    params = init_params(cfg, jax.random.PRNGKey(0))
    engine, compiled = realistic.jaxpt_systems(cfg, args, params, tokens, mask, lengths)
    calls = iter(range(1, 10 ** 6))
    runs = {name: (lambda fn=fn: fn(params, tokens, mask, jax.random.PRNGKey(next(calls)), lengths))
            for name, fn in compiled.items()}
    # the warm-up, finished before the clock starts (unblocked, it ran inside the first timed engine call)
    (engine_out, stats), static_out = jax.block_until_ready((runs["engine"](), runs["static"]()))
  load_before = os.getloadavg()
  times = alternating_seconds(runs, rounds, warmup=0, peers={p.name: p.seconds for p in peers})
  load_after = os.getloadavg()
  for peer in peers:
    peer.close()
  figures = realistic.jaxpt_figures(cfg, args, engine, compiled, times, stats, lengths)
  for name in ("engine", "static"):
    figures[name].update({f"speedup_vs_{p.name}": round(median_ratio(times[p.name], times[name]), 2) for p in peers})
  figures["engine"].update(speedup_vs_static=round(median_ratio(times["static"], times["engine"]), 2),
                           peak_vs_static=round(figures["engine"]["peak_mib"] / figures["static"]["peak_mib"], 3))
  report = {
      "point": realistic.point_facts(args, lengths, engine, rounds),
      "note": f"prefill: jaxpt's engine and static sampler (group_size={args.group}) prefill each of the "
              f"{args.prompts} distinct prompts once; HF and tunix, without shared-prompt prefill, prefill all "
              f"{len(lengths)} rows: the speed-ups include that saving by design",
      "model": dict(realistic.MODELS[args.model], name=args.model, norm_scheme=cfg.norm_scheme),
      "sampling": f"temperature 1, full vocabulary, up to {args.max_new} tokens; answers end at pre-drawn lengths: "
                  f"jaxpt's token budgets, HF's and tunix's EOS (id {realistic.EOS}) forced through their logits",
      "same_lengths_as_forced": {"engine": bool(np.array_equal(engine_out.lengths, lengths)),
                                 "static": bool(np.array_equal(static_out.lengths, lengths)),
                                 "peers": "checked by each peer call"},
      "jaxpt": {"pre_float32": figures["engine"]}, "jaxpt_static": {"pre_float32": figures["static"]},
      "peers": {p.name: dict(realistic.call_figures(times[p.name], int(lengths.sum())), params=p.params,
                             setting=p.setting, useful_fraction=realistic.static_useful_fraction(lengths))
                for p in peers},
      "load": {"note": "os.getloadavg() (1, 5, 15 min) before and after the timed rounds",
               "before": [round(x, 2) for x in load_before], "after": [round(x, 2) for x in load_after]}}
  tunix = fastest_tunix(report, "tokens_per_sec")
  report["goals"] = {f"pre_float32_vs_{peer} >= {goal}": figures["engine"][f"speedup_vs_{peer}"]
                     for peer, goal in ((tunix, 2), ("hf", 3)) if peer in report["peers"]}
  return report


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--points", default="small,kv")
  parser.add_argument("--rounds", default="", help="timed rounds per point, in --points order (default: small 5, "
                      "kv 2, realistic 3)")
  parser.add_argument("--schemes", default="pre,siamese_post_pre", help="jaxpt schemes at the small point")
  parser.add_argument("--kv-schemes", default="pre", help="jaxpt schemes at the kv point")
  parser.add_argument("--dtypes", default="float32,bfloat16", help="rollout dtypes of every jaxpt scheme")
  references.add_arguments(parser)
  parser.add_argument("--peer-python", default="", help="python of a venv with torch + transformers + tunix: "
                      "the peers' where --hf-python / --tunix-python are not given")
  parser.add_argument("--out", default="", help="write the JSON here (default: stdout)")
  parser.add_argument("--hf-threads", type=int, default=0, choices=(0, 1, 2),
                      help="torch threads of the HF peer; 0: the faster of 1 and 2 in a trial call each (two "
                           "untimed whole calls: at the realistic point ~15 min each on this CPU)")
  realistic.add_flags(parser)
  args = parser.parse_args(argv)
  points = args.points.split(",")
  for point in points:
    if point not in (*POINTS, "realistic"):
      parser.error(f"--points: unknown point {point!r} (small, kv, realistic)")
  rounds = args.rounds.split(",") if args.rounds else [str(ROUNDS[p]) for p in points]
  if len(rounds) != len(points) or not all(r.isdigit() and int(r) > 0 for r in rounds):
    parser.error(f"--rounds: {args.rounds!r} is not one positive count per --points entry ({', '.join(points)})")
  fixed = [p for p in points if p in POINTS]
  if args.model != "issue" and fixed:
    parser.error(f"--model: {args.model!r} applies only to the realistic point, not to {', '.join(fixed)} (the "
                 "issue's model)")
  report = {"benchmark": "sampler",
            "config": dict(MODEL, sampling="small, kv: temperature 1, no top-k/top-p, no EOS", cache_segments=4,
                           host_allocator_reuse=allocator_reuse),
            **machine_info(),
            "command": "python -m benchmarks.sampler " + shlex.join(sys.argv[1:] if argv is None else argv)}
  for point, n in zip(points, map(int, rounds)):
    if point == "realistic":
      report[point] = run_realistic(args, n, peer_pythons(args), args.hf_threads)
    else:
      schemes = (args.schemes if point == "small" else args.kv_schemes).split(",")
      report[point] = run_point(point, schemes, args.dtypes.split(","), n, peer_pythons(args), args.hf_threads)
    print(f"{point}: done", file=sys.stderr, flush=True)
  text = json.dumps(report, indent=2) + "\n"
  if args.out:
    pathlib.Path(args.out).write_text(text)
  else:
    sys.stdout.write(text)


if __name__ == "__main__":
  main()
