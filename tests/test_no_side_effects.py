"""Importing the library has no side effects on matplotlib; plots come from `jaxpt.reports` and in-memory rows."""

import json
import os
import subprocess
import sys
import textwrap

from jaxpt.engine import metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _run(code: str) -> subprocess.CompletedProcess:
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  env.pop("MPLBACKEND", None)
  result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=env,
                          timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-4000:]
  return result


def test_importing_the_train_package_does_not_import_matplotlib():
  _run("""
      import sys
      import jaxpt.engine, jaxpt.trainers.rm, jaxpt.trainers.pretrain, jaxpt.trainers.sft, jaxpt.trainers.grpo
      import jaxpt.engine.loop, jaxpt.engine.metrics, jaxpt.trainers.rm_eval
      assert 'matplotlib' not in sys.modules, sorted(m for m in sys.modules if m.startswith('matplotlib'))
      """)


def test_plotting_keeps_the_callers_backend(tmp_path):
  loss_png, report_dir = tmp_path / "loss.png", tmp_path / "report"
  result = _run(f"""
      import sys
      import matplotlib
      matplotlib.use("svg")
      import jaxpt.engine
      from jaxpt import reports
      from jaxpt.trainers import rm_eval
      assert matplotlib.get_backend() == "svg", matplotlib.get_backend()
      reports.plot_loss([{{"step": 1, "loss": 2.0}}, {{"step": 2, "loss": 1.5, "eval_loss": 1.7}}], {str(loss_png)!r})
      res = rm_eval.evaluate_pairs([1.0, 2.0], [0.0, 3.0], [4, 5], [6, 2])
      rm_eval.write_report({str(report_dir)!r}, res, [1.0, 2.0], [0.0, 3.0], [4, 5], [6, 2], "t")
      assert "matplotlib.pyplot" not in sys.modules
      print(matplotlib.get_backend())
      """)
  assert result.stdout.strip().splitlines()[-1] == "svg"
  assert loss_png.read_bytes()[:8] == PNG_MAGIC
  assert (report_dir / "score_vs_length.png").read_bytes()[:8] == PNG_MAGIC


def test_metric_writer_plots_from_memory(tmp_path, monkeypatch):
  workdir = str(tmp_path)
  with open(os.path.join(workdir, metrics.METRICS_FILE), "w") as f:  # left by an interrupted run
    f.writelines(json.dumps({"step": s, "loss": 3.0 - 0.1 * s}) + "\n" for s in (1, 2, 3))
  writer = metrics.MetricWriter(workdir, start_step=2)
  try:
    writer.write(3, {"loss": 2.5, "eval_loss": 2.6})
    writer.write(4, {"loss": float("nan")})
    assert [r["step"] for r in writer.rows] == [1, 2, 3, 4]
    assert [r["step"] for r in metrics.read_metrics(workdir)] == [1, 2, 3, 4]
    os.remove(os.path.join(workdir, metrics.METRICS_FILE))

    def no_reading(_):
      raise AssertionError("plot() must not re-read metrics.jsonl")

    monkeypatch.setattr(metrics, "read_metrics", no_reading)
    path = writer.plot()
  finally:
    writer.close()
  assert path == os.path.join(workdir, metrics.PLOT_FILE)
  with open(path, "rb") as f:
    assert f.read(8) == PNG_MAGIC
  assert metrics.NullMetricWriter().plot() == ""


def test_import_jaxpt_is_cheap_and_its_names_resolve_on_first_use():
  _run("""
      import sys
      import jaxpt
      assert not [m for m in ("jax", "flax", "matplotlib", "tensorflow_datasets") if m in sys.modules]
      from jaxpt.models.config import ModelConfig
      from jaxpt.engine.run import train
      from jaxpt.trainers.pretrain import PretrainRunConfig
      assert jaxpt.ModelConfig is ModelConfig and jaxpt.train is train
      assert jaxpt.PretrainRunConfig is PretrainRunConfig and "TransformerLM" in dir(jaxpt)
      assert jaxpt.get_loss("policy", "ppo_clip") is not None and "bt" in jaxpt.known_losses("preference")
      for name in jaxpt.__all__:
        getattr(jaxpt, name)
      """)
