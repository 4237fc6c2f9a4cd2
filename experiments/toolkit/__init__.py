"""What every experiment under `experiments/` shares (not part of the installed library).

- `flags`:       the common command line (--set, --seeds, --methods, --out, --jobs, --workdir, --report-only) and
                 `--set key=value` overrides applied to an ml_collections config;
- `runner`:      a resumable grid of runs, each in its own workdir, trained by worker processes;
- `stats`:       "mean ± sample std (n)" and paired per-seed statistics (t interval, paired t, exact sign-flip, Holm);
- `environment`: the git HEAD and library versions a result was produced with;
- `results`:     the output folder (never a committed one by accident), per-run metrics.jsonl, results.json;
- `probes`:      gradient norm reaching each block, residual-stream norm by depth.

Rules the experiments keep (issue 18): every choice of hyper-parameter is made on a validation split, reported
numbers come from a separate test split; every claim quotes its paired statistic and the minimum p the test can
reach with its n; results files list the selection, the seeds, the statistics and the environment.
"""
