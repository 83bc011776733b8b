"""The suite collects every module for doctests: skip the adapters whose framework is not installed."""

import importlib.util
import os

os.environ.setdefault("HAYSTACK_TELEMETRY_ENABLED", "False")  # read when haystack is imported: no posthog calls

FRAMEWORKS = {"langchain": "langchain_core", "llamaindex": "llama_index", "haystack": "haystack"}  # module: what it imports
collect_ignore = [f"{module}.py" for module, framework in FRAMEWORKS.items() if importlib.util.find_spec(framework) is None]
