"""Tasks: where prompts, rewards and evaluation come from (the Task protocol of rpg_ref.interfaces).

    bandit   a K-armed softmax bandit with a known KL-regularized optimum
    seq      digit addition with a tiny random-init Qwen3 (the default CPU run)
    math     competition math with a Hugging Face chat model (the paper's task)
"""
