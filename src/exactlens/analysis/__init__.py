"""Analysis: verification and precision, diffs, convex hulls, pair logic."""
