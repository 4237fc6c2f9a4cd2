"""Where one train step's non-matmul memory traffic goes, per part of the model: read off the compiled HLO, nothing
timed, so it ranks what to fix on a machine too noisy to time (and shows a fix's effect in bytes). Prints one JSON
object.

    python -m tools.step_bytes [--schemes pre,post] [--scan] [--top 15]

Every top-level op of `benchmarks/train_step.py`'s compiled step that is not a matmul (a `dot`, or a fusion whose
computation holds one: XLA:CPU's YNNPACK `ynn_fusion`s) nor free (parameters, tuples, bitcasts, constants) counts its
operands' and its output's bytes: what a CPU fusion reads and writes (an upper bound: a slice reads part of its
operand). The ops are grouped by where jaxpt made them, from their metadata: `parts` (attention, mlp, norms, embedding,
residual, loss, optimizer: everything outside the model and its loss, i.e. the gradient clip, AdamW and the non-finite
guard) and `top`, the source paths (layer index dropped, `fwd` / `bwd`) moving the most. Per scheme: `non_matmul_gb`,
`matmul_gb` (the matmul ops' operands and outputs) and those groups. The non-matmul bytes over the machine's copy rate
estimate what the step spends beside its matmuls (`benchmarks/train_step.py`'s `pre_dot_pass` times it).
"""

from __future__ import annotations

import collections
import json
import re

from benchmarks.train_step import build_scheme
from tools.step_profile import step_tool_args, step_tool_report

FREE = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant"}
ELEMENT_BYTES = {"f64": 8, "s64": 8, "u64": 8, "f32": 4, "s32": 4, "u32": 4, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
                 "s8": 1, "u8": 1, "pred": 1}
_ARRAY = re.compile(r"\b(" + "|".join(ELEMENT_BYTES) + r")\[([\d,]*)\]")
_INSTRUCTION = re.compile(r"\s+(?:ROOT )?%([\w.-]+) = (\([^=]*?\)|\w+\[[\d,]*\]\S*) ([\w-]+)\((.*?)\)(?:, |$)")
_DEFINITION = re.compile(r"%([\w.-]+) = (\([^=]*?\)|\w+\[[\d,]*\])")


def array_bytes(type_text: str) -> int:
  """Bytes of every array in an HLO type, e.g. `f32[8,512]{1,0}` or a tuple `(f32[2], s32[])`."""
  total = 0
  for dtype, dims in _ARRAY.findall(type_text):
    count = 1
    for d in filter(None, dims.split(",")):
      count *= int(d)
    total += ELEMENT_BYTES[dtype] * count
  return total


def source_path(op_name: str) -> str:
  """An op's jaxpt source from its metadata op_name: `fwd` or `bwd` (under a `transpose(...)`), then the module
  path without JAX's wrappers (`jit(...)`, `jvp(...)`, ...), the layer index dropped and repeats removed:
  'jit(train_step)/transpose(jvp(TransformerLM))/decoder/layers_3/mlp/mul' -> 'bwd decoder/layers_N/mlp/mul'."""
  direction = "bwd" if "transpose(" in op_name else "fwd"
  segments = []
  for segment in op_name.split("/")[1:]:
    segment = re.sub(r"layers_\d+", "layers_N", re.sub(r"\w+\(.*?\)+", "", segment))
    if segment and segment not in segments:
      segments.append(segment)
  return f"{direction} {'/'.join(segments)}"


def part(op_name: str) -> str:
  """The part of the step an op belongs to (see the module docstring), from its metadata op_name."""
  if "TransformerLM" not in op_name:
    return "loss" if "jvp(" in op_name else "optimizer"
  path = source_path(op_name)
  for name, marks in (("norms", ("norm",)), ("attention", ("attn", "attention")), ("mlp", ("mlp", "moe")),
                      ("embedding", ("embed", "_take", "output"))):
    if any(mark in path for mark in marks):
      return name
  return "residual"


def op_bytes(hlo_text: str) -> list[tuple[str, int, bool]]:
  """(metadata op_name, bytes read and written, is a matmul) of every counted op (see above) of a compiled module's
  entry computation (`compiled.as_text()`)."""
  types = dict(_DEFINITION.findall(hlo_text))
  with_dot = {head[1] for block in hlo_text.split("\n\n") if " dot(" in block  # fused computations holding a dot
              for head in [re.match(r"%([\w.-]+) ", block.strip())] if head}
  counted = []
  for line in hlo_text[hlo_text.index("\nENTRY"):].splitlines()[1:]:
    match = _INSTRUCTION.match(line)
    if not match or match.group(3) in FREE:
      continue
    _, out_type, opcode, operands = match.groups()
    moved = array_bytes(out_type) + sum(array_bytes(types.get(o, "")) for o in re.findall(r"%([\w.-]+)", operands))
    called = re.search(r"calls=%([\w.-]+)", line)
    op_name = re.search(r'op_name="([^"]*)"', line)
    counted.append((op_name[1] if op_name else "?", moved, opcode == "dot" or bool(called and called[1] in with_dot)))
  return counted


def traffic(hlo_text: str, top: int = 15) -> dict:
  """`op_bytes` in GB, the non-matmul ones grouped (see the module docstring)."""
  parts, paths, ops = collections.Counter(), collections.Counter(), collections.Counter()
  matmul = 0
  for op_name, moved, is_matmul in op_bytes(hlo_text):
    if is_matmul:
      matmul += moved
      continue
    parts[part(op_name)] += moved
    paths[source_path(op_name)] += moved
    ops[source_path(op_name)] += 1
  gb = lambda n: round(n / 1e9, 3)  # noqa: E731
  return {"non_matmul_gb": gb(sum(parts.values())), "matmul_gb": gb(matmul),
          "parts_gb": {k: gb(v) for k, v in parts.most_common()},
          "top": [{"path": p, "gb": gb(v), "ops": ops[p]} for p, v in paths.most_common(top)]}


def step_traffic(scheme: str, scan: bool, top: int) -> dict:
  """`traffic` of `scheme`'s compiled train step (`benchmarks.train_step.build_scheme`)."""
  _, step, state, batch = build_scheme(scheme, scan_layers=scan)
  return traffic(step.lower(state, batch).compile().as_text(), top)


def main(argv=None) -> None:
  args = step_tool_args(argv, __doc__, 15, "source paths listed per scheme")
  report = step_tool_report("step_bytes", args, argv)
  report["schemes"] = {s: step_traffic(s, args.scan, args.top) for s in args.schemes.split(",")}
  print(json.dumps(report, indent=2))


if __name__ == "__main__":
  main()
