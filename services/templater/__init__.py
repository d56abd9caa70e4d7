"""Templater: maps each ops need to a task made from a template."""
