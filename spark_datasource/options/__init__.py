"""Typed, frozen options declared once: the spec machinery, the writer's options and rules,
the HTTPS options, and the options page they generate.
"""
