"""Ahead-of-time compilation for accelerators this host does not have (``launch.compile_check``).

``targets`` names the accelerators, ``chips`` holds their peak, HBM and bandwidth, ``check``
compiles the train step, eval step and search for one, ``analysis`` and ``hlo`` read the
executables, ``report`` prints them.
"""

from allie_jax.compile_check.check import CompileCheckError, compile_check
from allie_jax.compile_check.report import format_report
from allie_jax.compile_check.targets import TARGETS, parse_target

__all__ = ["TARGETS", "CompileCheckError", "compile_check", "format_report", "parse_target"]
