"""Train Qwen3 with an RPG loss through TRL's GRPOTrainer (rpg_ref.integrations.trl).

Every GRPOConfig option and the rpg_* options are flags (docs/trl.md has the paper's 8-GPU recipe):

    accelerate launch --num_processes 8 examples/trl/train_rpg_qwen3.py --model Qwen/Qwen3-4B \\
        --data train.jsonl --rpg_loss rpg-reinforce-urkl --rpg_beta 1e-4 --output_dir out ...

--tiny: a random 2-layer Qwen3 with a character tokenizer on a toy task (reward: the share of
response characters equal to the last digit of a+b), a check that the pipeline runs, on CPU:

    torchrun --standalone --nproc_per_node 2 examples/trl/train_rpg_qwen3.py --tiny --use_cpu \\
        --output_dir /tmp/rpg-trl --max_steps 2

Each process prints a last line "rank R of N (DISTRIBUTED_TYPE): ..." with the change of its
weights and a checksum of them (equal on every rank: data-parallel replicas stay in sync).
"""
from __future__ import annotations

import json
import random
import sys
from dataclasses import dataclass, field

import torch
from datasets import Dataset
from transformers import AutoTokenizer, HfArgumentParser

from rpg_ref.integrations.trl import RPGConfig, RPGTrainer


@dataclass
class ScriptArgs:
    model: str = field(default="Qwen/Qwen3-4B", metadata={"help": "HF model id or folder"})
    data: str | None = field(default=None, metadata={
        "help": "training problems: a jsonl with 'problem' and 'answer' (rpg_ref.math.data)"})
    overlong_buffer: int = field(default=512, metadata={
        "help": "DAPO's soft overlong punishment over the last N tokens (0: none)"})
    tiny: bool = field(default=False, metadata={"help": "random tiny Qwen3 on a toy task (CPU)"})


def toy_tokenizer():
    """One token per character of '0123456789+=', plus <pad> and <eos>."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    vocab = {"<pad>": 0, "<eos>": 1, **{c: i + 2 for i, c in enumerate("0123456789+=")}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def tiny_model(tokenizer, seed: int = 0):
    """A random Qwen3 of 2 layers, width 32, over the toy vocabulary."""
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(seed)
    return Qwen3ForCausalLM(Qwen3Config(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.eos_token_id, tie_word_embeddings=True))


def toy_data(n: int = 64, seed: int = 0) -> Dataset:
    rng = random.Random(seed)
    pairs = [(rng.randrange(10), rng.randrange(10)) for _ in range(n)]
    return Dataset.from_dict({"prompt": [f"{a}+{b}=" for a, b in pairs],
                              "answer": [str((a + b) % 10) for a, b in pairs]})


def toy_reward(completions, answer, **_):
    return [sum(ch == a for ch in c) / max(len(c), 1) for c, a in zip(completions, answer)]


def math_data(path: str) -> Dataset:
    """The paper's prompt (rpg_ref.math.reward.user_message) as a chat message."""
    from rpg_ref.math.data import load_problems
    from rpg_ref.math.reward import user_message
    problems = load_problems(path)
    return Dataset.from_dict({
        "prompt": [[{"role": "user", "content": user_message(p.problem)}] for p in problems],
        "answer": [p.answer for p in problems]})


def math_reward(completions, answer, **_):
    """+1 for a correct final "Answer:", -1 otherwise (the paper's scoring)."""
    from rpg_ref.math.reward import answers_match, extract_answer
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if answers_match(extract_answer(t), a) else -1.0 for t, a in zip(texts, answer)]


def main(argv=None):
    try:  # a bad option is one line, not a traceback
        script, args = HfArgumentParser((ScriptArgs, RPGConfig)).parse_args_into_dataclasses(argv)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    if script.tiny:
        tokenizer = toy_tokenizer()
        model, data, reward = tiny_model(tokenizer, args.seed), toy_data(seed=args.seed), toy_reward
    elif script.data is None:
        raise SystemExit("--data is required (a jsonl of problems with answers), or use --tiny")
    else:
        tokenizer = AutoTokenizer.from_pretrained(script.model)
        model, data, reward = script.model, math_data(script.data), [math_reward]
        if script.overlong_buffer:  # the paper's R_length, as TRL implements DAPO's
            from trl.rewards import get_soft_overlong_punishment

            reward.append(
                get_soft_overlong_punishment(args.max_completion_length, script.overlong_buffer)
            )
    try:
        trainer = RPGTrainer(model=model, reward_funcs=reward, args=args, train_dataset=data,
                             processing_class=tokenizer)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    before = [p.detach().clone() for p in trainer.model.parameters()]
    trainer.train()
    after = list(trainer.model.parameters())
    change = sum(float((a.detach() - b).pow(2).sum()) for a, b in zip(after, before)) ** 0.5
    checksum = sum(float(a.detach().double().sum()) for a in after)
    acc = trainer.accelerator
    report = json.dumps({"rank": acc.process_index, "num_processes": acc.num_processes,
                         "weight_change": change, "checksum": checksum})
    # one write per line: the processes share stdout, and print() may split a line in two writes
    sys.stdout.write(f"rank {acc.process_index} of {acc.num_processes} "
                     f"({acc.distributed_type.value}): {report}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
