"""Seeded chaos schedules over the real stack: plan, fault proxy, injector, runner, batch job.

The command that runs many schedules and writes their JSON is ``python -m benchmarks.chaos``
(``make chaos``); the tests run one schedule, or the proxy alone, from here.
"""
