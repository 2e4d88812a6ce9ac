"""torchrun --nproc_per_node=2 tests/shards_check.py OUT (or plain python: one process): the work the paper
scripts deal over the ranks, with scripted generators that record which prompts this rank generated:
    stage     skill_entropy's rank-0 stages: plumbing.on_rank0 with dealt_generate calls of 5, 1 and 0
              prompts, and a skipped stage; then the SFT teacher's call every rank makes (on_ranks), and
              a rank's own call outside a stage (a reward: its own prompts, no collective)
    evolve    talentrl.evolve_skillbank: one proposal per weak question type, over every rank's outcomes
    refine    skill_selfplay.refine_packages through a DealtSampler (the controller π_control)
Each rank writes {case: (prompts it generated, what it got back)} to OUT.<rank>."""
import argparse
import json
import os
import sys
import types

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import plumbing  # noqa: E402
import skill_selfplay  # noqa: E402
import talentrl  # noqa: E402

out = sys.argv[1]
dist = plumbing.setup_distributed()
seen = {}


def scripted(case, reply):
    """A generate function (messages, max_new_tokens, temperature) that records its prompts under `case`."""
    def gen(messages, max_new_tokens, temperature=0.0):
        seen.setdefault(case, []).extend(messages)
        return [reply(m) for m in messages]
    return gen


class ScriptedSampler:
    """A sampler (generate(prompts, n, ...) → [[Sample]]) that records the decoded prompts under `case`."""

    def __init__(self, case, tok, reply):
        self.case, self.tok, self.reply = case, tok, reply

    def generate(self, prompts, n, max_new_tokens, temperature, top_p=1.0, stop=None, json_schema=None):
        texts = [self.tok.decode(p) for p in prompts]
        seen.setdefault(self.case, []).extend(texts)
        return [[plumbing.Sample([1], self.reply(t))] for t in texts]


got = {}
# stage: the generators of two frozen models; rank 0 runs the stage, the others serve its calls
live, gens = {}, {"a": scripted("stage", lambda m: f"a:{m}"), "b": scripted("stage", lambda m: f"b:{m}"),
                  "teacher": scripted("teacher", lambda m: f"t:{m}"),
                  "own": scripted("own", lambda m: f"o:{m}")}
gen_a, gen_b = (plumbing.dealt_generate(n, gens.get, dist, live) for n in "ab")


def stage():
    return [gen_a([f"q{i}" for i in range(5)], 8), gen_b(["only"], 8), gen_a([], 8)]


got["stage"] = plumbing.on_rank0(stage, gens.get, dist, live)
teacher = plumbing.dealt_generate("teacher", gens.get, dist, live)
got["teacher"] = plumbing.on_ranks(lambda share: teacher(share, 8), [f"s{i}" for i in range(7)], dist)
got["own"] = plumbing.dealt_generate("own", gens.get, dist, live)([f"r{dist.rank}"], 8)
got["skipped"] = plumbing.on_rank0(lambda: gen_a(["never"], 8), gens.get, dist, live, skip=True)

# evolve: three weak question types of four (every rank holds every rank's outcomes, as evaluate gathers them)
from transformers import AutoTokenizer  # noqa: E402
tok = AutoTokenizer.from_pretrained(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                                 "gpu", "tokenizer"))
outcomes = [dict(qtype=q, em=int(q == "easy"), question=f"{q} question {i}", answer="x", pred="y", n_search=1,
                 talent="talent_a") for q in ("easy", "hard", "harder", "hardest") for i in range(2)]


def propose(text):
    qtype = text.split("attempts on '")[1].split("'")[0]
    return json.dumps([{"title": f"skill for {qtype}", "principle": f"look up {qtype} facts"}])


W = types.SimpleNamespace(bank=[{"skill_id": "s1"}], bank_raw={}, by_id={"talent_a": {"skills": []}})
W.set_bank = lambda bank, raw: setattr(W, "bank", bank)
args = argparse.Namespace(evolve_threshold=0.4, evolve_failures=10, evolve_max_new=3, evolve_max_tokens=64)
n_new = talentrl.evolve_skillbank(ScriptedSampler("evolve", tok, propose), tok, W, outcomes, args, dist)
got["evolve"] = (n_new, [(s["skill_id"], s["category"], s["title"]) for s in W.bank[1:]], W.by_id)

# refine: the five packages with failed attempts (refine_max 5 of 6), their hints rewritten by the controller
pkgs = [dict(name=f"p{i}", title=f"title {i}", description="d", rules="r", hints="old") for i in range(6)]
stats = {p["name"]: dict(failed_t=["no call"] * (i + 1)) for i, p in enumerate(pkgs)}
sargs = argparse.Namespace(family="tool", refine_max=5, controller_max_new_tokens=32)
better = ScriptedSampler("refine", tok, lambda text: f"Hints: better {text.split('Title: ')[1][:7]}")
controller = plumbing.DealtSampler(better, dist)
log = skill_selfplay.refine_packages(pkgs, stats, controller, tok, sargs, 0)
got["refine"] = ([p["hints"] for p in pkgs], [x["skill"] for x in log])
torch.save({"seen": seen, "got": got}, f"{out}.{dist.rank}")
plumbing.exit_ranks()
