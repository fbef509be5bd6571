"""Small offline data sets (nothing is downloaded)."""
