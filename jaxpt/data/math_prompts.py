"""Text of the math tasks: prompt and response formats, and the ground truth of a GSM8K answer field.

    prompt   = "Question: <question>\nAnswer:\n"
    response = "<solution>\n\\boxed{<answer>}"       (the last `\\boxed{}` is the answer, see jaxpt.rl.rewards)
    GSM8K answer field = "<reasoning>\n#### N"      (ground truth: N, `parse_gsm8k_answer`)

SFT trains on prompt + response + EOS (loss on the response and EOS only); GRPO samples a response after the
prompt tokens and scores it with `jaxpt.rl.rewards.math_reward`. Prompt and response are tokenized separately and
concatenated. Pure Python: this module imports nothing (the rewards above the data layer import it).
"""

from __future__ import annotations

PROMPT_PREFIX = "Question: "
PROMPT_SUFFIX = "\nAnswer:\n"


def format_prompt(question: str) -> str:
  """The model's input for `question`."""
  return f"{PROMPT_PREFIX}{question.strip()}{PROMPT_SUFFIX}"


def format_response(solution: str, answer: str) -> str:
  """The target response: the worked solution, then `\\boxed{answer}` last."""
  return f"{solution.strip()}\n\\boxed{{{answer}}}"


def parse_gsm8k_answer(answer: str) -> str:
  """GSM8K ground truth: the text after the last `####`, stripped, thousands commas removed ('2,125' -> '2125').

  Raises ValueError when the field has no `####`.
  """
  idx = answer.rfind("####")
  if idx < 0:
    raise ValueError(f"GSM8K answer has no '####': {answer[-80:]!r}")
  return answer[idx + 4:].strip().replace(",", "")
