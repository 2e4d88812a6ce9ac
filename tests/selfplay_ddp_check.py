"""Run by tests/test_skill_selfplay.py, as a plain process and under torchrun with 2 gloo ranks:
    selfplay_ddp_check.py SKILL_SELFPLAY_FLAGS...   skill_selfplay.main(FLAGS) (tool family), with scripted samplers
The proposer's and the solver's samplers are scripted (ScriptedPlayer; tests/crash_check.py scripts the proposer
only): the random tiny model writes no valid tool task and solves none, so without them no proposal passes
Eq. 4 and D(t) stays empty. Everything else is the real
loop on the tiny model: gates, probes, the gathered batch, both GRPO updates, library evolution with the real
controller, the sharded BFCL evaluation, checkpoints and --resume. Replies depend only on the prompt and the
sample's index, so every world size sees the same batch."""
import json
import os
import random
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import plumbing  # noqa: E402
import skill_selfplay as S  # noqa: E402
from plumbing import exit_ranks  # noqa: E402

# the exploration stream's task: a scripted tool task (disjoint from S(0) and BFCL)
EXPLORE = S.scripted_tool_tasks(random.Random(0), 1)[0]


class ScriptedPlayer:
    """Sample k of a prompt. Proposer: even k writes a package's worked example (skill stream; the package named
    in the prompt) or EXPLORE (exploration stream; zebra: S(0)'s first example), after the prefilled opening;
    odd k an unparseable reply (reward −1). Solver: even k answers a known task's reference call, odd k "No." (so K = 2 probes give
    v_solve = ½ with a unique majority equal to the reference: valid, in the band; GRPO groups of rewards 1, 0)."""

    def __init__(self, tok, role, pkgs, args):
        self.tok, self.role, self.pkgs = tok, role, pkgs
        # the opening that main prefills before the reply (proposal_decoding, answer_prefix): not part of it
        self.prefix = S.proposal_decoding(args, self)[0] if role == "proposer" else S.answer_prefix(args)[0]
        self.explore = EXPLORE if args.family == "tool" else pkgs[0]["example"]  # a zebra example is unique on its own
        self.calls = {t["dialogue"][0]["content"]: t["call"] for t in [p["example"] for p in pkgs] + [EXPLORE]
                      } if args.family == "tool" else {}

    def sync(self, model):
        pass

    def reply(self, text, k):
        if self.role == "proposer":
            if k % 2:
                return "I cannot write a task."
            pkg = next((p for p in self.pkgs if f"Follow this skill: {p['title']}:" in text), None)
            return json.dumps(pkg["example"] if pkg else self.explore)[len(self.prefix):]
        call = next((c for d, c in self.calls.items() if d in text), None)
        if call is None or k % 2:
            return "No."
        return ("<tool_call>" + json.dumps(call) + "</tool_call>")[len(self.prefix):]

    def generate(self, prompts, n, max_new_tokens, temperature, top_p=1.0, stop=None, json_schema=None):
        out = []
        for p in prompts:
            text = self.tok.decode(p)
            replies = [self.reply(text, k) for k in range(n)]
            out.append([plumbing.Sample(self.tok.encode(r, add_special_tokens=False), r) for r in replies])
        return out


def script_players(argv, roles=("proposer", "solver")):
    """Make skill_selfplay.main's samplers of these roles ScriptedPlayers (main makes the proposer's first, then
    the solver's); the others stay what --sampler makes."""
    args = S.parse_args(argv)
    lib_dir = args.library or os.path.join(os.path.dirname(os.path.abspath(S.__file__)), "data", "selfplay", args.family)
    pkgs, _ = S.load_library(lib_dir, args.family)  # S(0), as main loads it
    real, made = S.make_sampler, []

    def make(args, model, tok, dist, max_model_len=None):
        role = ("proposer", "solver", "other")[min(len(made), 2)]
        made.append(ScriptedPlayer(tok, role, pkgs, args) if role in roles else real(args, model, tok, dist, max_model_len))
        return made[-1]
    S.make_sampler = make


if __name__ == "__main__":
    script_players(sys.argv[1:])
    S.main(sys.argv[1:])
    exit_ranks()  # not through interpreter shutdown: plumbing.exit_ranks says why
