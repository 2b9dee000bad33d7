"""The math domain: what a chat model's answer to a competition problem is worth.

    data            problem sets: rows {id, problem, answer} from JSONL, parquet or the hub
    reward          prompts, final-answer extraction, verified answer checking, scoring
    normalize       the fallback answer normalizer (no math-verify)
    answer_formats  the public answer-format set, scored per backend
    evaluation      Mean@k / Pass@k on evaluation sets, and the rpg-eval command

Nothing here imports the trainer; the math task (rpg_ref/tasks/math.py) plugs it in.
"""
