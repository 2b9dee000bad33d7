#!/usr/bin/env bash
# RPG-REINFORCE-URKL on Qwen3-4B with verl (>= 0.5; written against verl 0.9.1), 8 GPUs on one node.
# The paper's settings (app:detailed_exp_setup_choices): AdamW lr 1e-6, weight decay 0.1, grad clip 1.0,
# 10 warm-up steps then constant, 400 steps, 512 prompts x 16 responses at temperature 1.0,
# per-GPU mini-batch 32 (512 x 16 / (32 x 16) = 16 optimizer steps per rollout batch), beta = 1e-4,
# (eps_low, eps_high) = (0.2, 0.28); dual-clip c = 10 as in the paper's released scripts; DAPO's
# overlong punishment with a 512-token buffer; advantage R - group mean (GRPO estimator, no std).
#
# Iterative reference (pi_ref = pi_old): verl's own KL loss and reference model are OFF; the KL to
# pi_old is inside the rpg loss (its coefficient is read from actor.kl_loss_coef).
#
# Data: DAPO-Math-17k and AIME-2024 as verl parquet files (prompt = chat messages with the paper's
# "Answer: $Answer" instruction, data_source "math_dapo", reward_model.ground_truth), e.g. the files
# of verl's DAPO recipe. Set TRAIN_FILE / VAL_FILE below. Response length: 2K (set MAX_RESPONSE to
# 4096 or 8192 for the paper's 4K / 8K runs).
set -euo pipefail

MODEL=${MODEL:-Qwen/Qwen3-4B}
TRAIN_FILE=${TRAIN_FILE:-$HOME/data/dapo-math-17k.parquet}
VAL_FILE=${VAL_FILE:-$HOME/data/aime-2024.parquet}
MAX_PROMPT=${MAX_PROMPT:-1024}
MAX_RESPONSE=${MAX_RESPONSE:-2048}
OVERLONG_BUFFER=512

export VERL_USE_EXTERNAL_MODULES=rpg_ref.integrations.verl   # registers the rpg losses in every worker

python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    algorithm.norm_adv_by_std_in_grpo=False \
    algorithm.use_kl_in_reward=False \
    data.train_files="$TRAIN_FILE" \
    data.val_files="$VAL_FILE" \
    data.train_batch_size=512 \
    data.max_prompt_length=$MAX_PROMPT \
    data.max_response_length=$MAX_RESPONSE \
    data.filter_overlong_prompts=True \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.policy_loss.loss_mode=rpg-reinforce-urkl \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.actor.kl_loss_coef=1e-4 \
    actor_rollout_ref.actor.clip_ratio_low=0.2 \
    actor_rollout_ref.actor.clip_ratio_high=0.28 \
    actor_rollout_ref.actor.clip_ratio_c=10.0 \
    actor_rollout_ref.actor.loss_agg_mode=token-mean \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.optim.weight_decay=0.1 \
    actor_rollout_ref.actor.optim.lr_warmup_steps=10 \
    actor_rollout_ref.actor.grad_clip=1.0 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.use_dynamic_bsz=True \
    actor_rollout_ref.actor.ppo_max_token_len_per_gpu=$(( (MAX_PROMPT + MAX_RESPONSE) * 4 )) \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=16 \
    actor_rollout_ref.rollout.temperature=1.0 \
    actor_rollout_ref.rollout.top_p=1.0 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True \
    actor_rollout_ref.rollout.val_kwargs.n=32 \
    actor_rollout_ref.rollout.val_kwargs.do_sample=True \
    actor_rollout_ref.rollout.val_kwargs.temperature=1.0 \
    reward.reward_manager.name=dapo \
    +reward.reward_kwargs.max_resp_len=$MAX_RESPONSE \
    +reward.reward_kwargs.overlong_buffer_cfg.enable=True \
    +reward.reward_kwargs.overlong_buffer_cfg.len=$OVERLONG_BUFFER \
    +reward.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0 \
    +reward.reward_kwargs.overlong_buffer_cfg.log=False \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.total_training_steps=400 \
    trainer.test_freq=10 \
    trainer.save_freq=50 \
    trainer.project_name=rpg-ref \
    trainer.experiment_name=qwen3-4b-rpg-reinforce-urkl-${MAX_RESPONSE} \
    trainer.logger='["console"]' \
    "$@"
