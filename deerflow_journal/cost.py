"""Estimated cost of a run in USD, from its token counts by model and a shipped price table.

Prices come from pydantic's ``genai-prices`` package (extra ``[cost]``), whose table ships
inside the package: nothing is fetched at run time. A model is priced at the run's start time
with its input, output, cache read, cache creation and reasoning tokens, each at its own price
where the table has one. LangChain counts cache tokens inside the input and reasoning tokens
inside the output, as the table does. A model the table does not know, or any model without
the extra installed, has no cost (``None``), never a guess.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from types import ModuleType

__all__ = ["estimate_cost", "model_cost"]

logger = logging.getLogger(__name__)

# Our token buckets -> genai-prices usage fields.
_USAGE_FIELDS = (
    ("input_tokens", "input_tokens"),
    ("output_tokens", "output_tokens"),
    ("cache_read_tokens", "cache_read_tokens"),
    ("cache_creation_tokens", "cache_write_tokens"),
    ("reasoning_tokens", "output_reasoning_tokens"),
)


@functools.cache
def _prices() -> ModuleType | None:
    """``genai_prices``, or ``None`` without the ``[cost]`` extra (imported once, on use)."""
    try:
        import genai_prices
    except ImportError:
        logger.debug("genai-prices is not installed: runs get no cost estimate")
        return None
    return genai_prices


def model_cost(model: str, counts: Mapping[str, int], at: datetime | None = None) -> float | None:
    """The USD cost of ``counts`` (a ``token_usage_by_model`` entry) on ``model`` at ``at``.

    ``None`` when the table does not know the model or genai-prices is not installed. A name
    like ``openai/gpt-4o`` (as routers write them) is looked up as that provider's model.
    """
    cost = _cost(model, counts, at)
    return None if cost is None else float(cost)


def _cost(model: str, counts: Mapping[str, int], at: datetime | None) -> Decimal | None:
    if _prices() is None or not model or model == "unknown":
        return None
    # Priced per hour of the day (price changes are dated, not timed to the second), which
    # lets a timeline of many calls look each one up once.
    at = at or datetime.now(UTC)
    # Built positionally: a third of what ``replace(minute=0, ...)`` costs, once per summary.
    hour = datetime(at.year, at.month, at.day, at.hour, 0, 0, 0, at.tzinfo, fold=at.fold)
    return _priced(model, tuple(sorted(counts.items())), hour)


@functools.lru_cache(maxsize=4096)
def _priced(model: str, counts: tuple[tuple[str, int], ...], at: datetime) -> Decimal | None:
    prices = _prices()
    if prices is None:
        return None
    have = dict(counts)
    usage = prices.Usage(**{theirs: have[ours] for ours, theirs in _USAGE_FIELDS if ours in have})
    refs: list[tuple[str, str | None]] = [(model, None)]
    provider, slash, name = model.partition("/")
    if slash and provider and name:
        refs.append((name, provider))
    for ref, provider_id in refs:
        try:
            found = prices.calc_price(
                usage, ref, provider_id=provider_id, genai_request_timestamp=at
            )
        except LookupError:
            continue
        except Exception:  # a table that cannot price these counts must not fail the summary
            logger.warning("genai-prices could not price %r", model, exc_info=True)
            return None
        return Decimal(found.total_price)
    return None


def estimate_cost(
    usage_by_model: Mapping[str, Mapping[str, int]], at: datetime | None = None
) -> tuple[float | None, dict[str, float | None]]:
    """The run's total cost and its cost by model, from ``token_usage_by_model``.

    The total is ``None`` unless every model that used tokens is priced (a total without
    one of them would understate the run); no usage at all has no estimate either. Without
    genai-prices installed nothing is estimated: ``(None, {})``.
    """
    if _prices() is None:
        return None, {}
    costs = {
        model: _cost(model, counts, at)
        for model, counts in usage_by_model.items()
        if counts.get("total_tokens")
    }
    by_model = {model: None if cost is None else float(cost) for model, cost in costs.items()}
    known = [cost for cost in costs.values() if cost is not None]
    if not known or len(known) < len(costs):
        return None, by_model
    return float(sum(known)), by_model
