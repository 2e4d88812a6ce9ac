# Verifier over the visible text. Run alone (run_verifier {"id": "text_checks"}) it finds the
# checkable constraints stated in the prompt and reports, per candidate, which ones pass and the
# checklist score = passed / found, to the nearest eighth (grid_score). With extra code, call its
# helpers on `response`, e.g. print(word_count(response) <= 50, is_lower(response)).
import re

def words(t):
    return re.findall(r"[A-Za-z0-9']+", t)

def word_count(t):
    return len(words(t))

def sentence_count(t):
    return len([s for s in re.split(r"[.!?]+", t) if s.strip()])

def bullet_count(t):
    return len([l for l in t.splitlines() if re.match(r"^\s*\*\s", l)])

def has_word(t, w):
    return re.search(r"\b" + re.escape(w.lower()) + r"\b", t.lower()) is not None

def is_lower(t):
    return t == t.lower() and any(c.isalpha() for c in t)

def is_upper(t):
    return t == t.upper() and any(c.isalpha() for c in t)

def starts_with(t, p):
    w = words(t)
    return bool(w) and w[0].lower() == p.lower()

def ends_with(t, p):
    return t.strip().lower().endswith(p.lower())

def has_comma(t):
    return "," in t

def grid_score(passed, found):
    # passed / found to the nearest eighth, the final answer's score as its grammar writes it (no constraints: 1)
    return [0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875, 1][min(max(round(8 * passed / found), 0), 8)] if found > 0 else 1

# (pattern of the constraint in the prompt, short name, check of the stripped response)
CHECKS = [
    (r"must be in lowercase", "lowercase", lambda r, m: is_lower(r)),
    (r"must be in English capital letters", "uppercase", lambda r, m: is_upper(r)),
    (r"at most (\d+) words", "at most N words", lambda r, m: word_count(r) <= int(m.group(1))),
    (r"at least (\d+) words", "at least N words", lambda r, m: word_count(r) >= int(m.group(1))),
    (r"exactly (\d+) bullet points", "bullet points", lambda r, m: bullet_count(r) == int(m.group(1))),
    (r'Include the word "([^"]+)"', "include word", lambda r, m: has_word(r, m.group(1))),
    (r'Do not use the word "([^"]+)"', "exclude word", lambda r, m: not has_word(r, m.group(1))),
    (r'End your response with the exact phrase "([^"]+)"', "end phrase", lambda r, m: ends_with(r, m.group(1))),
    (r"Wrap your entire response in double quotation marks", "quotes", lambda r, m: len(r) > 1 and r[0] == '"' and r[-1] == '"'),
    (r'Start your response with the word "([^"]+)"', "start word", lambda r, m: starts_with(r, m.group(1))),
    (r"Do not use any commas", "no commas", lambda r, m: not has_comma(r)),
]


def report(prompt, candidates):
    found = [(name, m, check) for pat, name, check in CHECKS for m in [re.search(pat, prompt)] if m]
    print("constraints found:", ", ".join(name for name, m, check in found) or "none")
    scores = []
    for i, c in enumerate(candidates):
        ok = [check(c.strip(), m) for name, m, check in found]
        scores.append(sum(ok) / len(ok) if ok else 1.0)
        fails = [name for (name, m, check), o in zip(found, ok) if not o]
        print("ABCDEFGHIJ"[i] + ":", sum(ok), "of", len(ok), "pass; score", grid_score(sum(ok), len(ok)),
              "; fails:", ", ".join(fails) or "none")
    if len(candidates) > 1:  # a tie is a tie: never resolved towards the first position
        best = [lab for lab, sc in zip("ABCDEFGHIJ", scores) if sc == max(scores)]
        print("most constraints pass:", best[0] if len(best) == 1 else "tie (" + ", ".join(best) + ")")


report(prompt, candidates)
