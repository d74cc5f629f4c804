"""A search tool over a local corpus (``task.name=env task.env=search``): answer a question that
needs a lookup.

The corpus is generated (``corpus(seed, size)``): a few thousand short pages about made-up towns,
each with its population, founding year, river and mayor, so no model knows an answer without
looking it up. A question asks for one fact of one town. In a turn the model either searches (a
message with ``search: words``, or a Hermes/Qwen ``<tool_call>`` of the ``search`` tool) and gets
the best-matching page back as a tool message, or answers (any other message), which ends the
episode: reward 1 when the answer contains the fact, else 0.

The opening shows one worked episode first (a town of another corpus: its question, the search,
the page, the answer; ``example=False`` leaves it out). Measured on the embedded 135M model (64
held-out questions, 3 turns, 16 tokens a turn): with it, greedy success 0.16 and sampled 0.11 at
temperature 0.7 (it searches in 97% of greedy episodes, then often answers the population whatever
was asked: what training has to fix); without it 0.00 (it never searched), also when the question
told it to search first.

Ranking is Okapi BM25 (Robertson and Zaragoza 2009; k1 = 1.5, b = 0.75, the usual defaults) over
lower-cased word tokens, written here in ~30 lines rather than taken from a package: the index of a
few thousand pages builds in a fraction of a second once per worker process (module level, keyed by
the corpus seed), and the worker imports nothing else (tests/envs/test_search.py checks the
scores by hand).
"""

from __future__ import annotations

import functools
import json
import math
import random
import re
from collections import Counter

WORD = re.compile(r"[a-z0-9]+")
SEARCH = re.compile(r"search\s*:\s*(.+)", re.I | re.S)
SYLLABLES = ("bar", "ven", "dor", "kel", "mar", "ost", "lin", "gra", "tho", "vel", "sun", "ria", "mok", "pel", "zan",
             "fir", "hal", "dun", "bre", "cor")
FIRST = ("Ilse", "Tomas", "Nadia", "Oskar", "Lena", "Piet", "Runa", "Emil", "Sara", "Jonas", "Mira", "Aksel")
FACTS = {  # the question and the page's sentence for each fact a town has
    "population": ("What is the population of {town}?", "{town} has a population of {value}."),
    "founded": ("In which year was {town} founded?", "{town} was founded in {value}."),
    "river": ("Which river flows through {town}?", "The river {value} flows through {town}."),
    "mayor": ("Who is the mayor of {town}?", "The mayor of {town} is {value}."),
}


def tokens(text: str) -> list[str]:
    return WORD.findall(text.lower())


class BM25:
    """Okapi BM25: score(q, d) = sum over query terms t of idf(t) * f(t, d) (k1 + 1) /
    (f(t, d) + k1 (1 - b + b |d| / avgdl)), idf(t) = ln((N - n(t) + 0.5) / (n(t) + 0.5) + 1)."""

    def __init__(self, docs: list[str], k1: float = 1.5, b: float = 0.75):
        self.docs, self.k1, self.b = docs, k1, b
        self.freqs = [Counter(tokens(d)) for d in docs]
        self.lengths = [sum(f.values()) for f in self.freqs]
        self.avgdl = sum(self.lengths) / max(1, len(docs))
        df = Counter(t for f in self.freqs for t in f)
        self.idf = {t: math.log((len(docs) - n + 0.5) / (n + 0.5) + 1) for t, n in df.items()}
        self.postings: dict[str, list[int]] = {}
        for i, f in enumerate(self.freqs):
            for t in f:
                self.postings.setdefault(t, []).append(i)

    def scores(self, query: str) -> dict[int, float]:
        """Each page that shares a term with the query, and its score."""
        out: dict[int, float] = {}
        for t in set(tokens(query)):
            for i in self.postings.get(t, ()):
                f, norm = self.freqs[i][t], 1 - self.b + self.b * self.lengths[i] / self.avgdl
                out[i] = out.get(i, 0.0) + self.idf[t] * f * (self.k1 + 1) / (f + self.k1 * norm)
        return out

    def top(self, query: str, k: int = 1) -> list[str]:
        ranked = sorted(self.scores(query).items(), key=lambda kv: (-kv[1], kv[0]))
        return [self.docs[i] for i, _ in ranked[:k]]


def corpus(seed: int, size: int) -> list[dict]:
    """``size`` towns with distinct names and their facts, the same for the same seed."""
    rng, names, towns = random.Random(seed), set(), []
    while len(towns) < size:
        name = "".join(rng.choice(SYLLABLES) for _ in range(rng.choice((2, 3)))).capitalize()
        if name in names:
            continue
        names.add(name)
        river = "".join(rng.choice(SYLLABLES) for _ in range(2)).capitalize() + "wyn"  # never a town's name
        population, founded = str(rng.randint(1000, 99999)), str(rng.randint(1100, 1950))
        mayor = f"{rng.choice(FIRST)} {rng.choice(SYLLABLES).capitalize()}{rng.choice(SYLLABLES)}"
        towns.append({"town": name, "population": population, "founded": founded, "river": river, "mayor": mayor})
    return towns


def page(town: dict) -> str:
    return " ".join(sentence.format(town=town["town"], value=town[fact]) for fact, (_, sentence) in FACTS.items())


@functools.lru_cache(maxsize=4)
def index(seed: int, size: int) -> BM25:
    """The corpus's index, built once per worker process (environment objects travel between calls; this does not)."""
    return BM25([page(t) for t in corpus(seed, size)])


class Search:
    """One question per row; the search tool over the generated corpus."""

    tools = [{"type": "function", "function": {
        "name": "search", "description": "Search the library; returns the best-matching page.",
        "parameters": {"type": "object",
                       "properties": {"query": {"type": "string", "description": "words to look for"}},
                       "required": ["query"]}}}]

    def __init__(self, corpus_seed: int = 0, corpus_size: int = 2000, facts: str = "population,founded,river,mayor",
                 example: bool = True):
        self.corpus_seed, self.corpus_size = corpus_seed, corpus_size
        self.facts, self.example = facts.split(","), example
        self.answer = ""

    def rows(self, split: str, n: int, seed: int) -> list[dict]:
        """Questions about towns of disjoint halves of the corpus: held-out towns are never trained on."""
        towns = corpus(self.corpus_seed, self.corpus_size)
        half = towns[: len(towns) // 2] if split == "train" else towns[len(towns) // 2:]
        rng = random.Random(f"{seed}:{split}")
        rows = []
        for _ in range(n):
            town, fact = rng.choice(half), rng.choice(self.facts)
            rows.append({"question": FACTS[fact][0].format(town=town["town"]), "answer": town[fact], "fact": fact,
                         "town": town["town"]})
        return rows

    def reset(self, row: dict) -> list[dict]:
        """The rules, one worked episode (a town of another corpus: search, page, answer), then the question."""
        self.answer = row["answer"]
        shown = corpus(self.corpus_seed + 1, 1)[0]
        example = [{"role": "user", "content": FACTS["population"][0].format(town=shown["town"])},
                   {"role": "assistant", "content": f"search: {shown['town']}"},
                   {"role": "user", "content": page(shown)},
                   {"role": "assistant", "content": shown["population"]}] if self.example else []
        return [{"role": "system", "content": "Answer the question. You can search the town library: write search: and "
                                               "the words to look for."}, *example,
                {"role": "user", "content": row["question"]}]

    def step(self, message: dict) -> tuple[list[dict], float, bool, dict]:
        query = self.query(message)
        if query is None:  # an answer
            right = self.answer.lower() in message["content"].lower()
            return [], float(right), True, {"correct": right}
        found = index(self.corpus_seed, self.corpus_size).top(query)
        result = found[0] if found else "No page matches."
        return [{"role": "tool", "name": "search", "content": result}], 0.0, False, {"tool_calls": 1}

    @staticmethod
    def query(message: dict) -> str | None:
        """The search words of a message, or None when it is an answer."""
        for call in message.get("tool_calls", []):
            if call["function"]["name"] == "search":
                try:
                    return str(json.loads(call["function"]["arguments"]).get("query", ""))
                except (json.JSONDecodeError, AttributeError):
                    return ""
        found = SEARCH.search(message["content"])
        return found.group(1).strip() if found else None
