# trace_steps.py FILE [NAME] — exit 0 when FILE is complete JSON (a loom timeline) holding
# complete events of steps 0, 1 and 2 (and, with NAME, an event of that name); 1 otherwise.
# Used by the tests that abort a job and expect its traces to survive.
import json
import sys

try:
    with open(sys.argv[1]) as fh:
        events = [e for e in json.load(fh)["traceEvents"] if e.get("ph") == "X"]
except (OSError, ValueError, KeyError, TypeError) as err:
    print(f"{sys.argv[1]}: {err}")
    sys.exit(1)
steps = {e.get("args", {}).get("step") for e in events}
names = {e.get("name") for e in events}
sys.exit(0 if {0, 1, 2} <= steps and (len(sys.argv) < 3 or sys.argv[2] in names) else 1)
