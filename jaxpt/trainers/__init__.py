"""The trainers: one module each (pretrain, sft, rm, dpo, grpo, vit, dit), every one an entry of the table
`jaxpt.engine.trainers.TRAINERS` and a `build(config, workdir) -> BuiltRun` over the engine (`jaxpt.engine`), with
the pieces two of them share (`lm`: the LM loss and evaluator; `pairs`, `rm_eval`, `dir_estimator`: preference
pairs, their report and the DIR estimator; `fid`: the DiT's FID). Import a trainer on its own
(`from jaxpt.trainers import rm`): this package imports nothing.
"""
