"""Analyzer: compares data against ranges at GPU, node and cluster level and raises ops needs."""
