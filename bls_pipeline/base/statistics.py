"""Triton's statistics, read one way: /v2/models/stats over HTTP, or a tritonclient's
get_inference_statistics as JSON. Each model version has its inference_stats, a section per
stage (success, fail, queue, compute_input, ...), each a count and the nanoseconds spent."""

from __future__ import annotations

__all__ = ["COMPUTE", "stat", "summed"]

# The sections that add up to a model's own work on a request (beside its queue).
COMPUTE = ("compute_input", "compute_infer", "compute_output")


def stat(inference_stats: dict, section: str, field: str = "count") -> int:
    """One figure of one version's inference_stats: its `section`'s count (or "ns"); 0 where
    the server gives none."""
    return int((inference_stats.get(section) or {}).get(field, 0))


def summed(stats: dict, section: str, field: str = "count") -> dict[str, int]:
    """{model: stat(section, field) over its versions, added up} from every model's statistics."""
    totals: dict[str, int] = {}
    for entry in stats.get("model_stats", ()):
        totals[entry["name"]] = totals.get(entry["name"], 0) + stat(entry.get("inference_stats") or {}, section, field)
    return totals
