"""The search suite (REFERENCE.md §3): NQ, HotpotQA, ... graded by exact match; the search_route
(verifier -> searcher | answerer) and search_single workflows over a retriever."""
