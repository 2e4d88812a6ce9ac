"""torchrun --nproc_per_node=2 tests/objects_check.py OUT: each rank writes what plumbing.gather_objects and
plumbing.broadcast_object gave it (tests/test_grpo.py::test_gather_and_broadcast_objects_two_gloo_ranks)."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import plumbing  # noqa: E402
from plumbing import exit_ranks  # noqa: E402

dist = plumbing.setup_distributed()
got = {"gather": plumbing.gather_objects([{"rank": dist.rank, "k": k} for k in range(dist.rank + 1)], dist),
       "broadcast": plumbing.broadcast_object(("from", dist.rank, [dist.rank] * 3), dist)}
with open(f"{sys.argv[1]}.{dist.rank}", "w") as f:
    json.dump(got, f)
exit_ranks()  # not through interpreter shutdown: plumbing.exit_ranks says why
