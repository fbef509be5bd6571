"""Visualizations: circuitsvis attention views, figures and the offline HTML report."""
