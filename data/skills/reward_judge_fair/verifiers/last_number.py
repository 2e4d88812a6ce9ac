# Verifier: print the last number of each candidate (a candidate's final answer).
import re
for i, c in enumerate(candidates):
    nums = re.findall(r"-?\d+(?:\.\d+)?", c.replace(",", ""))
    print("candidate", "ABCD"[i], "final number:", nums[-1] if nums else "none")
