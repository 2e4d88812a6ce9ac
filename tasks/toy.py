"""The world of grpo.py's hello-world: short additions with an integer answer, their 0/1 reward, the prompts
of one training step, and the greedy held-out evaluation with its chance line (the best constant answer).

    prompts, answers = toy_batch(tok, step, args, dist)  # this rank's chat prompts of a step, their answers
    toy_reward(text, answer)                             # 1.0 if the reply's last integer is the answer
    items, chance = toy_eval(sampler, tok, args, n)      # greedy 0/1 per held-out problem, best constant
"""
import random
import re

from grpo import chat_ids
from plumbing import per_rank

SYSTEM = "You are a helpful assistant."


def toy_problem(rng):
    """Small addition, within reach of a 135M model about half of the time at T = 0.7."""
    a, b = rng.randint(1, 19), rng.randint(1, 9)
    return f"What is {a} + {b}?", a + b


def toy_reward(text, answer):
    """1 if the last integer in the reply is the answer, else 0 (a reply with no number is 0)."""
    nums = re.findall(r"-?\d+", text.replace(",", ""))
    try:
        return 1.0 if nums and int(nums[-1]) == answer else 0.0
    except ValueError:  # a number past int()'s 4,300 digits is not the answer (hostile output)
        return 0.0


def toy_batch(tok, step, args, dist):
    """This rank's prompts for a step: seeded by (seed, step, rank) so a resumed run sees the same data."""
    rng = random.Random(args.seed * 1_000_003 + step * 1009 + dist.rank)
    probs = [toy_problem(rng) for _ in range(per_rank(args.prompts_per_step, dist, "--prompts-per-step"))]
    return ([chat_ids(tok, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
             for q, _ in probs],
            [a for _, a in probs])


def toy_eval(sampler, tok, args, n=64):
    """Greedy correctness (0/1) on n held-out problems (a seed no training step uses), and the chance line:
    the accuracy of the best constant answer (the most frequent held-out answer, always given)."""
    rng = random.Random(-1 - args.seed)
    probs = [toy_problem(rng) for _ in range(n)]
    prompts = [chat_ids(tok, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
               for q, _ in probs]
    outs = sampler.generate(prompts, 1, args.max_new_tokens, 0.0)
    answers = [a for _, a in probs]
    return ([float(toy_reward(o[0].text, a) == 1.0) for o, a in zip(outs, answers)],
            max(map(answers.count, answers)) / n)
