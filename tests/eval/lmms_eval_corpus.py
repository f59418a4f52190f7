"""Varied model answers for the lmms-eval agreement test: multiple-choice answers (casing, option
text, reasoning before the letter, letters inside words, boxed answers, refusals, empty, several
letters, think blocks) and grounding answers (interval formats, clock times, labels, prose)."""

from __future__ import annotations

LETTERS = "ABCDE"

# {L}: a letter, {l}: it lower-cased, {W}: another letter, {T}: the text of option {L}.
MCQ_TEMPLATES = (
    "{L}",
    "{l}",
    "({L})",
    "({l})",
    "{L}.",
    "[{L}]",
    "**{L}**",
    "'{L}'",
    '"{L}".',
    "{L}{L}",
    "{L}. {T}",
    "{L}: {T}",
    "{L}) {T}",
    "**{L}. {T}**",
    "Option {L}",
    "option {l}",
    "Choice: {L}.",
    "It's {L}!",
    "Answer: {L}",
    "answer: {l}",
    "Answer - ({L})",
    "Answer: {L}) {T}",
    "Answer {L}",
    "BEST ANSWER: {L}",
    "Best answer: {L}",
    "Best option: {L}",
    "The answer is {L}.",
    "the answer is {l}",
    "The answer is ({L}) {T}.",
    "The answer is {T}.",
    "The answer {L}",
    "The best answer is {L}",
    "The correct answer is option {L}.",
    "The correct option is {L}, because {T}.",
    "I choose {L}.",
    "My answer is {L}",
    "Therefore, the final answer is: {L}",
    "\\boxed{{{L}}}",
    "The final answer is $\\boxed{{{L}}}$.",
    "{T}",
    "{T}.",
    "A man walks in and sits down, so the answer is {L}.",
    "In the video, I see a cat. Answer {L}",
    "Looking at the video, the person {T}. So {L}.",
    "Based on the frames, {L} is correct.",
    "{L} is correct, {W} is wrong.",
    "The answer is not {W}, it is {L}.",
    "It is likely {W}, but the answer is {L}",
    "The answer is {L}, not {W}",
    "The answer is {L} rather than option {W}.",
    "I pick {L}. Definitely not {W}",
    "{L}. The {W} option is wrong",
    "Answer: {L}. Option {W} is wrong",
    "Options {W}: no, {L}: yes",
    "The answer is {L}, since {W} loses to {L}",
    "Answer is {L} since OPTION {W} is WRONG",
    "{W} or {L}",
    "{L} or {W}",
    "Either {L} or {W}.",
    "{L}\n\nExplanation: {T} is shown at 0:32.",
    "Explanation first.\nAnswer: {L}",
    "<answer>{L}</answer>",
    "<answer>{L}. {T}</answer>",
    "<think>Option {W} looks plausible but no.</think><answer>{L}</answer>",
    "<think>It is {W}.</think>\n{L}",
    "The video shows {T}.</think>{L}",
    "<analysis>maybe {W}</analysis> {L}",
    "<think>unfinished reasoning about {W}",
    "答案是{L}",
    "选{L}",
    "정답은 {L}",
    "I cannot determine the answer from the video.",
    "Sorry, I can't help with that.",
    "None of the options.",
    "I don't know.",
    "",
    "   ",
    "E",
    "F. none of these",
    "The answer is E.",
    "ABCD",
    "All of A, B, C and D",
    "INSIDE THE CAR",
    "The answer is D.",
    "Answer: D) {T}",
    "A person opens the door.",
    "I think it's {l}.",
)

OPTION_POOL = (
    ("A dog runs across the yard", "Inside the car", "She cooks pasta", "Two", "Nothing happens"),
    ("red", "blue", "green", "yellow", "purple"),
    ("The man leaves", "A woman enters", "Children play", "It rains", "Dogs bark"),
    ("3", "5", "7", "9", "11"),
    ("Before the match", "During the break", "After the goal", "At night", "Never"),
)


def mcq_corpus(num_options: int, repeats: int = 2) -> list[tuple[str, str, tuple[str, ...]]]:
    """(answer, gold letter, option texts) items: every template with `repeats` letter choices,
    gold letters both equal to and different from the letter written."""
    items = []
    for index, template in enumerate(MCQ_TEMPLATES):
        for repeat in range(repeats):
            k = index * repeats + repeat
            options = OPTION_POOL[k % len(OPTION_POOL)][:num_options]
            letter = LETTERS[k % num_options]
            wrong = LETTERS[(k + 1) % num_options]
            gold = letter if repeat == 0 else LETTERS[(k + 2) % num_options]
            text = options[LETTERS.index(letter)]
            answer = template.format(L=letter, l=letter.lower(), W=wrong, T=text)
            items.append((answer, gold, options))
    return items


# {s}, {e}: seconds; {S}, {E}: the same as two-digit clock seconds.
INTERVAL_TEMPLATES = (
    "{s} - {e}",
    "{s}-{e}",
    "{s} - {e} seconds",
    "{s}s - {e}s",
    "{s} s - {e} s",
    "{s}–{e}",
    "{e} - {s}",
    "The event happens in the {s} - {e} seconds.",
    "The event happens in {s} - {e} seconds",
    "[{s}, {e}]",
    "({s}, {e})",
    "[{s}s, {e}s]",
    "between {s} and {e}",
    "{s}~{e}",
    "from {s} to {e} seconds",
    "{s} to {e}",
    "Start time: {s}s\nEnd time: {e}s",
    "Start time: {s} seconds, End time: {e} seconds",
    "start: 0:{S}, end: 0:{E}",
    "The event starts at {s} seconds and ends at {e} seconds.",
    "It starts at {s}! It ends at {e}!",
    "The start is {s}\nThe end is {e}",
    "00:00:{S} - 00:00:{E}",
    "0:{S}-0:{E}",
    "0:{S} to 0:{E}",
    "The person stops at {s}",
    "The tomato falls at {s} - {e}",
    "A specific example is : 20.8 - 30.0 seconds. The event happens in {s} - {e} seconds.",
    "The event happens in 20.8 - 30.0 seconds",
    "<answer>{s} - {e}</answer>",
    "<think>maybe 1 - 2</think>{s}-{e}",
    "<think>start 3</think>The event happens in {s} - {e} seconds.",
    "At {s} seconds",
    "Around {s} seconds, lasting until roughly {e} seconds.",
    "The event occurs twice: {s} - {e} and 40 - 45.",
    "{s} - {e}, 40 - 45",
    "I don't know",
    "The event does not happen in this video.",
    "",
    "Start: {s}\nEnd: {e}",
)

GOLDS = ((2.5, 8.0), (12.0, 14.9), (0.8, 4.7), (15.8, 23.4), (24.3, 30.4))
PREDS = ((3.0, 7.5), (12.0, 14.9), (1.2, 9.0), (15.8, 23.4), (28.1, 33.0))


def interval_corpus() -> list[tuple[str, tuple[float, float]]]:
    """(answer, gold interval) items: every template with every predicted interval."""
    items = []
    for index, template in enumerate(INTERVAL_TEMPLATES):
        for k, (s, e) in enumerate(PREDS):
            gold = GOLDS[(index + k) % len(GOLDS)]
            answer = template.format(s=f"{s:g}", e=f"{e:g}", S=f"{int(s):02d}", E=f"{int(e):02d}")
            items.append((answer, gold))
    return items
