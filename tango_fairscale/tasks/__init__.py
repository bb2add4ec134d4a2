"""The task seam: lm-evaluation-harness tasks (prompts, choices, gold answers, metrics) and PIQA's
official release files."""
