"""Multi-path arithmetic: word problems whose answer is reached by several distinct worked solutions (paths).

    "Ava has 7 apples. She buys 5 more. She gives away 3. She finds 8 more. How many apples does Ava have now?"
    answer "17"; paths: "7 + 5 = 12. 12 - 3 = 9. 9 + 8 = 17"    (story order)
                        "7 + 8 = 15. 15 + 5 = 20. 20 - 3 = 17"   (another order of the changes)
                        "5 + 8 = 13. 7 + 13 = 20. 20 - 3 = 17"   (grouped: the gains summed first)

A problem is a start value a_0 and K changes s_k a_k (s_k in {+1, -1}, the ops '+' / '-'); the answer
a_0 + sum_k s_k a_k does not depend on the order the changes are applied in. Its paths (`solution_paths`):
  order pi (a permutation of the K changes):  t_0 = a_0,  t_j = t_{j-1} op_{pi_j} a_{pi_j};
  grouped: G = the gains summed left to right (written when there are >= 2), L = the losses likewise, then
           a_0 + G, then - L (each written only where it exists);
the distinct texts of these, story order first; without allow_negative only paths whose every written total is
>= 0. An SFT example's solution is one path drawn uniformly (`meta['path']`), so an SFT'd policy samples several
and a group's correct rollouts differ in their reasoning text. The verifier is the answer (`math_reward`);
`check_path` also checks a path's arithmetic step by step. Splits are by the content {a_0, multiset of changes}
(the paths are a function of it), so no test or validation content appears in training, in any order; 'train'
problems beyond a run's train_size are its validation set (`math_task.task_problems`), distinct in content too.
"""

from __future__ import annotations

import itertools
import re

import numpy as np

from jaxpt.config import from_section
from jaxpt.data import arithmetic
from jaxpt.data.arithmetic import ArithmeticConfig, Problem

VERSION = 1  # bump when the same config and seed would generate different problems (caches key on it)
OPS = "+-"
MAX_STEPS = 5  # K! orders are enumerated
_STEP = re.compile(r"^\s*(-?\d+) ([+-]) (-?\d+) = (-?\d+)\s*$")


def content(meta: dict) -> tuple:
  """The problem's arithmetic content: (a_0, the sorted signed changes); its paths are a function of it."""
  signed = sorted(n if op == "+" else -n for op, n in zip(meta["ops"], meta["numbers"][1:]))
  return meta["numbers"][0], tuple(signed)


def _chain(start: int, changes: list[tuple[str, int]]) -> tuple[list[str], list[int]]:
  """(steps 'a op n = t', totals) of applying `changes` to `start` left to right."""
  steps, totals, total = [], [], start
  for op, n in changes:
    new = total + n if op == "+" else total - n
    steps.append(f"{total} {op} {n} = {new}")
    totals.append(new)
    total = new
  return steps, totals


def _grouped(start: int, changes: list[tuple[str, int]]) -> tuple[list[str], list[int]]:
  gains = [n for op, n in changes if op == "+"]
  losses = [n for op, n in changes if op == "-"]
  steps, totals = [], []
  sums = []
  for group in (gains, losses):
    if len(group) >= 2:
      s, t = _chain(group[0], [("+", n) for n in group[1:]])
      steps += s
      totals += t
      sums.append(t[-1])
    else:
      sums.append(group[0] if group else None)
  total = start
  if sums[0] is not None:
    steps.append(f"{start} + {sums[0]} = {start + sums[0]}")
    total = start + sums[0]
    totals.append(total)
  if sums[1] is not None:
    steps.append(f"{total} - {sums[1]} = {total - sums[1]}")
    totals.append(total - sums[1])
  return steps, totals


def solution_paths(meta: dict) -> list[str]:
  """The distinct worked solutions of a problem (module docstring), story order first; each 'a op n = t' steps
  joined by '. ', ending at the answer."""
  start, changes = meta["numbers"][0], list(zip(meta["ops"], meta["numbers"][1:]))
  candidates = [_chain(start, [changes[i] for i in order]) for order in itertools.permutations(range(len(changes)))]
  candidates.append(_grouped(start, changes))
  paths = []
  for steps, totals in candidates:
    text = ". ".join(steps)
    if text not in paths and (meta["allow_negative"] or min(totals) >= 0):
      paths.append(text)
  return paths


def check_path(solution: str, start: int, changes: list[tuple[str, int]], answer: str) -> bool:
  """True iff `solution` is steps 'x op y = z' joined by '. ', each true in integers, every operand the start, a
  change's number or an earlier step's result, and the last z == answer."""
  available = {start} | {n for _, n in changes}
  z = None
  for step in solution.split(". "):
    match = _STEP.match(step)
    if match is None:
      return False
    x, op, y, z = int(match[1]), match[2], int(match[3]), int(match[4])
    if z != (x + y if op == "+" else x - y) or x not in available or y not in available:
      return False
    available.add(z)
  return z is not None and str(z) == answer


def render(meta: dict) -> Problem:
  """The Problem rendered from `meta`: the question as `arithmetic.render` writes it, the answer, and the
  solution `solution_paths(meta)[meta['path']]`."""
  chain = arithmetic.render(dict(meta, kind="chain"))
  paths = solution_paths(meta)
  return Problem(question=chain.question, answer=chain.answer, solution=paths[meta["path"] % len(paths)], meta=meta)


def _check(config: ArithmeticConfig) -> ArithmeticConfig:
  config = from_section(ArithmeticConfig, config, "task")
  if set(config.ops) - set(OPS):
    raise ValueError(f"ops={config.ops!r}: the multi-path task takes only '+' and '-' (their order is free)")
  if config.num_steps > MAX_STEPS:
    raise ValueError(f"num_steps={config.num_steps}: at most {MAX_STEPS} (every order is enumerated)")
  return config


def generate(config: ArithmeticConfig, count: int, seed: int, split: str = "train") -> list[Problem]:
  """`count` problems of `split` ('train' | 'test') with distinct contents; a function of (config, seed, split).

  As `arithmetic.generate` (one generator seeded by (seed, split), so the first n of a larger count are the same n;
  the split is a hash of `content`), plus each problem's path drawn uniformly from its `solution_paths`.
  """
  config = _check(config)
  if split not in arithmetic.SPLITS:
    raise ValueError(f"split={split!r}: must be one of {arithmetic.SPLITS}")
  if count < 0:
    raise ValueError(f"count={count}: must be >= 0")
  rng = np.random.default_rng([seed, arithmetic.SPLITS.index(split), VERSION])
  knobs = {"max_value": config.max_value, "max_factor": config.max_factor, "allow_negative": config.allow_negative}
  problems, seen, misses = [], set(), 0
  while len(problems) < count and misses < arithmetic._MAX_MISSES:
    misses += 1
    ops = [config.ops[int(i)] for i in rng.integers(0, len(config.ops), config.num_steps)]
    numbers = arithmetic._draw_numbers(rng, ops, knobs)
    name, pronoun = arithmetic.NAMES[int(rng.integers(len(arithmetic.NAMES)))]
    item = arithmetic.ITEMS[int(rng.integers(len(arithmetic.ITEMS)))]
    phrasings = [int(p) for p in rng.integers(0, 6, config.num_steps)]
    path = int(rng.integers(0, 2**31))
    if numbers is None:
      continue
    meta = {"seed": seed, "index": len(problems), "kind": "multipath", "numbers": numbers, "ops": ops, "name": name,
            "pronoun": pronoun, "item": item, "phrasings": phrasings, "distractors": [], "perturbations": [],
            "path": 0, **knobs}
    key = content(meta)
    if key in seen or arithmetic.split_of([key[0], *key[1]], [], config.test_fraction) != split:
      continue
    meta["path"] = path % len(solution_paths(meta))
    seen.add(key)
    problems.append(render(meta))
    misses = 0
  if len(problems) < count:
    raise ValueError(f"count={count}: only {len(problems)} distinct {split} problems found for {config} "
                     "(raise task.max_value or task.num_steps, or ask for fewer)")
  return problems
