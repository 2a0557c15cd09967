"""Independent solvers: recompute each task's answer from the question and the context text alone.

They share no code with the generators: each reads the text the way a careful person would (regular
expressions over the documents), so a generator bug that writes a wrong answer, drops a needle or
plants an ambiguous one makes them disagree.
"""

from __future__ import annotations

import re
from collections import Counter


def _keys(question: str) -> list[str]:
    listed = re.search(r"numbers? for (.+?) mentioned", question).group(1)
    return re.split(r", | and ", listed)


def niah(question: str, context: str) -> list[str]:
    values = []
    for key in _keys(question):
        found = re.findall(rf"special magic numbers? for {re.escape(key)} is: (\d+)", context)
        assert found, f"no needle for {key}"
        values += found
    return values


def _mentions(key: str, text: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(key)}(?![\w-])", text) is not None


def niah_twohop(question: str, context: str) -> list[str]:
    """Any wording: the question names one hyphenated key; its only sentence names a second key; that key's
    other sentence ends with the number (filler has no hyphenated words and no digits)."""
    (key,) = re.findall(r"[a-z]+-[a-z]+", question)
    sentences = re.split(r"(?<=\.)\s+", context)
    (link,) = [s for s in sentences if _mentions(key, s)]
    assert not re.search(r"\d", link), "the asked key's sentence must be a link, not a number"
    (other,) = [k for k in re.findall(r"[a-z]+-[a-z]+", link) if k != key]
    (fact,) = [s for s in sentences if _mentions(other, s) and s != link]
    return re.findall(r" (\d+)\.$", fact)


def variable_tracking(question: str, context: str) -> list[str]:
    value = re.search(r"assigned the value (\d+)", question).group(1)
    (first,) = re.findall(rf"VAR ([A-Z]+) = {value}\.", context)
    chain, frontier = [first], [first]
    while frontier:
        var = frontier.pop()
        for copy in re.findall(rf"VAR ([A-Z]+) = VAR {var}\.", context):
            chain.append(copy)
            frontier.append(copy)
    return chain


def multi_span(question: str, context: str) -> list[str]:
    if m := re.fullmatch(r"How many years after (.+) was founded did it go public\?", question):
        company = re.escape(m.group(1))
        (founded,) = re.findall(rf"{company} was founded in (\d+)\.", context)
        (listed,) = re.findall(rf"{company} went public in (\d+)\.", context)
        return [str(int(listed) - int(founded))]
    if m := re.fullmatch(r"Which town has more residents, (\w+) or (\w+)\?", question):
        sizes = {}
        for town in m.groups():
            (sizes[town],) = re.findall(rf"The town of {town} has (\d+) residents\.", context)
        return [max(sizes, key=lambda t: int(sizes[t]))]
    m = re.fullmatch(r"How many baskets of (\w+) did (\w+) sell at the market in total\?", question)
    food, trader = m.groups()
    sales = re.findall(rf"On \w+, {trader} sold (\d+) baskets of {food} at the market\.", context)
    return [str(sum(map(int, sales)))]


def _top(counts: Counter, k: int) -> list[str]:
    ranked = counts.most_common()
    assert ranked[k - 1][1] > ranked[k][1], "the top words are not separated from the rest"
    return [w for w, _ in ranked[:k]]


def aggregation_cwe(question: str, context: str) -> list[str]:
    k = int(re.search(r"What are the (\d+) most common", question).group(1))
    return _top(Counter(re.findall(r"\d+\. (\w+)", context)), k)


def aggregation_fwe(question: str, context: str) -> list[str]:
    k = int(re.search(r"What are the (\d+) most frequently", question).group(1))
    return _top(Counter(w for w in context.split() if w != "...."), k)


def variable_assignment(question: str, context: str) -> list[str]:
    var = question.removesuffix("=?")
    return [re.findall(rf"\b{var}=(\d+);", context)[-1]]


def solve(task: str, question: str, documents: list[str]) -> list[str]:
    context = "\n".join(documents)
    solver = globals()[task] if task in globals() else niah if task.startswith("niah") else None
    return solver(question, context)
