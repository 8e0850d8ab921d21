"""Analysis of finished runs: sweep summaries, reports, the paper's tables."""
