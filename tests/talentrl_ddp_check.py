"""Run by tests/test_talentrl.py, once as a plain process and once under torchrun with 2 gloo ranks:
one TalentRL step (anchor, controls, ordinary rollouts from a scripted policy; Eq. 10-14) and one
grpo_update on 4 tasks; rank r owns tasks r, r+world, …; rank 0 saves the weights."""
import json
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import grpo  # noqa: E402
import plumbing  # noqa: E402
import talentrl as T  # noqa: E402
from plumbing import exit_ranks  # noqa: E402


class ScriptedPolicy:
    """Stands in for the policy's sampler: route k of a prompt is valid for k = 0, 2, … and
    invalid otherwise; an execution answers correctly exactly when talent guidance and skills
    are in its context (a question in `hard`: and an evolved skill, SKILL). Asked to evolve the
    SkillBank, it proposes one skill (SKILL) for the weak type, made of the first failed question (in
    lower case: no question's text), so that question retrieves it. Deterministic, so every rank and
    world size sees the same rollouts."""

    ROUTES = ["<think>Find the creator first.</think><talent>talent_bridge_entity</talent>",
              "<think>no idea</think><talent>talent_unknown</talent>"]

    SKILL = "Scripted skill"

    def __init__(self, tok, answers, anchor_invalid=False, hard=()):
        self.tok, self.answers, self.first, self.hard = tok, answers, int(anchor_invalid), set(hard)

    def generate(self, prompts, n, max_new_tokens, temperature, top_p=1.0, stop=None, json_schema=None):
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            if stop == ["</talent>"]:
                replies = [self.ROUTES[(self.first + k) % 2] for k in range(n)]
            elif "Propose at most" in text:  # talentrl.evolve_skillbank's prompt
                qtype, q = re.search(r"attempts on '(\w+)'.*?Question: ([^\n]*)", text, re.S).groups()
                replies = [json.dumps([dict(title=f"{self.SKILL} for {qtype}", principle=q.lower(),
                                            when_to_apply=f"{qtype} questions")])] * n
            else:
                q = next(q for q in self.answers if q in text)
                good = "Talent guidance" in text and "Relevant skills" in text
                good = good and (q not in self.hard or f"- {self.SKILL} for" in text)
                replies = [f"<answer>{self.answers[q] if good else 'nobody'}</answer>"] * n
            out.append([plumbing.Sample(self.tok.encode(r, add_special_tokens=False), r) for r in replies])
        return out


if __name__ == "__main__":
    model_dir, out = sys.argv[1:3]
    args = T.parse_with_preset(T.build_parser(), T.PRESETS, argv=[
        "--preset", "tiny", "--model", model_dir, "--G", "3", "--train-controls", "--no-autocast", "--micro-batch", "2",
        "--beta", "0.1", "--n-people", "12", "--n-places", "6", "--n-orgs", "4", "--n-events", "4", "--n-hamlets", "4",
        "--n-shared", "2", "--n-train", "8", "--eval-n", "1"])
    dist = plumbing.setup_distributed()
    W = T.World(args, T.load_embedder())
    model, tok = plumbing.load_policy(args, dist)
    ref = plumbing.load_model(model_dir, dist, trainable=False)[0]
    with torch.no_grad():  # a reference that differs from the policy, so the KL term has a gradient
        for q in ref.parameters():
            q.add_(0.05 * torch.randn(q.shape, generator=torch.Generator().manual_seed(q.numel())))
    tasks = W.questions["hotpotqa"]["train"][:4]
    sampler = ScriptedPolicy(tok, {t["question"]: t["answer"] for t in tasks})
    mine = tasks[dist.rank::dist.world]
    rollouts, st = T.talentrl_rollouts(sampler, tok, W, mine, args, first_group=dist.rank * len(tasks))
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    metrics = grpo.grpo_update(model, ref, opt, rollouts, args, dist)
    if dist.is_main:
        torch.save({"state": plumbing.unwrap(model).state_dict(), "metrics": metrics}, out)
    exit_ranks()  # not through interpreter shutdown: plumbing.exit_ranks says why
