# Verifier helpers over the visible response text. Call them inside python_sandbox,
# e.g. print(word_count(response) <= 50, is_lower(response)).
import re

def word_count(t):
    return len(t.split())

def sentence_count(t):
    return len([s for s in re.split(r"[.!?]+", t) if s.strip()])

def bullet_count(t):
    return len([l for l in t.splitlines() if l.strip().startswith(("* ", "- "))])

def has_word(t, w):
    return re.search(r"\b" + re.escape(w.lower()) + r"\b", t.lower()) is not None

def is_lower(t):
    return t == t.lower()

def is_upper(t):
    return t == t.upper()

def starts_with(t, p):
    return t.strip().lower().startswith(p.lower())

def ends_with(t, p):
    return t.strip().lower().endswith(p.lower())

def has_comma(t):
    return "," in t
