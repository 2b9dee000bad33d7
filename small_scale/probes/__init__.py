"""End-to-end measurements that back a claim of docs/rollout_correction.md."""
