"""Run by tests/test_gpu.py, once as a plain process and once under torchrun with 2 gloo ranks: skill_rm.py's
judging dealt over the ranks (judge_on_ranks, eval_if_policy) returns what one process computes, and one
instruction-following GRPO step (train_if_policy, rank r takes prompts r, r+world, …) moves the weights as one
process does. Scripted policy and judge: deterministic whatever the rank or batch. Rank 0 writes OUT."""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import plumbing  # noqa: E402
import skill_rm as S  # noqa: E402
from plumbing import exit_ranks  # noqa: E402


class ScriptedPolicy:
    """Completion k of any prompt is 'answer-k' (the policy's side)."""

    def __init__(self, tok):
        self.tok = tok

    def generate(self, prompts, n, max_new_tokens, temperature, top_p=1.0, stop=None, json_schema=None):
        return [[plumbing.Sample(self.tok.encode(f"answer-{k}", add_special_tokens=False), f"answer-{k}") for k in range(n)]
                for _ in prompts]

    def sync(self, model):
        pass


class ScriptedJudge(ScriptedPolicy):
    """A one-turn pointwise final answer whose score is read off the candidate it was shown ('answer-k' → k / 4)."""

    def generate(self, prompts, n, max_new_tokens, temperature, top_p=1.0, stop=None, json_schema=None):
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            k = next((k for k in range(9, -1, -1) if f"answer-{k}" in text), 0)
            reply = json.dumps({"name": "final_answer", "arguments": {"score": round(k / 4, 2)}})
            out.append([plumbing.Sample([1], reply) for _ in range(n)])
        return out


model_dir, out = sys.argv[1:3]
args = S.parse_with_preset(S.build_parser(), S.PRESETS, argv=[
    "--preset", "tiny", "--model", model_dir, "--precision", "fp32", "--dtype", "float32",  # frozen π_ref too: auto follows the CPU
    "--G", "3", "--steps", "1", "--prompts-per-step", "4", "--micro-batch", "2", "--beta", "0.1", "--run-dir", out + ".run"])
dist = plumbing.setup_distributed()
skills = S.load_skills(args.skills_dir)
policy, tok = plumbing.load_policy(args, dist)
judge, pol = ScriptedJudge(tok), ScriptedPolicy(tok)
# the benchmark's judging, dealt over the ranks: 7 tasks (uneven), gathered back in order
tasks = [S.JudgeTask(f"prompt {i}", [f"answer-{i % 4}"], "pointwise", "skill_rm") for i in range(7)]
judged = [(t.prompt, t.judgment, t.turns) for t in S.judge_on_ranks(judge, tok, tasks, skills, args, 2, dist)]
test_set = S.if_prompts(args.seed, 5, "test")
evaluated = S.eval_if_policy(pol, tok, test_set, args, dist)
# one GRPO step with the Skill-RM pointwise reward
train_set = S.if_prompts(args.seed, 4, "train")
S.make_optimizer = lambda model, args, lr=None: torch.optim.SGD(model.parameters(), lr=0.5)  # a big, linear step
run_dir, train = S.train_if_policy("skill_rm", policy, pol, S.Judge(judge, tok, skills), args, dist,
                                   {t["prompt"]: "ref" for t in train_set}, train_set)
state = plumbing.full_state_dict(policy)
if dist.is_main:
    torch.save({"state": state, "judged": judged, "eval": evaluated, "train": train,
                "metrics_lines": len((run_dir / "metrics.jsonl").read_text().splitlines())}, out)
exit_ranks()  # not through interpreter shutdown: plumbing.exit_ranks says why
