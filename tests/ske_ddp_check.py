"""Run by tests/test_gpu.py, once as a plain process and once under torchrun with 2 gloo ranks:
    step MODEL OUT    one run_grpo step of skill_entropy.py (Eq. 5 rewards of scripted completions) on 4 fixed
                      tasks, split over the ranks by run_grpo itself; rank 0's checkpoint and metrics land
                      in OUT
    stages ARGS...    skill_entropy.main(ARGS): with 2 ranks and --sampler vllm the rank-0-only stages must
                      finish
                      (frozen models use HF generate under torchrun, never a collective vLLM engine set-up)"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import plumbing  # noqa: E402
import skill_entropy as se  # noqa: E402
import tasks.skill_bank as sb  # noqa: E402
from plumbing import exit_ranks  # noqa: E402


class ScriptedPolicy:
    """Stands in for the rollout engine: completion k of a task is its gold trace for even k, a malformed
    reply for odd k (r_ans 1 vs 0), whatever the rank or batch."""

    def __init__(self, tok, tasks):
        self.tok, self.tasks = tok, tasks

    def generate(self, prompts, n, max_new_tokens, temperature, top_p=1.0, stop=None, json_schema=None):
        out = []
        for p in prompts:
            task = next(t for t in self.tasks if t["scenario"] in self.tok.decode(p))
            texts = [se.gold_trace(task) if k % 2 == 0 else "no idea" for k in range(n)]
            out.append([plumbing.Sample(self.tok.encode(t, add_special_tokens=False), t) for t in texts])
        return out

    def sync(self, model):
        pass


mode, rest = sys.argv[1], sys.argv[2:]
if mode == "stages":
    se.main(rest)
    exit_ranks()  # not through interpreter shutdown: plumbing.exit_ranks says why
    raise SystemExit
model_dir, out = rest
args = se.parse_with_preset(se.build_parser(), se.PRESETS, argv=[
    "--preset", "tiny", "--model", model_dir, "--precision", "fp32", "--steps", "1",
    "--prompts-per-step", "4",
    "--G", "3", "--micro-batch", "2", "--beta", "0.1", "--save-every", "100"])
dist = plumbing.setup_distributed()
bank = sb.load_bank(sb.DATA / "bank.json", 1, "math,logic")
(a, b) = sb.bank_keys(bank)[:2]
tasks = [sb.make_task([sb.make_seed(bank, *a, i), sb.make_seed(bank, *b, i)], f"Scenario number {i}.",
                      [sb.make_seed(bank, *a, i)["question"], sb.make_seed(bank, *b, i)["question"]])
         | {"skills": [list(a), list(b)]} for i in range(4)]
table = {"pairwise": {(x, y): 1.0 + 0.1 * k for k, (x, y) in enumerate([(a, b), (b, a), (a, a), (b, b)])}}
keys = sb.bank_keys(bank)
key_text = [sb.key_text(*k) for k in keys]
embed = lambda texts: np.array([np.eye(len(keys))[key_text.index(t)] if t in key_text else np.zeros(len(keys))
                                for t in texts])
fz = plumbing.Frozen(None, None, embed, keys, embed(key_text), {})
reward_fn = se.make_reward_fn(bank, table, [1.0, 1.1], fz, args, (0.7, 0.3))
# a big, linear step
se.make_optimizer = lambda model, args, lr=None: torch.optim.SGD(model.parameters(), lr=0.5)
tok = plumbing.load_model(model_dir, dist)[1]
samplers = {"<policy rollouts>": ScriptedPolicy(tok, tasks)}
row = se.Row(tasks, out + ".none", out, {"row": "check"}, 0, 0.7)
policy, _ = se.run_grpo(args, dist, row, reward_fn, list(bank), samplers)
state = plumbing.full_state_dict(policy)
if dist.is_main:
    torch.save({"state": state}, os.path.join(out, "state.pt"))
exit_ranks()  # not through interpreter shutdown: plumbing.exit_ranks says why
