"""The results folder of an experiment: never a committed one by accident, and complete enough to check.

An experiment writes `results.json` (its table, the selection made on validation, the statistics per claim, the
seeds, the command and `environment()`), `results.md`, plots, and `runs/<run name>/metrics.jsonl` (+ done.json) for
every run it reports, so each quoted figure can be recomputed from committed files.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys

from experiments.toolkit.environment import environment
from experiments.toolkit.runner import DONE_FILE, run_dir


class OutError(ValueError):
  pass


def prepare_out(out: str | None, workdir: str, overwrite: bool) -> str:
  """The results folder: `out`, default WORKDIR/results; a non-empty existing folder only with `overwrite`."""
  out = os.path.abspath(out or os.path.join(workdir, "results"))
  if os.path.isdir(out) and os.listdir(out) and not overwrite:
    raise OutError(f"--out {out}: not empty (committed results?); pass --overwrite to replace its files")
  os.makedirs(out, exist_ok=True)
  return out


def copy_run_files(workdir: str, runs: list[dict], out: str) -> None:
  """`out/runs/<name>/{metrics.jsonl, done.json}` for every finished run in `runs`."""
  for run in runs:
    source = run_dir(workdir, run)
    target = os.path.join(out, "runs", run["name"])
    os.makedirs(target, exist_ok=True)
    for name in ("metrics.jsonl", DONE_FILE):
      if os.path.exists(os.path.join(source, name)):
        shutil.copyfile(os.path.join(source, name), os.path.join(target, name))


def read_pilot(path: str, what: str) -> dict:
  """The pilot stage's file at `path` (JSON); stops the program naming it where there is none, so a main stage
  trains nothing before it has read its pilot (`what`: what the pilot fixes, for the message)."""
  if not os.path.exists(path):
    raise SystemExit(f"{path}: no pilot file; run --stage pilot first (it {what})")
  with open(path) as f:
    return json.load(f)


def doc_section(doc: str | None, start: str, end: str) -> str:
  """The text of `doc` between its one `start` marker and the first `end` after it, stripped (a results file's
  `design.stages`, cut from its run.py docstring); a ValueError naming the marker where `start` is not there exactly
  once or `end` does not follow it, so an edited docstring cannot cut the wrong text silently."""
  found = (doc or "").count(start)
  if found != 1:
    raise ValueError(f"doc_section: the marker {start!r} occurs {found} times in the docstring, not once")
  rest = doc.split(start)[1]
  if end not in rest:
    raise ValueError(f"doc_section: the marker {end!r} does not follow {start!r} in the docstring")
  return rest.split(end)[0].strip()


def read_metrics(directory: str) -> list[dict]:
  """The rows of `directory/metrics.jsonl` ([] if absent)."""
  path = os.path.join(directory, "metrics.jsonl")
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def command_line() -> str:
  return " ".join(["python", os.path.relpath(sys.argv[0])] + sys.argv[1:])


def _finite(value):
  """JSON has no NaN/inf: they are written as null."""
  if isinstance(value, float) and not math.isfinite(value):
    return None
  if isinstance(value, dict):
    return {k: _finite(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [_finite(v) for v in value]
  return value


def trained_with(summaries: list[dict]) -> dict[str, int]:
  """{git HEAD (short) of the code that trained them: number of runs} over the runs' done.json."""
  heads: dict[str, int] = {}
  for s in summaries:
    env = s.get("environment") or {}
    head = (env["git_head"][:7] if env.get("git_head") else "an unrecorded commit") + (
        " + edits" if env.get("git_edited") else "")
    heads[head] = heads.get(head, 0) + 1
  return heads


CONFIG_KEYS = ("config", "grpo_config", "sft_config")  # the configs a results file records


def write_json(path: str, payload: dict, summaries: list[dict] = (), report_only: bool = False) -> None:
  """`payload` + the command, this environment (the report's) and `trained_with(summaries)`, as strict JSON
  (NaN -> null), written atomically. With `report_only` (a report rebuilt from finished runs, nothing trained)
  the CONFIG_KEYS entries of an existing results.json at `path` are kept: they describe the config that trained
  the runs, which the current code's defaults (fields added since, paths of another workdir) may not."""
  payload = dict(payload, command=command_line(), environment=environment(), trained_with=trained_with(summaries))
  if report_only and os.path.exists(path):
    with open(path) as f:
      previous = json.load(f)
    kept = [k for k in CONFIG_KEYS if k in previous and k in payload]
    payload.update({k: previous[k] for k in kept})
    if kept:
      payload["config_source"] = (f"{', '.join(kept)}: kept from the results.json the runs were first reported "
                                  "with (this report was rebuilt with --report-only)")
  temporary = path + ".tmp"
  with open(temporary, "w") as f:
    json.dump(_finite(payload), f, indent=1, allow_nan=False)
  os.replace(temporary, path)


def write_markdown(out: str, title: str, body: str, files: str, discussion: str) -> None:
  """`out/results.md`: the title, the tables (`body`), a line naming the other files, then the experiment's
  `discussion` file (its written reading of these numbers; '(to be written)' until it exists)."""
  text = open(discussion).read().strip() if os.path.exists(discussion) else "(to be written)"
  with open(os.path.join(out, "results.md"), "w") as f:
    f.write(f"# {title}\n\n{body}\n\n{files} Per-run metrics: `runs/`. Command and environment: "
            f"`results.json`.\n\n## What the numbers show\n\n{text}\n")


def provenance(summaries: list[dict], script: str) -> str:
  """'Trained by jaxpt at <head> (<n> runs), ... Reproduce: `python <script> --workdir W --jobs 2 --out DIR`'."""
  heads = ", ".join(f"{head} ({count} runs)" for head, count in trained_with(summaries).items())
  return (f"Trained by jaxpt at {heads}. Reproduce: `python {os.path.relpath(script)} --workdir W --jobs 2 "
          "--out DIR` (+ the `--set` values in `results.json`).")


def summary_main(doc: str, out: str, summarise, table, what: str, argv=None) -> None:
  """The command line of a summary of the committed results (`experiments/power.py`, `experiments/compute.py`):
  writes `summarise()` to `out` as JSON; `--table` also prints `table(result)`, the markdown table of `what`."""
  parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
  parser.add_argument("--table", action="store_true", help=f"print the {what} of experiments/README.md")
  args = parser.parse_args(argv)
  result = summarise()
  with open(out, "w") as f:
    json.dump(result, f, indent=1)
    f.write("\n")
  if args.table:
    print(table(result))
