# Tool for python_sandbox: recompute the arithmetic expression in the prompt with a
# small parser (eval is refused by the sandbox) and compare with each candidate's
# last number.
import re

def calc(s):
    toks = re.findall(r"\d+\.?\d*|[-+*/()]", s)
    pos = [0]
    def peek():
        return toks[pos[0]] if pos[0] < len(toks) else None
    def take():
        pos[0] += 1
        return toks[pos[0] - 1]
    def atom():
        t = take()
        if t == "(":
            v = expr()
            take()
            return v
        if t == "-":
            return -atom()
        return float(t)
    def term():
        v = atom()
        while peek() in ("*", "/"):
            v = v * atom() if take() == "*" else v / atom()
        return v
    def expr():
        v = term()
        while peek() in ("+", "-"):
            v = v + term() if take() == "+" else v - term()
        return v
    return expr()

parts = re.findall(r"[-+*/() 0-9.]{3,}", prompt)
value = None
if parts:
    try:
        value = round(calc(max(parts, key=len)), 6)
    except Exception:
        value = None
print("expected:", value)
right = []
for i, c in enumerate(candidates):
    nums = re.findall(r"-?\d+(?:\.\d+)?", c.replace(",", ""))
    final = nums[-1] if nums else None
    ok = final is not None and value is not None and abs(float(final) - value) < 1e-6
    print("ABCDEFGHIJ"[i], "final number:", final or "none", "- matches" if ok else "- differs")
    if ok:
        right.append("ABCDEFGHIJ"[i])
print("final number matches the expected value:", ", ".join(right) or "none")
