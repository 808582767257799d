"""Fair share inside each lane of a queue (G10): tenants with jobs waiting are served in turn, in proportion to their
weights, counted in work.

**Fair admission.** A lane's stream holds only what the workers are about to read; the rest of the lane's jobs wait
for admission in ``inferq:{Q}:fair:<lane>:jobs`` (one sorted set per lane, a member ``<tenant>|<attempt>|<job id>``
per job, scored by minus its virtual start tag). Admission moves them into the stream in start-time fair queuing
order (Goyal, Vin and Cheng's SFQ; the virtual-time scheme of weighted fair queuing): each job waiting has a virtual
start tag, set when it is placed; the lowest is admitted next and the lane's virtual time becomes that tag. A job
placed starts at the lane's virtual time or its tenant's last finish tag, whichever is later, and moves the tenant's
finish tag on by its cost, its work over the tenant's weight. So over any stretch in which two tenants both have
jobs waiting, the work each is admitted, divided by its weight, differs by at most one job's cost of each; and a
tenant whose first job arrives behind another's backlog starts at the virtual time, so it is admitted next or after
about one job of each other tenant with jobs waiting, never after the backlog. A tenant that runs out of waiting
jobs keeps its last finish tag (``fair:<lane>:tags``), and comes back at that tag or the virtual time, whichever is
later: sending one job at a time, or few big ones, gains nothing.

Who admits: a worker, for its free slots and its read plan (:mod:`inferq.queue.lanes`), in the same round trip as
its read (``admit.lua``); the maintenance sweeps (the workers' and the scaler's), one entry per lane, so no job waits
behind an empty stream. Where a job goes when it is queued (enqueue, a retry, a promoted retry, a release, a
give-back, a redrive, all through ``includes/fairPlace.lua``): straight into the stream when no job of the lane waits
and the stream holds fewer than :data:`FAIR_BUFFER` entries no worker has read, so an idle or keeping-up queue pays
nothing more than before and a worker blocked on the stream wakes at once; else into the waiting set (a job given
back that had its turn goes to the head of its tenant's). Reclaim is unchanged: a reclaimed entry is already in the
stream. Every transition stays one script with all its keys declared (the admitted entries are recorded per lane in
``fair:<lane>:admitted``, where ``start.lua`` finds them: admission cannot know a job record's key in advance).

``INFERQ_FAIR_SHARE=false`` puts every job straight into its lane's stream: first come, first served inside a lane,
as before fair share (the bench compares the two).
"""

from __future__ import annotations

from typing import Any

from inferq.queue.jobs import expected_tokens

FAIR_BUFFER = 1
"""The undelivered entries a lane's stream may hold before the lane's jobs wait for admission, and what the
maintenance sweeps keep there while jobs wait: one, so a job of another tenant is admitted after at most one entry
already in the stream (docs/benchmarks.md has what a larger one would save)."""

BYTES_PER_TOKEN = 4
"""The prompt's estimated tokens: its text's UTF-8 bytes over this (the usual rule of thumb for English text with
the common tokenizers; the estimate only weighs one job against another, so its error cancels out)."""


def _text_bytes(text: str) -> int:
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def _content_bytes(content: Any) -> int:
    if isinstance(content, str):
        return _text_bytes(content)
    if isinstance(content, list):  # content parts: the text ones count
        return sum(_text_bytes(part["text"]) for part in content
                   if isinstance(part, dict) and isinstance(part.get("text"), str))
    return 0


def prompt_tokens(body: dict[str, Any]) -> int:
    """The prompt's estimated tokens: the text of the messages (chat) or the prompt (completions), UTF-8 bytes over
    :data:`BYTES_PER_TOKEN`; a prompt of token ids counts them."""
    messages = body.get("messages")
    if isinstance(messages, list):
        size = sum(_content_bytes(m.get("content")) for m in messages if isinstance(m, dict))
        return -(-size // BYTES_PER_TOKEN)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return -(-_text_bytes(prompt) // BYTES_PER_TOKEN)
    if isinstance(prompt, list):
        if all(isinstance(p, int) for p in prompt):
            return len(prompt)
        return -(-sum(_text_bytes(p) for p in prompt if isinstance(p, str)) // BYTES_PER_TOKEN)
    return 0


def estimated_work(body: dict[str, Any]) -> int:
    """A job's work in fair share (the record's field ``work``): its prompt's estimated tokens plus the most tokens
    it may produce (``max_tokens`` or ``max_completion_tokens``; 256 when it names neither)."""
    return prompt_tokens(body) + expected_tokens(body)


def cost(work: int, weight: float) -> str:
    """A job's cost in its lane's virtual time: its work over its tenant's weight, as the scripts write it."""
    return format(work / weight, ".17g") if weight != 1 else str(work)
